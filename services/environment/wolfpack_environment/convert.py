"""Proto <-> session values for the environment service: actions, events, observations, episode state,
and create requests -> started episodes. No gRPC here: the servicer (``server.py``) and the PlaySeats
state machine (``play_stream.py``) both build on these, so a field is mapped in one place.

``Observations`` keeps the legal-action encodings cache: parsing cached bytes into an Observation costs a
third of building its ``legal_actions`` entries field by field, and the same templates recur endlessly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context

from wolfpack import telemetry
from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.sessions import (
    Episode,
    EpisodeManager,
    NotFoundError,
    SeatPlan,
    SessionError,
    parse_options,
)
from wolfpack_games import Action, Event, LegalAction, Observation

CONTROLLERS = {
    common_pb2.SEAT_CONTROLLER_POLICY: "policy",
    common_pb2.SEAT_CONTROLLER_EXTERNAL: "external",
    common_pb2.SEAT_CONTROLLER_SCRIPTED: "scripted",
}
CONTROLLER_PB = {v: k for k, v in CONTROLLERS.items()}
OUTCOME_PB = {
    1: common_pb2.OUTCOME_KIND_WIN,
    -1: common_pb2.OUTCOME_KIND_LOSS,
    0: common_pb2.OUTCOME_KIND_DRAW,
}


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


def created_pb(ep: Episode) -> pb.CreateEpisodeResponse:
    """The CreateEpisodeResponse of a started episode: its id, one token per played seat, admin token."""
    resp = pb.CreateEpisodeResponse(
        episode_id=ep.episode_id, admin_token=ep.admin_token, num_seats=len(ep.env.possible_agents)
    )
    for token, seat in sorted(ep.tokens.items(), key=lambda kv: kv[1]):
        resp.seat_tokens.add(seat=seat, token=token)
    return resp


def episode_state_pb(ep: Episode, seat: int | None) -> pb.GetEpisodeResponse:
    """What ``GetEpisode`` answers: every seat's public state; every role and the event log in the full
    view (``seat`` None: the admin token's; anyone's once the episode is over), else only ``seat``'s
    own role."""
    env = ep.env
    full = seat is None or ep.done
    obs = env.observe(0 if seat is None else seat)  # phase and round are public: any seat's view has them
    resp = pb.GetEpisodeResponse(
        episode_id=ep.episode_id, seed=ep.seed, phase=obs.phase, round=obs.round, done=ep.done,
        winner=env.winner() if env.done else "",
    )  # fmt: skip
    resp.game.game_id, resp.game.variant = ep.game_id, ep.variant
    outcome = env.outcome() if env.done else {}
    alive = getattr(env, "alive", None)
    for s in env.possible_agents:
        state = resp.seats.add(seat=s, controller=CONTROLLER_PB[ep.seats[s].controller])
        state.alive = bool(alive[s]) if alive is not None else not env.done
        if full or s == seat:
            state.role = env.role(s)
        if s in outcome:
            state.outcome = OUTCOME_PB[outcome[s]]
    if full:
        resp.events.extend(event_to_pb(e) for e in env.events)
    return resp


class Observations:
    """Builds Observation protos, with the legal-action encoding cache (see the module docstring)."""

    def __init__(self) -> None:
        self._legal_by_id: dict[int, tuple[tuple[LegalAction, ...], bytes]] = {}
        self._legal_by_value: dict[tuple[LegalAction, ...], bytes] = {}

    def observation(
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
            msg.outcome = OUTCOME_PB[ep.env.outcome()[seat]] if env_done else common_pb2.OUTCOME_KIND_ABORTED
        else:
            msg.turn_id = ep.open_turns.get(seat, 0)
            # only with a turn id to answer: between slices of a scripted run the engine may already
            # be at the seat's next decision before its turn is opened (sessions.EpisodeManager._advance)
            msg.your_turn = o.your_turn and msg.turn_id != 0
        if o.feedback:
            msg.feedback = o.feedback
        if include_text:  # rendering is the expensive part; PlaySeats clients may skip it
            msg.text = o.text
            msg.messages.add(role="user", content=o.text)
        return msg

    def _legal_bytes(self, legal: tuple[LegalAction, ...]) -> bytes:
        """``legal`` encoded as Observation.legal_actions entries, cached by value (vote templates recur
        across seats and games), with the tuple's identity as a cheaper first key: engines reuse tuples
        within a phase. The identity cache holds the tuple, so its id cannot be reused while cached."""
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


def fingerprint(request: pb.CreateEpisodeRequest) -> bytes:
    """What makes two create requests with one request_id the same request: everything but the trace
    context (a retry may be sent from a new span)."""
    if not request.HasField("trace"):
        return request.SerializeToString(deterministic=True)
    copy = pb.CreateEpisodeRequest()
    copy.CopyFrom(request)
    copy.ClearField("trace")
    return copy.SerializeToString(deterministic=True)


def seat_plans(request: pb.CreateEpisodeRequest) -> dict[int, SeatPlan]:
    """The request's seat bindings as plans (raises ``SessionError`` on a duplicate or missing controller)."""
    seats: dict[int, SeatPlan] = {}
    for b in request.seats:
        if b.seat in seats:
            raise SessionError(f"seat {b.seat} is bound twice")
        controller = CONTROLLERS.get(b.controller)
        if controller is None:
            raise SessionError(f"seat {b.seat}: controller must be POLICY, EXTERNAL or SCRIPTED")
        seats[b.seat] = SeatPlan(
            controller, bot=b.bot, policy_id=b.policy.policy_id, display_name=b.display_name
        )
    return seats


class EpisodeFactory:
    """Create requests -> started episodes: validation, options (YAML values), the scenario store
    (opened on first use) and the trace parent. Called by CreateEpisode and by PlaySeats creates."""

    def __init__(self, manager: EpisodeManager, scenario_store: str | None = None) -> None:
        self.manager = manager
        self.scenario_store_url = scenario_store
        self._store: Any = None

    def _scenario(self, scenario_id: str, game_id: str) -> Any:
        """Look a scenario up in the store and check it belongs to ``game_id``."""
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

    def __call__(self, request: pb.CreateEpisodeRequest, options: dict[str, Any] | None = None) -> Episode:
        """Validate ``request`` and start its episode (raises ``SessionError`` on bad input). ``options``:
        the request's options already parsed (``await parsed_options(request)``), else parsed here."""
        if not request.game.game_id:
            raise SessionError("game.game_id is required")
        seats = seat_plans(request)
        # Option values are YAML scalars/collections sent as strings ("true", "[1, 2]", "revote").
        if options is None:
            options = parse_options(request.options)
        if request.scenario_id:
            options["scenario"] = self._scenario(request.scenario_id, request.game.game_id)
        # The episode span starts under the current context: the item's own trace context when the
        # caller sent one (PlaySeats creates many episodes over one call), else the call's.
        token = (
            otel_context.attach(telemetry.extract_from(request.trace)) if request.trace.traceparent else None
        )
        try:
            return self.manager.create(
                request.game.game_id, request.game.variant, request.seed, seats,
                default_bot=request.default_bot, language=request.language or "en",
                turn_timeout_s=request.turn_timeout_s, options=options, request_id=request.request_id,
                fingerprint=fingerprint(request) if request.request_id else b"",
            )  # fmt: skip
        finally:
            if token is not None:
                otel_context.detach(token)


Create = Callable[[pb.CreateEpisodeRequest, "dict[str, Any] | None"], Episode]
"""What PlaySeats needs to start an episode (an ``EpisodeFactory``)."""

OFF_LOOP_OPTION_CHARS = 2_048
"""Options longer than this in all are parsed in a worker thread: YAML of 64 KiB (the bound) takes
~0.1 s to build, during which the event loop (health checks, every other caller) would stand still."""


async def parsed_options(request: pb.CreateEpisodeRequest) -> dict[str, Any] | None:
    """The request's options parsed off the event loop when they are long (``OFF_LOOP_OPTION_CHARS``);
    ``None`` for short ones, which the factory parses inline for less than a thread hop costs."""
    raw = request.options
    if not raw or sum(len(v) for v in raw.values()) <= OFF_LOOP_OPTION_CHARS:
        return None
    return await asyncio.to_thread(parse_options, dict(raw))
