"""Typed asyncio client of the environment service, for our rollout workers and for external agents.

``EnvironmentClient`` mirrors the RPCs with plain Python types; ``SeatSession`` is one seat of one
episode (episode id + secret token) with ``play(decide)``, the loop an agent needs: wait for its turn,
ask ``decide(observation)`` for text or an ``Action``, send it, repeat until the game ends. Re-prompts
after invalid output arrive as a new observation with ``feedback`` set.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import grpc

from wolfpack import rpc
from wolfpack.settings import Settings, load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack.v1 import environment_service_pb2_grpc as pb_grpc

Decision = str | common_pb2.Action
Decider = Callable[[pb.Observation], Awaitable[Decision] | Decision]


@dataclass(frozen=True)
class CreatedEpisode:
    episode_id: str
    admin_token: str
    seat_tokens: dict[int, str]
    num_seats: int


class EnvironmentClient:
    """Connects to ``target`` (host:port); use ``async with EnvironmentClient(...) as env``."""

    def __init__(self, target: str, settings: Settings | None = None) -> None:
        self.settings = settings or load_settings()
        self.channel = rpc.channel(target, self.settings)
        self.stub = pb_grpc.EnvironmentServiceStub(self.channel)

    async def __aenter__(self) -> EnvironmentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def list_games(self) -> list[pb.GameInfo]:
        return list((await self.stub.ListGames(pb.ListGamesRequest())).games)

    async def create_episode(
        self,
        game_id: str,
        variant: str = "",
        seed: int = 0,
        *,
        external_seats: tuple[int, ...] = (),
        policy_seats: Mapping[int, str] | None = None,
        bots: Mapping[int, str] | None = None,
        default_bot: str = "",
        language: str = "en",
        turn_timeout_s: float = 0.0,
        options: Mapping[str, str] | None = None,
        request_id: str = "",
    ) -> CreatedEpisode:
        req = pb.CreateEpisodeRequest(
            game=common_pb2.GameRef(game_id=game_id, variant=variant),
            seed=seed,
            default_bot=default_bot,
            language=language,
            turn_timeout_s=turn_timeout_s,
            options=dict(options or {}),
            request_id=request_id,
        )
        for seat in external_seats:
            req.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_EXTERNAL)
        for seat, policy_id in (policy_seats or {}).items():
            b = req.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_POLICY)
            b.policy.policy_id = policy_id
        for seat, bot in (bots or {}).items():
            req.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_SCRIPTED, bot=bot)
        resp = await self.stub.CreateEpisode(req)
        return CreatedEpisode(
            resp.episode_id, resp.admin_token, {t.seat: t.token for t in resp.seat_tokens}, resp.num_seats
        )

    def seat(self, episode_id: str, token: str) -> SeatSession:
        return SeatSession(self, episode_id, token)

    async def play_seats(
        self,
        seats: Sequence[tuple[str, int, str]],
        decide: Callable[[pb.Observation], Decision],
        include_text: bool = True,
    ) -> dict[tuple[str, int], pb.Observation]:
        """Play many seats ``(episode_id, seat, token)`` of many episodes over one ``PlaySeats`` stream
        until every one of them is done; returns each seat's final observation. Decisions arrive in
        batches and all answers to a batch go back in one message, which is what makes this path fast.
        Request errors for an act (e.g. a stale turn) are not fatal: the server sends the seat's next
        decision when there is one."""
        tokens = {(e, s): t for e, s, t in seats}
        call = self.stub.PlaySeats()
        refs = [pb.SeatRef(episode_id=e, token=t) for e, _s, t in seats]
        await call.write(pb.PlaySeatsRequest(join=refs, include_text=include_text))
        final: dict[tuple[str, int], pb.Observation] = {}
        while len(final) < len(tokens):
            message = await call.read()
            if message is grpc.aio.EOF:
                break
            assert isinstance(message, pb.PlaySeatsResponse)
            resp = message
            acts = []
            for obs in resp.decisions:
                key = (obs.episode_id, obs.seat)
                if obs.done:
                    final[key] = obs
                elif obs.your_turn and obs.turn_id:
                    decision = decide(obs)
                    act = pb.SeatAct(episode_id=obs.episode_id, token=tokens[key], turn_id=obs.turn_id)
                    if isinstance(decision, str):
                        act.raw_text = decision
                    else:
                        act.action.CopyFrom(decision)
                    acts.append(act)
            for result in resp.results:
                if result.code == "PERMISSION_DENIED" or result.code == "NOT_FOUND":
                    raise LookupError(f"{result.episode_id}: {result.reason}")
            if acts:
                await call.write(pb.PlaySeatsRequest(acts=acts))
        await call.done_writing()
        return final

    async def get_episode(self, episode_id: str, token: str) -> pb.GetEpisodeResponse:
        return await self.stub.GetEpisode(pb.GetEpisodeRequest(episode_id=episode_id, token=token))

    async def close_episode(self, episode_id: str, admin_token: str) -> bool:
        resp = await self.stub.CloseEpisode(pb.CloseEpisodeRequest(episode_id=episode_id, token=admin_token))
        return resp.closed


class SeatSession:
    """One seat of one episode."""

    def __init__(self, client: EnvironmentClient, episode_id: str, token: str) -> None:
        self.client = client
        self.episode_id = episode_id
        self.token = token

    async def observation(self) -> pb.Observation:
        req = pb.GetObservationRequest(episode_id=self.episode_id, token=self.token)
        return (await self.client.stub.GetObservation(req)).observation

    async def observe(self) -> AsyncIterator[pb.Observation]:
        """Observations pushed by the server until the episode ends (no deadline: it lasts a game)."""
        call = self.client.stub.Observe(pb.ObserveRequest(episode_id=self.episode_id, token=self.token))
        async for resp in call:
            yield resp.observation

    async def act(self, turn_id: int, decision: Decision) -> pb.ActResponse:
        req = pb.ActRequest(episode_id=self.episode_id, token=self.token, turn_id=turn_id)
        if isinstance(decision, str):
            req.raw_text = decision
        else:
            req.action.CopyFrom(decision)
        return await self.client.stub.Act(req)

    async def play(self, decide: Decider) -> pb.Observation:
        """Play this seat to the end of the episode; returns the final observation."""
        last: pb.Observation | None = None
        async for obs in self.observe():
            last = obs
            while obs.your_turn and not obs.done:
                decision = decide(obs)
                if isinstance(decision, Awaitable):
                    decision = await decision
                try:
                    resp = await self.act(obs.turn_id, decision)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                        break  # the turn moved on (timeout default); wait for the next observation
                    raise
                obs = resp.observation
                last = obs
                if resp.accepted or resp.defaulted:
                    break
        assert last is not None
        return last if last.done else await self.observation()
