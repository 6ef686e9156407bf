"""A ``Session`` (``session.py``) in the environment service's protos: seat bindings in, observations,
actions, events and episode state out.

Why in the library: the environment service (``wolfpack_environment.convert``) and the trainer's
in-process environment (``wolfpack_trainer.local_rollout``) answer the rollout driver with the same
messages, and a field mapped two ways is a game that differs between local and service mode. Messages
only: no gRPC, no I/O.

``Observations`` keeps the legal-action encodings cache: parsing cached bytes into an Observation costs a
third of building its ``legal_actions`` entries field by field, and the same templates recur endlessly.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_games.base import Action, Event, LegalAction, Observation
from wolfpack_games.session import SeatPlan, Session, SessionSetupError

CONTROLLERS = {
    common_pb2.SEAT_CONTROLLER_POLICY: "policy",
    common_pb2.SEAT_CONTROLLER_EXTERNAL: "external",
    common_pb2.SEAT_CONTROLLER_SCRIPTED: "scripted",
}
CONTROLLER_PB = {v: k for k, v in CONTROLLERS.items()}
_LEGAL_FIELDS = attrgetter("kind", "targets", "needs_text")
"""A ``LegalAction``'s fields as a plain tuple: the legal-action cache's key (see ``Observations._legal_bytes``)."""

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


def seat_plans(request: pb.CreateEpisodeRequest) -> dict[int, SeatPlan]:
    """The request's seat bindings as plans (raises ``SessionSetupError`` on a duplicate or missing
    controller)."""
    seats: dict[int, SeatPlan] = {}
    for b in request.seats:
        if b.seat in seats:
            raise SessionSetupError(f"seat {b.seat} is bound twice")
        controller = CONTROLLERS.get(b.controller)
        if controller is None:
            raise SessionSetupError(f"seat {b.seat}: controller must be POLICY, EXTERNAL or SCRIPTED")
        # ``HasField`` first: reading an unset ``policy`` builds an empty sub-message (a create binds
        # every seat of a 12-seat game, most of them external)
        policy_id = b.policy.policy_id if b.HasField("policy") else ""
        seats[b.seat] = SeatPlan(controller, b.bot, policy_id, b.display_name)
    return seats


def episode_state_pb(ep: Session, seat: int | None) -> pb.GetEpisodeResponse:
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
        self._legal_by_value: dict[tuple[tuple[str, tuple[int, ...], bool], ...], bytes] = {}

    def observation(
        self,
        ep: Session,
        seat: int,
        obs: Observation | None = None,
        include_text: bool = True,
        into: Any = None,
        messages: bool = True,
    ) -> pb.Observation:
        """The seat's observation as a proto, appended to ``into`` (a repeated Observation field) when
        given, which saves copying it into the response afterwards. With text, ``messages`` is the text
        again as the one user message (``Observation.messages``' contract); ``messages=False`` leaves it
        out for a PlaySeats stream with ``omit_messages`` (its client rebuilds it from the text:
        ``wolfpack_environment.client.PlayStream``)."""
        env = ep.env
        o = obs or env.observe(seat)
        env_done = env.done
        msg: pb.Observation = pb.Observation() if into is None else into.add()
        if env_done or ep.closed:
            msg.episode_id = ep.episode_id
            msg.seat = seat
            msg.phase = o.phase
            msg.round = o.round
            msg.role = o.role
            msg.done = True
            msg.outcome = OUTCOME_PB[env.outcome()[seat]] if env_done else common_pb2.OUTCOME_KIND_ABORTED
        else:
            legal = o.legal_actions
            if legal:
                # ``_legal_bytes``' first key looked up here: about half the decisions hit it, without a call
                hit = self._legal_by_id.get(id(legal))
                msg.MergeFromString(
                    hit[1] if hit is not None and hit[0] is legal else self._legal_bytes(legal)
                )
            msg.episode_id = ep.episode_id
            msg.seat = seat
            msg.phase = o.phase
            msg.round = o.round
            msg.role = o.role
            turn_id = ep.open_turns.get(seat, 0)
            if turn_id:
                msg.turn_id = turn_id
                # only with a turn id to answer: between slices of a scripted run the engine may
                # already be at the seat's next decision before its turn is opened (play_scripted's stop)
                if o.your_turn:
                    msg.your_turn = True
        if o.feedback:
            msg.feedback = o.feedback
        if include_text:  # rendering is the expensive part; PlaySeats clients may skip it
            text = o.text
            msg.text = text
            if messages:
                msg.messages.add(role="user", content=text)
        return msg

    def _legal_bytes(self, legal: tuple[LegalAction, ...]) -> bytes:
        """``legal`` encoded as Observation.legal_actions entries, cached by value (vote templates recur
        across seats and games), with the tuple's identity as a cheaper first key: engines reuse tuples
        within a phase. The identity cache holds the tuple, so its id cannot be reused while cached. The
        value key is the entries' fields as plain tuples, hashed and compared in C: keyed by the
        ``LegalAction`` dataclasses themselves, every identity miss (engines build a new tuple per seat and
        phase) ran their Python ``__hash__`` and, on a hit, ``__eq__`` for each entry."""
        hit = self._legal_by_id.get(id(legal))
        if hit is not None and hit[0] is legal:
            return hit[1]
        key = tuple(map(_LEGAL_FIELDS, legal))
        encoded = self._legal_by_value.get(key)
        if encoded is None:
            if len(self._legal_by_value) >= 8192:
                self._legal_by_value.clear()
            encoded = self._legal_by_value[key] = pb.Observation(
                legal_actions=[
                    pb.LegalAction(kind=la.kind, targets=la.targets, needs_text=la.needs_text) for la in legal
                ]
            ).SerializeToString()
        if len(self._legal_by_id) >= 4096:
            self._legal_by_id.clear()
        self._legal_by_id[id(legal)] = (legal, encoded)
        return encoded
