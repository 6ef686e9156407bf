"""gRPC adapter of the environment service: proto <-> ``EpisodeManager`` (all rules live in the games,
all session logic in ``sessions.py``). Start it with ``wolfpack serve environment``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, NoReturn

import grpc
import yaml

from wolfpack import rpc
from wolfpack.settings import Settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack.v1 import environment_service_pb2_grpc as pb_grpc
from wolfpack_environment.games import Action, Event, Observation, list_games
from wolfpack_environment.sessions import Episode, EpisodeManager, NotFoundError, SeatPlan, SessionError

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
    def __init__(self, manager: EpisodeManager | None = None, scenario_store: str | None = None) -> None:
        self.manager = manager or EpisodeManager()
        self.scenario_store_url = scenario_store
        self._store: Any = None

    def _scenario(self, scenario_id: str, game_id: str) -> Any:
        """Look a scenario up in the store (opened on first use) and check it belongs to ``game_id``."""
        if self.scenario_store_url is None:
            raise SessionError("scenario_id needs a scenario store (WOLFPACK_SCENARIO_STORE)")
        from wolfpack_environment.games.scenarios import open_store

        if self._store is None:
            self._store = open_store(self.scenario_store_url)
        scenario = self._store.get(scenario_id)
        if scenario is None:
            raise NotFoundError(f"no scenario {scenario_id!r} in {self.scenario_store_url}")
        if f"{scenario.family}_v1" != game_id:
            raise SessionError(f"scenario {scenario_id} is a {scenario.family} scenario, not {game_id}")
        return scenario

    def _observation(
        self, ep: Episode, seat: int, obs: Observation | None = None, include_text: bool = True
    ) -> pb.Observation:
        o = obs or self.manager.observe(ep, seat)
        done = ep.done
        msg = pb.Observation(
            episode_id=ep.episode_id,
            seat=seat,
            turn_id=self.manager.current_turn_id(ep, seat),
            phase=o.phase,
            round=o.round,
            your_turn=o.your_turn and not done,
            done=done,
            feedback=o.feedback,
            role=o.role,
        )
        if include_text:  # rendering is the expensive part; PlaySeats clients may skip it
            msg.text = o.text
            msg.messages.add(role="user", content=o.text)
        if not done:
            for la in o.legal_actions:
                msg.legal_actions.add(kind=la.kind, targets=list(la.targets), needs_text=la.needs_text)
        if ep.env.done:
            msg.outcome = _OUTCOME_PB[ep.env.outcome()[seat]]
        elif ep.closed:
            msg.outcome = common_pb2.OUTCOME_KIND_ABORTED
        return msg

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
        seats: dict[int, SeatPlan] = {}
        try:
            if not request.game.game_id:
                raise SessionError("game.game_id is required")
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
            options: dict[str, Any] = {k: yaml.safe_load(v) for k, v in request.options.items()}
            if request.scenario_id:
                options["scenario"] = self._scenario(request.scenario_id, request.game.game_id)
            ep = self.manager.create(
                request.game.game_id,
                request.game.variant,
                request.seed,
                seats,
                default_bot=request.default_bot,
                language=request.language or "en",
                turn_timeout_s=request.turn_timeout_s,
                options=options,
                episode_id=request.request_id,
            )
        except SessionError as exc:
            await _abort(context, exc)
        resp = pb.CreateEpisodeResponse(
            episode_id=ep.episode_id, admin_token=ep.admin_token, num_seats=len(ep.env.possible_agents)
        )
        for token, seat in sorted(ep.tokens.items(), key=lambda kv: kv[1]):
            resp.seat_tokens.add(seat=seat, token=token)
        return resp

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
            closed = self.manager.close(request.episode_id, request.token)
        except SessionError as exc:
            await _abort(context, exc)
        return pb.CloseEpisodeResponse(closed=closed)

    async def PlaySeats(
        self, request_iterator: AsyncIterator[pb.PlaySeatsRequest], context: Any
    ) -> AsyncIterator[pb.PlaySeatsResponse]:
        """Batched play: requests and episode changes go through one queue; each wake-up applies every
        queued act, then sends every joined seat's new decisions in one message."""
        queue: asyncio.Queue[pb.PlaySeatsRequest | str | None] = asyncio.Queue()
        dirty: set[str] = set()  # episodes changed since the last wake-up: only their seats are scanned

        def on_change(ep: Episode) -> None:
            if not dirty:
                queue.put_nowait("changed")
            dirty.add(ep.episode_id)

        async def pump() -> None:
            try:
                async for req in request_iterator:
                    queue.put_nowait(req)
            finally:
                queue.put_nowait(None)

        reader = asyncio.create_task(pump())
        joined: dict[tuple[str, int], Episode] = {}
        seats_of: dict[str, list[int]] = {}
        sent: dict[tuple[str, int], tuple[int, bool]] = {}
        include_text = False
        client_done = False
        try:
            while not client_done:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                results: list[pb.SeatActResult] = []
                for item in batch:
                    if item is None:
                        client_done = True
                    elif isinstance(item, pb.PlaySeatsRequest):
                        include_text = include_text or item.include_text
                        for ref in item.join:
                            self._join(ref, joined, seats_of, on_change, results)
                            dirty.add(ref.episode_id)
                        for act in item.acts:
                            result = self._seat_act(act)
                            results.append(result)
                            if not (result.accepted or result.defaulted or result.code):
                                # re-prompt: the same turn id is due again, now with feedback
                                sent.pop((result.episode_id, result.seat), None)
                                dirty.add(result.episode_id)
                decisions = []
                for episode_id in list(dirty):
                    for seat in seats_of.get(episode_id, ()):
                        key = (episode_id, seat)
                        ep = joined[key]
                        state = (self.manager.current_turn_id(ep, seat), ep.done)
                        if state != sent.get(key) and (state[0] or state[1]):
                            sent[key] = state
                            decisions.append(self._observation(ep, seat, include_text=include_text))
                dirty.clear()
                if results or decisions:
                    yield pb.PlaySeatsResponse(decisions=decisions, results=results)
        finally:
            reader.cancel()
            for ep in {e.episode_id: e for e in joined.values()}.values():
                ep.listeners.discard(on_change)

    def _join(
        self,
        ref: pb.SeatRef,
        joined: dict[tuple[str, int], Episode],
        seats_of: dict[str, list[int]],
        on_change: Callable[[Episode], None],
        results: list[pb.SeatActResult],
    ) -> None:
        try:
            ep, seat = self._seat(ref.episode_id, ref.token)
        except SessionError as exc:
            results.append(pb.SeatActResult(episode_id=ref.episode_id, reason=str(exc), code=exc.code))
            return
        if (ep.episode_id, seat) not in joined:
            joined[(ep.episode_id, seat)] = ep
            seats_of.setdefault(ep.episode_id, []).append(seat)
        ep.listeners.add(on_change)

    def _seat_act(self, act: pb.SeatAct) -> pb.SeatActResult:
        out = pb.SeatActResult(episode_id=act.episode_id, turn_id=act.turn_id)
        try:
            ep = self.manager.get(act.episode_id)
            out.seat = self.manager.seat_of(ep, act.token)
            action = action_from_pb(act.action) if act.action.kind else None
            result = self.manager.act(ep, act.token, act.turn_id, action, act.raw_text)
        except SessionError as exc:
            out.reason, out.code = str(exc), exc.code
            return out
        out.accepted, out.reason = result.accepted, result.reason
        out.defaulted, out.duplicate = result.defaulted, result.duplicate
        return out


def register(server: grpc.aio.Server, servicer: EnvironmentServicer | None = None) -> Sequence[str]:
    """Add this service's servicers to ``server`` and return their full names."""
    pb_grpc.add_EnvironmentServiceServicer_to_server(servicer or EnvironmentServicer(), server)
    return [pb.DESCRIPTOR.services_by_name["EnvironmentService"].full_name]


async def main(settings: Settings, address: str | None = None) -> None:
    servicer = EnvironmentServicer(scenario_store=settings.scenario_store_url())

    async def on_stop() -> None:
        servicer.manager.close_all()

    await rpc.serve(SERVICE, lambda server: register(server, servicer), settings, address, on_stop=on_stop)
