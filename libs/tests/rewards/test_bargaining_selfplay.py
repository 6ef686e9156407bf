"""``bargaining_selfplay@1``: ``scenario_shaped@1`` plus ``no_deal`` -0.5 for both seats of a negotiation
that ends without a deal, on the seed-1 ``easy`` scenario (buyer, seat 0, speaks first: target 654 /
reservation 728; seller target 515 / reservation 471; 12 messages at most).

The values are written out by hand: win +1 > draw-zone deal 0 > no deal -0.5 > deal beyond the
reservation -1, and an invalid or defaulted turn -0.1 on top of any of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_games.scenarios import Scenario, generate_scenario
from wolfpack_games.scenarios.wire import scenario_to_pb
from wolfpack_rewards import score
from wolfpack_rewards.config import CreditConfig, OutcomeConfig
from wolfpack_rewards.result import ScoreError, ScoreResult
from wolfpack_rewards.specs import DEFAULT_SPECS, SPECS, RewardSpec, get_spec, resolve_spec

ScTraj = Callable[..., trajectory_pb2.Trajectory]
SPEC = "bargaining_selfplay@1"
WIN, LOSS, DRAW = common_pb2.OUTCOME_KIND_WIN, common_pb2.OUTCOME_KIND_LOSS, common_pb2.OUTCOME_KIND_DRAW
CHAT: list[tuple[int, str, dict[str, Any]]] = [
    (seat, "Let's talk about it.", {}) for _ in range(6) for seat in (0, 1)
]  # 12 messages, no deal


def scored(traj: trajectory_pb2.Trajectory, spec: str = SPEC) -> ScoreResult:
    return get_spec(spec).score(traj)


def seat_rewards(result: ScoreResult) -> dict[int, float]:
    return {s: round(result.seat_reward(s), 9) for s in result.seats}


def test_registered_for_bargaining_only_and_not_a_default() -> None:
    spec = get_spec(SPEC)
    assert SPEC in SPECS and spec.game_ids == ("bargaining_v1",)
    assert spec.config.outcome.no_deal == -0.5
    # everything else is scenario_shaped@1's config
    assert spec.config.model_dump(exclude={"outcome"}) == get_spec("scenario_shaped@1").config.model_dump(
        exclude={"outcome"}
    )
    assert resolve_spec("", "bargaining_v1").key == DEFAULT_SPECS["bargaining_v1"] == "scenario_shaped@1"
    assert get_spec("scenario_shaped@1").config.outcome.no_deal == 0.0


def test_deal_inside_both_targets_wins_for_both(bargaining: Scenario, sc_traj: ScTraj) -> None:
    result = scored(sc_traj(bargaining, [(0, "FINAL_BID: 600", {}), (1, "Deal.\nACCEPT", {})]))
    assert [t.components for t in result.turns] == [{"outcome": 1.0}, {"outcome": 1.0}]
    assert seat_rewards(result) == {0: 1.0, 1: 1.0}
    assert {s: r.outcome for s, r in result.seats.items()} == {0: WIN, 1: WIN}


def test_deal_beyond_the_reservation_loses(bargaining: Scenario, sc_traj: ScTraj) -> None:
    # 460 is below the seller's reservation 471 (and inside the buyer's target 654).
    result = scored(sc_traj(bargaining, [(0, "FINAL_BID: 460", {}), (1, "ACCEPT", {})]))
    assert seat_rewards(result) == {0: 1.0, 1: -1.0}
    assert "no_deal" not in result.seat_components(1)
    # 750 is above the buyer's reservation 728; the seller bids it (a second bid replaces the first).
    result = scored(
        sc_traj(bargaining, [(0, "FINAL_BID: 500", {}), (1, "FINAL_BID: 750", {}), (0, "ACCEPT", {})])
    )
    assert seat_rewards(result) == {0: -1.0, 1: 1.0}


def test_draw_zone_deal_beats_no_deal(bargaining: Scenario, sc_traj: ScTraj) -> None:
    # 700: above the buyer's target 654, within its reservation 728 (a draw); the seller's win.
    result = scored(sc_traj(bargaining, [(0, "FINAL_BID: 700", {}), (1, "ACCEPT", {})]))
    assert seat_rewards(result) == {0: 0.0, 1: 1.0}
    assert result.seats[0].outcome == DRAW and "no_deal" not in result.seat_components(0)


def test_no_deal_at_the_turn_limit_costs_both_seats(bargaining: Scenario, sc_traj: ScTraj) -> None:
    traj = sc_traj(bargaining, CHAT)
    result = scored(traj)
    assert result.notes["verifier"].startswith("no deal (turn limit reached)")
    assert [t.components for t in result.turns[:10]] == [{}] * 10
    assert [t.components for t in result.turns[10:]] == [{"outcome": 0.0, "no_deal": -0.5}] * 2
    assert seat_rewards(result) == {0: -0.5, 1: -0.5}
    # the verifier's outcome is still a draw (what win_rate counts); only the reward differs
    assert {s: r.outcome for s, r in result.seats.items()} == {0: DRAW, 1: DRAW}
    assert seat_rewards(scored(traj, "scenario_shaped@1")) == {0: 0.0, 1: 0.0}


def test_walking_away_costs_both_seats(bargaining: Scenario, sc_traj: ScTraj) -> None:
    result = scored(sc_traj(bargaining, [(0, "FINAL_BID: 400", {}), (1, "Too low.\nREJECT", {})]))
    assert result.notes["verifier"].startswith("no deal (walked away)")
    assert [t.components for t in result.turns] == [{"outcome": 0.0, "no_deal": -0.5}] * 2
    assert seat_rewards(result) == {0: -0.5, 1: -0.5}


def test_a_rule_violation_is_not_a_no_deal(bargaining: Scenario, sc_traj: ScTraj) -> None:
    """A malformed bid marked valid (a writer's error; the environment re-prompts these) is the offender's
    loss, and the verdict records no deal at all: nobody gets the no-deal price on top."""
    result = scored(sc_traj(bargaining, [(0, "FINAL_BID: lots", {}), (1, "ok", {})]))
    assert {s: r.outcome for s, r in result.seats.items()} == {0: LOSS, 1: DRAW}
    assert seat_rewards(result) == {0: -1.0, 1: 0.0}
    assert all("no_deal" not in t.components for t in result.turns)


def test_invalid_turns_cost_0_1_on_top(bargaining: Scenario, sc_traj: ScTraj) -> None:
    pass_action = common_pb2.Action(kind="say", text="(pass)")
    # A re-prompted attempt (not applied) before the accepting answer: the seller's win less 0.1.
    agreed = [
        (0, "FINAL_BID: 600", {}),
        (1, "ACCEPT\nREJECT", {"valid": False, "invalid_reason": "contradictory"}),
        (1, "ACCEPT", {"attempt": 1}),
    ]
    result = scored(sc_traj(bargaining, agreed))
    assert [t.components for t in result.turns] == [
        {"outcome": 1.0},
        {"invalid_penalty": -0.1},
        {"outcome": 1.0},
    ]
    assert seat_rewards(result) == {0: 1.0, 1: 0.9}
    # A defaulted turn in a negotiation that ends without a deal: -0.5 - 0.1 for that seat.
    chat = list(CHAT)
    chat[3] = (1, "ACCEPT", {"valid": False, "defaulted": True, "action": pass_action})
    result = scored(sc_traj(bargaining, chat))
    assert result.turns[3].components == {"invalid_penalty": -0.1}
    assert seat_rewards(result) == {0: -0.5, 1: -0.6}


def test_only_the_no_deal_differs_from_scenario_shaped(bargaining: Scenario, sc_traj: ScTraj) -> None:
    """Turn by turn, every trajectory with a deal scores as under scenario_shaped@1."""
    deals: list[list[tuple[int, str, dict[str, Any]]]] = [
        [(0, "FINAL_BID: 600", {}), (1, "ACCEPT", {})],
        [(0, "FINAL_BID: 700", {}), (1, "ACCEPT", {})],
        [(0, "<predict_next>Bob accepts</predict_next>\nFINAL_BID: 460", {}), (1, "ACCEPT", {})],
    ]
    for turns in deals:
        traj = sc_traj(bargaining, turns)
        ours, theirs = scored(traj), scored(traj, "scenario_shaped@1")
        assert [t.components for t in ours.turns] == [t.components for t in theirs.turns]


def test_a_seat_without_turns_gets_it_terminal_only(bargaining: Scenario, sc_traj: ScTraj) -> None:
    """An episode cut short after the buyer's first message: no deal, and the seller, who never spoke, has
    both its draw and the no-deal as terminal-only components."""
    result = scored(sc_traj(bargaining, [(0, "Hello.", {})]))
    assert result.turns[0].components == {"outcome": 0.0, "no_deal": -0.5}
    assert result.seats[1].terminal == {"no_deal": -0.5}
    assert seat_rewards(result) == {0: -0.5, 1: -0.5}


def test_credit_mode_spreads_it_like_the_outcome(bargaining: Scenario, sc_traj: ScTraj) -> None:
    base = get_spec(SPEC)
    uniform = RewardSpec(
        "selfplay_uniform_test", 1, "test", base.game_ids,
        base.config.model_copy(update={"credit": CreditConfig(mode="uniform")}), base.fn,
    )  # fmt: skip
    result = uniform.score(sc_traj(bargaining, CHAT[:4]))
    assert [t.components.get("no_deal") for t in result.turns] == [-0.5] * 4
    assert seat_rewards(result) == {0: -1.0, 1: -1.0}  # uniform credit: once per turn


def test_the_response_carries_it(bargaining: Scenario, sc_traj: ScTraj) -> None:
    """What the reward service (and local play) writes into the trajectory."""
    resp = score(sc_traj(bargaining, [(0, "FINAL_BID: 400", {}), (1, "REJECT", {})]), SPEC)
    assert resp.spec == resp.trajectory.reward_spec == SPEC
    assert {o.seat: o.final_reward for o in resp.trajectory.outcomes} == {0: -0.5, 1: -0.5}
    assert dict(resp.trajectory.turns[1].reward_components) == {"outcome": 0.0, "no_deal": -0.5}
    assert {s.seat: dict(s.components) for s in resp.seat_rewards}[0] == {"outcome": 0.0, "no_deal": -0.5}


def test_refused_where_there_is_no_deal_to_read(ww: Callable[..., trajectory_pb2.Trajectory]) -> None:
    """A no-deal price on a game or family without deals is an error, never a silent no-op."""
    shaped = get_spec("scenario_shaped@1")
    with_no_deal = shaped.config.model_copy(update={"outcome": OutcomeConfig(no_deal=-0.5)})
    variant = RewardSpec("no_deal_test", 1, "test", shaped.game_ids, with_no_deal, shaped.fn)
    ultimatum = generate_scenario("ultimatum", 1, "easy")
    traj = trajectory_pb2.Trajectory(game=common_pb2.GameRef(game_id="ultimatum_v1", variant="easy"))
    traj.scenario.CopyFrom(scenario_to_pb(ultimatum))
    traj.turns.add(index=0, seat=0, valid=True, response_text="OFFER 5")
    with pytest.raises(ScoreError, match=r"outcome.no_deal needs .*bargaining.*not 'ultimatum'"):
        variant.score(traj)
    assert shaped.score(traj).turns  # the same trajectory scores under the spec without it
    werewolf = get_spec("werewolf_shaped@1")
    ww_variant = RewardSpec(
        "no_deal_ww_test", 1, "test", werewolf.game_ids,
        werewolf.config.model_copy(update={"outcome": OutcomeConfig(no_deal=-0.5)}), werewolf.fn,
    )  # fmt: skip
    with pytest.raises(ScoreError, match="Werewolf has none"):
        ww_variant.score(ww())
