"""Scenario specs re-verify the transcript with the real bargaining verifier (seed 1, easy: buyer target 654 /
reservation 728, seller target 515 / reservation 471, buyer speaks first)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_games.scenarios import Scenario, generate_scenario
from wolfpack_games.scenarios.wire import scenario_to_pb
from wolfpack_rewards.outcome import transcript_of
from wolfpack_rewards.result import ScoreError
from wolfpack_rewards.specs import get_spec

WIN, LOSS, DRAW = common_pb2.OUTCOME_KIND_WIN, common_pb2.OUTCOME_KIND_LOSS, common_pb2.OUTCOME_KIND_DRAW
ScTraj = Callable[..., trajectory_pb2.Trajectory]

AGREED = [
    (0, "How about this?\nFINAL_BID: 600", {}),
    # Re-prompted (contradictory) attempt: not applied, so not in the transcript.
    (1, "ACCEPT\nREJECT", {"valid": False, "invalid_reason": "contradictory"}),
    (1, "Deal.\nACCEPT", {"attempt": 1}),
]


def test_agreed_deal_both_win(bargaining: Scenario, sc_traj: ScTraj) -> None:
    traj = sc_traj(bargaining, AGREED, [WIN, WIN])
    assert transcript_of(traj) == [(0, AGREED[0][1]), (1, AGREED[2][1])]
    result = get_spec("scenario_verified@1").score(traj)
    assert result.spec == "scenario_verified@1"
    assert [t.reward for t in result.turns] == [1, 0, 1]  # terminal credit: each seat's last turn
    assert {s: (r.role, r.outcome) for s, r in result.seats.items()} == {
        0: ("buyer", WIN),
        1: ("seller", WIN),
    }
    assert "verifier_mismatch" not in result.notes
    assert result.notes["verifier"].startswith("deal at 600")

    shaped = get_spec("scenario_shaped@1").score(traj)
    assert [t.reward for t in shaped.turns] == pytest.approx([1, -0.1, 1])  # the re-prompted attempt
    assert shaped.seat_reward(1) == pytest.approx(0.9)


def test_rejected_with_defaulted_turn_is_a_draw(bargaining: Scenario, sc_traj: ScTraj) -> None:
    pass_action = common_pb2.Action(kind="say", text="(pass)")
    turns = [
        (0, "FINAL_BID: 400", {}),
        (1, "ACCEPT REJECT !!", {"valid": False, "defaulted": True, "action": pass_action}),
        (0, "FINAL_BID: 450", {}),
        (1, "Too low.\nREJECT", {}),
    ]
    traj = sc_traj(bargaining, turns, [DRAW, DRAW])
    assert transcript_of(traj)[1] == (1, "(pass)")  # the default the engine applied
    result = get_spec("scenario_shaped@1").score(traj)
    assert [t.reward for t in result.turns] == pytest.approx([0, -0.1, 0, 0])
    assert {s: r.outcome for s, r in result.seats.items()} == {0: DRAW, 1: DRAW}
    assert "walked away" in result.notes["verifier"]


def test_malformed_final_statement_loses_and_mismatch_is_reported(
    bargaining: Scenario, sc_traj: ScTraj
) -> None:
    # A writer that marked a malformed bid valid and called the game a draw: the verifier wins.
    traj = sc_traj(bargaining, [(0, "FINAL_BID: lots", {}), (1, "ok", {})], [DRAW, DRAW])
    result = get_spec("scenario_verified@1").score(traj)
    assert {s: r.outcome for s, r in result.seats.items()} == {0: LOSS, 1: DRAW}
    assert [t.reward for t in result.turns] == [-1, 0]
    assert result.notes["verifier_mismatch"] == (
        "seat 0: trajectory OUTCOME_KIND_DRAW, verifier OUTCOME_KIND_LOSS"
    )
    assert "violation" in result.notes["verifier_details"]


def test_prediction_bonus_in_scenarios(bargaining: Scenario, sc_traj: ScTraj) -> None:
    turns = [
        (0, "<predict_next>Bob accepts</predict_next>\nFINAL_BID: 600", {}),
        (1, "Deal.\nACCEPT", {}),
        (0, "thanks", {"observation_text": "Bob accepts"}),  # after the end: ignored by the verifier
    ]
    traj = sc_traj(bargaining, turns)
    result = get_spec("scenario_shaped@1").score(traj)
    assert result.turns[0].components == {"prediction": pytest.approx(0.2)}
    assert result.seat_reward(0) == pytest.approx(1.2)
    assert result.notes["verifier_details"] == '{"deal": 600.0, "ignored_messages": 1, "turns": 2}'


def test_bad_scenario(bargaining: Scenario, sc_traj: ScTraj) -> None:
    spec = get_spec("scenario_verified@1")
    traj = sc_traj(bargaining, AGREED)
    traj.ClearField("scenario")
    with pytest.raises(ScoreError, match=r"needs its scenario \(Trajectory.scenario\)"):
        spec.score(traj)
    traj.scenario.CopyFrom(scenario_to_pb(bargaining))
    traj.scenario.params["cap"].Clear()  # a value without a kind
    with pytest.raises(ScoreError, match="not a valid scenario"):
        spec.score(traj)
    traj.scenario.CopyFrom(scenario_to_pb(bargaining))
    traj.scenario.players[0].private_params["target"].int_value = 10_000  # content no longer matches the id
    with pytest.raises(ScoreError, match="not a valid scenario"):
        spec.score(traj)
    other = generate_scenario("ultimatum", 1, "easy")
    traj.scenario.CopyFrom(scenario_to_pb(other))
    with pytest.raises(ScoreError, match="is game ultimatum_v1"):
        spec.score(traj)


def test_inconsistent_scenario_seats(bargaining: Scenario, sc_traj: ScTraj) -> None:
    traj = sc_traj(bargaining, [(0, "hi", {}), (2, "me too", {})])
    with pytest.raises(ScoreError, match="turn 1 is by seat 2"):
        get_spec("scenario_verified@1").score(traj)
    traj = sc_traj(bargaining, AGREED)
    traj.outcomes.add(seat=5)
    with pytest.raises(ScoreError, match="outcomes has seat 5"):
        get_spec("scenario_verified@1").score(traj)
