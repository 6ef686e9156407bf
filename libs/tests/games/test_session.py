"""The session rules (``wolfpack_games.session``) and their proto mapping (``session_proto``), on the real
engines and bots. The environment service and the trainer's in-process environment both play by these, so
each rule is checked here once, against what the engine itself says: per-seat turn ids, a re-prompt that
keeps the turn id until the engine defaults the seat, a scripted run that can pause and resume without
changing the game, and setup errors that name what is wrong."""

from __future__ import annotations

from typing import Any

import pytest

from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_games import get_game
from wolfpack_games.session import SeatPlan, Session, SessionSetupError, start_session
from wolfpack_games.session_proto import Observations, episode_state_pb, seat_plans


def _session(game_id: str, variant: str, seed: int, played: tuple[int, ...], **kw: Any) -> Session:
    seats = {s: SeatPlan("external") for s in played}
    return start_session(
        Session, episode_id=f"e{seed}", game_id=game_id, variant=variant, seed=seed, seats=seats, **kw
    )


def _play_out(ep: Session, answer: str) -> list[tuple[int, int, bool, bool]]:
    """Advance and answer every open turn with ``answer`` until the game ends; (seat, turn id,
    accepted, defaulted) per answer."""
    log = []
    ep.advance()
    while not ep.done:
        assert ep.open_turns, "a running game with nothing to decide would hang its players"
        seat, turn = min(ep.open_turns.items())
        applied = ep.apply(seat, answer)
        log.append((seat, turn, applied.accepted, applied.defaulted))
        ep.advance()
    return log


def test_unlisted_seats_are_scripted_with_the_default_bot_and_played_seats_are_listed() -> None:
    ep = _session("werewolf_v1", "6p", 1, (0, 3))
    spec = get_game("werewolf_v1")
    assert ep.variant == "6p" and ep.played_seats() == [0, 3]
    assert set(ep.bots) == {1, 2, 4, 5}
    assert all(ep.bots[s] is spec.bots[spec.default_bot] for s in ep.bots)
    assert not ep.open_turns  # nothing is played before the host advances
    default_variant = _session("werewolf_v1", "", 1, ())
    assert default_variant.variant == spec.default_variant


def test_turn_ids_count_per_seat_and_a_reprompt_keeps_the_turn_until_the_engine_defaults_it() -> None:
    ep = _session("werewolf_v1", "6p", 4, (0, 1), options={"max_reprompts": 2})
    ep.advance()
    (seat, turn), *_ = sorted(ep.open_turns.items())
    assert turn == 1
    reprompts = 0
    while True:
        applied = ep.apply(seat, "")  # an empty answer is an invalid move
        if applied.defaulted:
            break
        assert not applied.accepted and applied.reason and applied.action is None
        assert ep.open_turns[seat] == turn  # re-prompt: the same turn, now with feedback
        assert ep.env.observe(seat).feedback
        reprompts += 1
    assert reprompts == 2  # max_reprompts
    assert applied.action is not None  # the default action the engine applied
    assert seat not in ep.open_turns  # the decision is made
    ep.advance()
    for s, t in ep.open_turns.items():
        assert t == ep.seat_turns[s] and t >= 1
    # per seat: another seat's decisions never move this seat's counter
    log = _play_out(_session("werewolf_v1", "6p", 2, (0, 1, 2)), "vote 3")
    for s in (0, 1, 2):
        turns = [t for seat_, t, _, _ in log if seat_ == s]
        distinct = sorted(set(turns))
        assert distinct == list(range(1, len(distinct) + 1)), (s, turns)


def test_a_scripted_run_paused_after_every_move_plays_the_same_game() -> None:
    whole = _session("werewolf_v1", "6p", 7, (2,))
    whole_log = _play_out(whole, "pass")
    paused = _session("werewolf_v1", "6p", 7, (2,))
    pauses = 0
    while not paused.done:
        while not paused.play_scripted(stop=lambda: True):
            pauses += 1
        paused.open_due_turns()
        if not paused.done:
            seat, _ = min(paused.open_turns.items())
            paused.apply(seat, "pass")
    assert pauses > 0
    assert [e.text for e in paused.env.events] == [e.text for e in whole.env.events]
    assert paused.env.outcome() == whole.env.outcome() and whole_log


def test_the_same_seed_is_the_same_game() -> None:
    a, b = _session("werewolf_v1", "6p", 11, (0,)), _session("werewolf_v1", "6p", 11, (0,))
    assert _play_out(a, "vote 1") == _play_out(b, "vote 1")
    assert [(e.kind, e.actor, e.target, e.text) for e in a.env.events] == [
        (e.kind, e.actor, e.target, e.text) for e in b.env.events
    ]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"game_id": "chess_v1"}, "chess_v1"),
        ({"game_id": "werewolf_v1", "variant": "99p"}, "unknown variant '99p'"),
        ({"game_id": "werewolf_v1", "default_bot": "oracle"}, "unknown bot 'oracle'"),
        ({"game_id": "werewolf_v1", "seats": {6: SeatPlan("external")}}, "seat 6 out of range"),
        ({"game_id": "werewolf_v1", "seats": {0: SeatPlan("robot")}}, "seat 0: controller must be one of"),
        ({"game_id": "werewolf_v1", "options": {"roles": "not a table"}}, "cannot start werewolf_v1/"),
    ],
)
def test_setup_errors_name_what_is_wrong(kw: dict[str, object], message: str) -> None:
    with pytest.raises(SessionSetupError, match=message):
        start_session(Session, episode_id="x", **kw)  # type: ignore[arg-type]


def test_seat_bindings_and_state_in_protos() -> None:
    req = pb.CreateEpisodeRequest()
    req.seats.add(seat=0, controller=common_pb2.SEAT_CONTROLLER_POLICY).policy.policy_id = "p"
    req.seats.add(seat=1, controller=common_pb2.SEAT_CONTROLLER_SCRIPTED, bot="random")
    plans = seat_plans(req)
    assert plans == {0: SeatPlan("policy", policy_id="p"), 1: SeatPlan("scripted", bot="random")}
    req.seats.add(seat=0, controller=common_pb2.SEAT_CONTROLLER_EXTERNAL)
    with pytest.raises(SessionSetupError, match="seat 0 is bound twice"):
        seat_plans(req)
    unbound = pb.CreateEpisodeRequest()
    unbound.seats.add(seat=2)
    with pytest.raises(SessionSetupError, match="controller must be POLICY, EXTERNAL or SCRIPTED"):
        seat_plans(unbound)

    ep = start_session(Session, episode_id="e", game_id="werewolf_v1", variant="6p", seed=3, seats=plans)
    ep.advance()
    state = episode_state_pb(ep, 0)
    controllers = [s.controller for s in state.seats][:2]
    assert controllers == [common_pb2.SEAT_CONTROLLER_POLICY, common_pb2.SEAT_CONTROLLER_SCRIPTED]
    assert state.seats[0].role == ep.env.role(0) and not any(s.role for s in state.seats[1:])  # hidden
    assert not state.events
    full = episode_state_pb(ep, None)
    assert [s.role for s in full.seats] == [ep.env.role(s) for s in range(6)] and full.events

    observations = Observations()
    (seat, turn), *_ = ep.open_turns.items()
    msg = observations.observation(ep, seat)
    assert msg.turn_id == turn and msg.your_turn and msg.legal_actions and msg.messages[0].content == msg.text
    ep.closed = True  # aborted by its host
    aborted = observations.observation(ep, seat)
    assert aborted.done and aborted.outcome == common_pb2.OUTCOME_KIND_ABORTED and not aborted.legal_actions
