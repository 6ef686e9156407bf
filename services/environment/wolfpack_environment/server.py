"""gRPC adapter of the environment service: registration and one thin adapter per RPC. Rules live in the
games (``wolfpack_games``), sessions in ``sessions.py``, proto conversion in ``convert.py``, the PlaySeats
state machine in ``play_stream.py``; a ``SessionError`` becomes its status in ``rpc.ErrorInterceptor``.
Start it with ``wolfpack serve environment``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from wolfpack import auth, rpc
from wolfpack.settings import Settings
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack.v1 import environment_service_pb2_grpc as pb_grpc
from wolfpack_environment.convert import (
    EpisodeFactory,
    Observations,
    action_from_pb,
    action_to_pb,
    created_pb,
    episode_state_pb,
    parsed_options,
)
from wolfpack_environment.play_stream import PlayStream
from wolfpack_environment.sessions import (
    Episode,
    EpisodeManager,
    PermissionDeniedError,
    SessionError,
    UnauthenticatedError,
)
from wolfpack_games import list_games

SERVICE = "environment"
STATUS_FILTERS = {pb.EPISODE_STATUS_UNSPECIFIED: "", pb.EPISODE_STATUS_RUNNING: "running",
                  pb.EPISODE_STATUS_FINISHED: "finished"}  # fmt: skip


def summary_pb(ep: Episode) -> pb.EpisodeSummary:
    """A list entry: public facts only (phase and round are on every seat's view)."""
    obs = ep.env.observe(0)
    out = pb.EpisodeSummary(
        episode_id=ep.episode_id, seed=ep.seed, phase=obs.phase, round=obs.round,
        status=pb.EPISODE_STATUS_FINISHED if ep.done else pb.EPISODE_STATUS_RUNNING,
        num_seats=len(ep.seats), num_played_seats=len(ep.tokens), winner=ep.env.winner() if ep.env.done else "",
    )  # fmt: skip
    out.game.game_id, out.game.variant = ep.game_id, ep.variant
    out.created_at.FromNanoseconds(ep.created_ns)
    return out


class EnvironmentServicer(pb_grpc.EnvironmentServiceServicer):
    credential: auth.Credential | None = None  # the service credential (``main`` sets it from settings)

    def __init__(self, manager: EpisodeManager | None = None, scenario_store: str | None = None) -> None:
        self.manager = manager or EpisodeManager()
        self.create = EpisodeFactory(self.manager, scenario_store)
        self.observations = Observations()

    async def ListGames(self, request: pb.ListGamesRequest, context: Any) -> pb.ListGamesResponse:
        resp = pb.ListGamesResponse()
        for spec in list_games():
            info = resp.games.add(game_id=spec.game_id, description=spec.description, bots=sorted(spec.bots))
            for name, seats in spec.variants.items():
                info.variants.add(
                    name=name, num_seats=seats, description=spec.variant_descriptions.get(name, "")
                )
        return resp

    async def CreateEpisode(self, request: pb.CreateEpisodeRequest, context: Any) -> pb.CreateEpisodeResponse:
        return created_pb(self.create(request, await parsed_options(request)))

    async def Observe(self, request: pb.ObserveRequest, context: Any) -> AsyncIterator[pb.ObserveResponse]:
        ep = self.manager.get(request.episode_id)
        seat = self.manager.seat_of(ep, request.token)
        async for obs in self.manager.watch(ep, seat):
            yield pb.ObserveResponse(observation=self.observations.observation(ep, seat, obs))

    async def GetObservation(
        self, request: pb.GetObservationRequest, context: Any
    ) -> pb.GetObservationResponse:
        ep = self.manager.get(request.episode_id)
        seat = self.manager.seat_of(ep, request.token)
        return pb.GetObservationResponse(observation=self.observations.observation(ep, seat))

    async def Act(self, request: pb.ActRequest, context: Any) -> pb.ActResponse:
        ep = self.manager.get(request.episode_id)
        action = action_from_pb(request.action) if request.action.kind else None
        result = self.manager.act(ep, request.token, request.turn_id, action, request.raw_text)
        seat = self.manager.seat_of(ep, request.token)
        return pb.ActResponse(
            accepted=result.accepted, reason=result.reason, action=action_to_pb(result.action),
            defaulted=result.defaulted, duplicate=result.duplicate,
            observation=self.observations.observation(ep, seat),
        )  # fmt: skip

    async def GetEpisode(self, request: pb.GetEpisodeRequest, context: Any) -> pb.GetEpisodeResponse:
        ep = self.manager.get(request.episode_id)
        if self.manager.is_admin(ep, request.token):  # the full view: of a running episode, privileged
            self.manager.check_full_view(ep, auth.authorized(self.credential, context))
            return episode_state_pb(ep, None)
        return episode_state_pb(ep, self.manager.seat_of(ep, request.token))

    async def CloseEpisode(self, request: pb.CloseEpisodeRequest, context: Any) -> pb.CloseEpisodeResponse:
        privileged = auth.authorized(self.credential, context)
        return pb.CloseEpisodeResponse(
            closed=self.manager.close(request.episode_id, request.token, privileged)
        )

    def _check_credential(self, context: Any) -> None:
        """ListEpisodes and SpectateEpisode take no token: the credential alone opens them. ``rpc``'s
        ``CredentialInterceptor`` refuses them before this when the server started with a secret; this
        covers a servicer given its credential later (embedders, tests)."""
        refusal = self.credential.check(context.invocation_metadata()) if self.credential else None
        if refusal is not None:
            code, message = refusal
            raise (
                UnauthenticatedError if code == grpc.StatusCode.UNAUTHENTICATED else PermissionDeniedError
            )(message)

    async def ListEpisodes(self, request: pb.ListEpisodesRequest, context: Any) -> pb.ListEpisodesResponse:
        self._check_credential(context)
        status = STATUS_FILTERS.get(request.status)
        if status is None:
            raise SessionError(f"unknown status {request.status}")
        page, next_token = self.manager.page(request.page_size, request.page_token, status)
        return pb.ListEpisodesResponse(episodes=[summary_pb(ep) for ep in page], next_page_token=next_token)

    async def SpectateEpisode(
        self, request: pb.SpectateEpisodeRequest, context: Any
    ) -> pb.SpectateEpisodeResponse:
        self._check_credential(context)
        return pb.SpectateEpisodeResponse(
            episode=episode_state_pb(self.manager.get(request.episode_id), None)
        )

    async def PlaySeats(
        self, request_iterator: AsyncIterator[pb.PlaySeatsRequest], context: Any
    ) -> AsyncIterator[pb.PlaySeatsResponse]:
        async for response in PlayStream(self.manager, self.create, self.observations).play(request_iterator):
            yield response


def register(server: grpc.aio.Server, servicer: EnvironmentServicer | None = None) -> Sequence[str]:
    """Add this service's servicers to ``server`` and return their full names."""
    pb_grpc.add_EnvironmentServiceServicer_to_server(servicer or EnvironmentServicer(), server)
    return [pb.DESCRIPTOR.services_by_name["EnvironmentService"].full_name]


async def main(settings: Settings, address: str | None = None) -> None:
    servicer = EnvironmentServicer(scenario_store=settings.scenario_store_url())
    servicer.credential = auth.from_settings(settings)

    async def on_stop() -> None:
        servicer.manager.close_all()

    await rpc.serve(SERVICE, lambda server: register(server, servicer), settings, address, on_stop=on_stop)
