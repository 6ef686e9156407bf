"""gRPC adapter of the environment service: proto <-> ``EpisodeManager`` (all rules live in the games,
all session logic in ``sessions.py``). Start it with ``wolfpack serve environment``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc
from opentelemetry import context as otel_context

from wolfpack import auth, rpc, telemetry
from wolfpack.errors import make_status
from wolfpack.settings import Settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack.v1 import environment_service_pb2_grpc as pb_grpc
from wolfpack_environment.sessions import (
    Episode,
    EpisodeManager,
    NotFoundError,
    SeatPlan,
    SessionError,
    parse_options,
)
from wolfpack_games import Action, Event, LegalAction, Observation, list_games

SERVICE = "environment"
_CONTROLLERS = {
    common_pb2.SEAT_CONTROLLER_POLICY: "policy",
    common_pb2.SEAT_CONTROLLER_EXTERNAL: "external",
    common_pb2.SEAT_CONTROLLER_SCRIPTED: "scripted",
}
_CONTROLLER_PB = {v: k for k, v in _CONTROLLERS.items()}
_OUTCOME_PB = {
    1: common_pb2.OUTCOME_KIND_WIN,
    -1: common_pb2.OUTCOME_KIND_LOSS,
    0: common_pb2.OUTCOME_KIND_DRAW,
}


def _status(exc: SessionError) -> Any:
    """``exc`` as the ``google.rpc.Status`` of one batched item."""
    return make_status(grpc.StatusCode[exc.code], str(exc))


def _fingerprint(request: pb.CreateEpisodeRequest) -> bytes:
    """What makes two create requests with one request_id the same request: everything but the trace
    context (a retry may be sent from a new span)."""
    if not request.HasField("trace"):
        return request.SerializeToString(deterministic=True)
    copy = pb.CreateEpisodeRequest()
    copy.CopyFrom(request)
    copy.ClearField("trace")
    return copy.SerializeToString(deterministic=True)


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: SessionError) -> NoReturn:
    await context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
    raise AssertionError("unreachable")


def action_to_pb(action: Action | None) -> common_pb2.Action:
    if action is None:
        return common_pb2.Action()
    msg = common_pb2.Action(kind=action.kind, text=action.text)
    if action.target is not None:
        msg.target = action.target
    return msg


def action_from_pb(msg: common_pb2.Action) -> Action:
    return Action(msg.kind, msg.target if msg.HasField("target") else None, msg.text)


def event_to_pb(e: Event) -> pb.GameEvent:
    return pb.GameEvent(
        index=e.index, kind=e.kind, channel=e.channel, actor=e.actor, target=e.target, text=e.text,
        phase=e.phase, round=e.round,
    )  # fmt: skip


class EnvironmentServicer(pb_grpc.EnvironmentServiceServicer):
    credential: auth.Credential | None = None  # the service credential (``main`` sets it from settings)

    def __init__(self, manager: EpisodeManager | None = None, scenario_store: str | None = None) -> None:
        self.manager = manager or EpisodeManager()
        self.scenario_store_url = scenario_store
        self._store: Any = None
        self._legal_by_id: dict[int, tuple[tuple[LegalAction, ...], bytes]] = {}
        self._legal_by_value: dict[tuple[LegalAction, ...], bytes] = {}

    def _scenario(self, scenario_id: str, game_id: str) -> Any:
        """Look a scenario up in the store (opened on first use) and check it belongs to ``game_id``."""
        if self.scenario_store_url is None:
            raise SessionError("scenario_id needs a scenario store (WOLFPACK_SCENARIO_STORE)")
        from wolfpack_games.scenarios import open_store

        if self._store is None:
            self._store = open_store(self.scenario_store_url)
        scenario = self._store.get(scenario_id)
        if scenario is None:
            raise NotFoundError(f"no scenario {scenario_id!r} in {self.scenario_store_url}")
        if f"{scenario.family}_v1" != game_id:
            raise SessionError(f"scenario {scenario_id} is a {scenario.family} scenario, not {game_id}")
        return scenario

    def _observation(
        self,
        ep: Episode,
        seat: int,
        obs: Observation | None = None,
        include_text: bool = True,
        into: Any = None,
    ) -> pb.Observation:
        """The seat's observation as a proto, appended to ``into`` (a repeated Observation field) when
        given, which saves copying it into the response afterwards."""
        o = obs or ep.env.observe(seat)
        env_done = ep.env.done
        done = env_done or ep.closed
        msg: pb.Observation = pb.Observation() if into is None else into.add()
        if not done and o.legal_actions:
            msg.MergeFromString(self._legal_bytes(o.legal_actions))
        msg.episode_id = ep.episode_id
        msg.seat = seat
        msg.phase = o.phase
        msg.round = o.round
        msg.role = o.role
        if done:
            msg.done = True
            msg.outcome = _OUTCOME_PB[ep.env.outcome()[seat]] if env_done else common_pb2.OUTCOME_KIND_ABORTED
        else:
            msg.turn_id = ep.open_turns.get(seat, 0)
            msg.your_turn = o.your_turn
        if o.feedback:
            msg.feedback = o.feedback
        if include_text:  # rendering is the expensive part; PlaySeats clients may skip it
            msg.text = o.text
            msg.messages.add(role="user", content=o.text)
        return msg

    def _legal_bytes(self, legal: tuple[LegalAction, ...]) -> bytes:
        """``legal`` encoded as Observation.legal_actions entries. Parsing cached bytes into the message
        costs a third of building the entries field by field, and the same templates recur endlessly
        (every speech turn, every "vote for one of these seats"), so encodings are cached by value, with
        the tuple's identity as a cheaper first key: engines reuse tuples within a phase. The identity
        cache holds the tuple, so its id cannot be reused while cached."""
        hit = self._legal_by_id.get(id(legal))
        if hit is not None and hit[0] is legal:
            return hit[1]
        encoded = self._legal_by_value.get(legal)
        if encoded is None:
            if len(self._legal_by_value) >= 8192:
                self._legal_by_value.clear()
            encoded = self._legal_by_value[legal] = pb.Observation(
                legal_actions=[
                    pb.LegalAction(kind=la.kind, targets=la.targets, needs_text=la.needs_text) for la in legal
                ]
            ).SerializeToString()
        if len(self._legal_by_id) >= 4096:
            self._legal_by_id.clear()
        self._legal_by_id[id(legal)] = (legal, encoded)
        return encoded

    async def ListGames(self, request: pb.ListGamesRequest, context: Any) -> pb.ListGamesResponse:
        resp = pb.ListGamesResponse()
        for spec in list_games():
            info = resp.games.add(game_id=spec.game_id, description=spec.description, bots=sorted(spec.bots))
            for name, seats in spec.variants.items():
                info.variants.add(
                    name=name, num_seats=seats, description=spec.variant_descriptions.get(name, "")
                )
        return resp

    def _create(self, request: pb.CreateEpisodeRequest) -> Episode:
        """Validate a create request and start the episode (raises ``SessionError`` on bad input)."""
        if not request.game.game_id:
            raise SessionError("game.game_id is required")
        seats: dict[int, SeatPlan] = {}
        for b in request.seats:
            if b.seat in seats:
                raise SessionError(f"seat {b.seat} is bound twice")
            controller = _CONTROLLERS.get(b.controller)
            if controller is None:
                raise SessionError(f"seat {b.seat}: controller must be POLICY, EXTERNAL or SCRIPTED")
            seats[b.seat] = SeatPlan(
                controller, bot=b.bot, policy_id=b.policy.policy_id, display_name=b.display_name
            )
        # Option values are YAML scalars/collections sent as strings ("true", "[1, 2]", "revote").
        options: dict[str, Any] = parse_options(request.options)
        if request.scenario_id:
            options["scenario"] = self._scenario(request.scenario_id, request.game.game_id)
        # The episode span starts under the current context: the item's own trace context when the
        # caller sent one (PlaySeats creates many episodes over one call), else the call's.
        token = (
            otel_context.attach(telemetry.extract_from(request.trace)) if request.trace.traceparent else None
        )
        try:
            return self.manager.create(
                request.game.game_id,
                request.game.variant,
                request.seed,
                seats,
                default_bot=request.default_bot,
                language=request.language or "en",
                turn_timeout_s=request.turn_timeout_s,
                options=options,
                request_id=request.request_id,
                fingerprint=_fingerprint(request) if request.request_id else b"",
            )
        finally:
            if token is not None:
                otel_context.detach(token)

    @staticmethod
    def _created(ep: Episode) -> pb.CreateEpisodeResponse:
        resp = pb.CreateEpisodeResponse(
            episode_id=ep.episode_id, admin_token=ep.admin_token, num_seats=len(ep.env.possible_agents)
        )
        for token, seat in sorted(ep.tokens.items(), key=lambda kv: kv[1]):
            resp.seat_tokens.add(seat=seat, token=token)
        return resp

    async def CreateEpisode(self, request: pb.CreateEpisodeRequest, context: Any) -> pb.CreateEpisodeResponse:
        try:
            ep = self._create(request)
        except SessionError as exc:
            await _abort(context, exc)
        return self._created(ep)

    def _seat(self, episode_id: str, token: str) -> tuple[Episode, int]:
        ep = self.manager.get(episode_id)
        return ep, self.manager.seat_of(ep, token)

    async def Observe(self, request: pb.ObserveRequest, context: Any) -> AsyncIterator[pb.ObserveResponse]:
        try:
            ep, seat = self._seat(request.episode_id, request.token)
        except SessionError as exc:
            await _abort(context, exc)
        async for obs in self.manager.watch(ep, seat):
            yield pb.ObserveResponse(observation=self._observation(ep, seat, obs))

    async def GetObservation(
        self, request: pb.GetObservationRequest, context: Any
    ) -> pb.GetObservationResponse:
        try:
            ep, seat = self._seat(request.episode_id, request.token)
        except SessionError as exc:
            await _abort(context, exc)
        return pb.GetObservationResponse(observation=self._observation(ep, seat))

    async def Act(self, request: pb.ActRequest, context: Any) -> pb.ActResponse:
        try:
            ep = self.manager.get(request.episode_id)
            action = action_from_pb(request.action) if request.action.kind else None
            result = self.manager.act(ep, request.token, request.turn_id, action, request.raw_text)
            seat = self.manager.seat_of(ep, request.token)
        except SessionError as exc:
            await _abort(context, exc)
        return pb.ActResponse(
            accepted=result.accepted,
            reason=result.reason,
            action=action_to_pb(result.action),
            defaulted=result.defaulted,
            duplicate=result.duplicate,
            observation=self._observation(ep, seat),
        )

    async def GetEpisode(self, request: pb.GetEpisodeRequest, context: Any) -> pb.GetEpisodeResponse:
        try:
            ep = self.manager.get(request.episode_id)
            admin = self.manager.is_admin(ep, request.token)
            if admin:  # spectating a running episode is privileged
                self.manager.check_full_view(ep, auth.authorized(self.credential, context))
            seat = -1 if admin else self.manager.seat_of(ep, request.token)
        except SessionError as exc:
            await _abort(context, exc)
        env = ep.env
        full = admin or ep.done
        obs = None if full else env.observe(seat)
        resp = pb.GetEpisodeResponse(
            episode_id=ep.episode_id,
            seed=ep.seed,
            phase=obs.phase if obs else env.observe(0).phase,
            round=obs.round if obs else env.observe(0).round,
            done=ep.done,
            winner=env.winner() if env.done else "",
        )
        resp.game.game_id, resp.game.variant = ep.game_id, ep.variant
        outcome = env.outcome() if env.done else {}
        alive = getattr(env, "alive", None)
        for s in env.possible_agents:
            state = resp.seats.add(seat=s, controller=_CONTROLLER_PB[ep.seats[s].controller])
            state.alive = bool(alive[s]) if alive is not None else not env.done
            if full or s == seat:
                state.role = env.role(s)
            if s in outcome:
                state.outcome = _OUTCOME_PB[outcome[s]]
        if full:
            resp.events.extend(event_to_pb(e) for e in env.events)
        return resp

    async def CloseEpisode(self, request: pb.CloseEpisodeRequest, context: Any) -> pb.CloseEpisodeResponse:
        try:
            closed = self.manager.close(
                request.episode_id, request.token, auth.authorized(self.credential, context)
            )
        except SessionError as exc:
            await _abort(context, exc)
        return pb.CloseEpisodeResponse(closed=closed)

    async def PlaySeats(
        self, request_iterator: AsyncIterator[pb.PlaySeatsRequest], context: Any
    ) -> AsyncIterator[pb.PlaySeatsResponse]:
        """Batched play: requests and episode changes go through one queue; each wake-up applies every
        queued request, then sends every joined seat's new decisions in one message."""
        stream = _PlayStream(self)

        async def pump() -> None:
            try:
                async for req in request_iterator:
                    stream.queue.put_nowait(req)
            finally:
                stream.queue.put_nowait(None)

        reader = asyncio.create_task(pump())
        client_done = False
        try:
            while not client_done:
                batch = [await stream.queue.get()]
                while not stream.queue.empty():
                    batch.append(stream.queue.get_nowait())
                results: list[pb.SeatActResult] = []
                created: list[pb.CreatedEpisode] = []
                for item in batch:
                    if item is None:
                        client_done = True
                    elif isinstance(item, pb.PlaySeatsRequest):
                        stream.handle(item, results, created)
                response = pb.PlaySeatsResponse(results=results, created=created)
                stream.decisions(response.decisions)
                if results or created or response.decisions:
                    yield response
        finally:
            reader.cancel()
            stream.detach()


@dataclass(slots=True)
class _Joined:
    """An episode as one PlaySeats stream sees it: the seats it plays and the turn id last sent to each."""

    ep: Episode
    seats: set[int] = field(default_factory=set)
    sent: dict[int, int] = field(default_factory=dict)


class _PlayStream:
    """State of one PlaySeats call: the seats it plays, what it last sent each of them, and the episodes
    it created. Episodes whose end was sent are forgotten at once, so a stream that plays episode after
    episode for hours holds only the live ones."""

    def __init__(self, servicer: EnvironmentServicer) -> None:
        self.servicer = servicer
        self.manager = servicer.manager
        self.queue: asyncio.Queue[pb.PlaySeatsRequest | str | None] = asyncio.Queue()
        self.joined: dict[str, _Joined] = {}
        self.dirty: set[str] = set()  # episodes changed since the last wake-up: only they are looked at
        self.owned: set[str] = set()  # created by this stream: released when close_finished is set
        self.include_text = False
        self.close_finished = False
        self.rejected_results_only = False

    def on_change(self, ep: Episode) -> None:
        if not self.dirty:
            self.queue.put_nowait("changed")
        self.dirty.add(ep.episode_id)

    def handle(
        self, req: pb.PlaySeatsRequest, results: list[pb.SeatActResult], created: list[pb.CreatedEpisode]
    ) -> None:
        self.include_text = self.include_text or req.include_text
        self.close_finished = self.close_finished or req.close_finished
        self.rejected_results_only = self.rejected_results_only or req.rejected_results_only
        for create in req.create:
            try:
                ep = self.servicer._create(create)
            except SessionError as exc:
                created.append(pb.CreatedEpisode(request_id=create.request_id, error=_status(exc)))
                continue
            except Exception:  # a bug: this create fails alone; the stream and its episodes go on
                logging.getLogger(__name__).exception("PlaySeats: create failed")
                error = make_status(grpc.StatusCode.INTERNAL, "internal error while creating the episode")
                created.append(pb.CreatedEpisode(request_id=create.request_id, error=error))
                continue
            self.owned.add(ep.episode_id)
            for seat in ep.tokens.values():
                self._join_seat(ep, seat)
            created.append(
                pb.CreatedEpisode(episode=self.servicer._created(ep), request_id=create.request_id)
            )
        for ref in req.join:
            try:
                ep, seat = self.servicer._seat(ref.episode_id, ref.token)
            except SessionError as exc:
                results.append(pb.SeatActResult(episode_id=ref.episode_id, error=_status(exc)))
                continue
            self._join_seat(ep, seat)
        for act in req.acts:
            result = self._act(act)
            if result is None:
                continue
            results.append(result)
            if not (result.accepted or result.defaulted or result.HasField("error")):
                # re-prompt: the same turn id is due again, now with feedback
                joined = self.joined.get(result.episode_id)
                if joined is not None:
                    joined.sent.pop(result.seat, None)
                    self.dirty.add(result.episode_id)

    def _join_seat(self, ep: Episode, seat: int) -> None:
        joined = self.joined.get(ep.episode_id)
        if joined is None:
            joined = self.joined[ep.episode_id] = _Joined(ep)
            ep.listeners.add(self.on_change)
        joined.seats.add(seat)
        joined.sent.pop(seat, None)  # a (re-)join sends the seat's pending decision again
        self.dirty.add(ep.episode_id)

    def _act(self, act: pb.SeatAct) -> pb.SeatActResult | None:
        """Apply one act; its result, or ``None`` for an accepted act when only rejections are wanted."""
        try:
            ep = self.manager.get(act.episode_id)
            if act.action.kind:
                result = self.manager.act(ep, act.token, act.turn_id, action_from_pb(act.action), "")
            else:
                result = self.manager.act(ep, act.token, act.turn_id, None, act.raw_text)
        except SessionError as exc:
            known = self.manager.episodes.get(act.episode_id)
            seat = known.tokens.get(act.token, 0) if known is not None else 0
            return pb.SeatActResult(
                episode_id=act.episode_id, seat=seat, turn_id=act.turn_id, error=_status(exc)
            )
        if result.accepted and self.rejected_results_only:
            return None
        return pb.SeatActResult(
            episode_id=act.episode_id, seat=ep.tokens[act.token], turn_id=act.turn_id,
            accepted=result.accepted, reason=result.reason, defaulted=result.defaulted,
            duplicate=result.duplicate,
        )  # fmt: skip

    def decisions(self, out: Any) -> None:
        """Append to ``out`` (the response's repeated ``decisions``) the observations of joined seats
        whose decision is new since the last message, and every joined seat's final observation once
        its episode ends."""
        observation = self.servicer._observation
        include_text = self.include_text
        for episode_id in self.dirty:
            joined = self.joined.get(episode_id)
            if joined is None:
                continue
            ep = joined.ep
            if ep.done:
                for seat in sorted(joined.seats):
                    observation(ep, seat, include_text=include_text, into=out)
                self._forget(joined)
                continue
            sent, seats = joined.sent, joined.seats
            for seat, turn_id in ep.open_turns.items():
                if sent.get(seat) != turn_id and seat in seats:
                    sent[seat] = turn_id
                    observation(ep, seat, include_text=include_text, into=out)
        self.dirty.clear()

    def _forget(self, joined: _Joined) -> None:
        ep = joined.ep
        del self.joined[ep.episode_id]
        ep.listeners.discard(self.on_change)
        if ep.episode_id in self.owned:
            self.owned.discard(ep.episode_id)
            if self.close_finished:
                self.manager.release(ep)

    def detach(self) -> None:
        for joined in self.joined.values():
            joined.ep.listeners.discard(self.on_change)


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
