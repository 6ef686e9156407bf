"""Reward specs on hand-built trajectories, with hand-computed expected numbers."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_rewards.config import SpecConfig
from wolfpack_rewards.result import ScoreError, ScoreResult, to_response
from wolfpack_rewards.specs import DEFAULT_SPECS, SPECS, get_spec, load_specs, resolve_spec

WW = Callable[..., trajectory_pb2.Trajectory]
# char ratio of "Seat 0 is a werewolf." (21) vs "Seat 0 is a wolf." (17): blocks "Seat 0 is a w" (13) and
# "olf." (4), so 2 * 17 / 38.
RATIO = 34 / 38


def turn_rewards(result: ScoreResult) -> list[float]:
    return [t.reward for t in result.turns]


def assert_invariant(result: ScoreResult) -> None:
    for seat in result.seats:
        turn_sum = math.fsum(t.reward for t in result.turns if t.seat == seat)
        terminal = math.fsum(result.seats[seat].terminal.values())
        assert result.seat_reward(seat) == pytest.approx(turn_sum + terminal)
        assert math.fsum(result.seat_components(seat).values()) == pytest.approx(result.seat_reward(seat))


def test_werewolf_outcome_terminal(ww: WW) -> None:
    result = get_spec("werewolf_outcome@1").score(ww())
    assert result.spec == "werewolf_outcome@1"
    # Last turns: seat 0 -> 4, seat 1 -> 8, seat 2 -> 5, seat 3 -> 3, seat 4 -> 9, seat 5 -> 7.
    assert turn_rewards(result) == [0, 0, 0, -1, 1, -1, 0, -1, 1, -1]
    assert {s: result.seat_reward(s) for s in result.seats} == {0: 1, 1: 1, 2: -1, 3: -1, 4: -1, 5: -1}
    assert result.turns[4].components == {"outcome": 1.0}
    assert result.turns[0].components == {}
    assert_invariant(result)


def test_werewolf_shaped_hand_computed(ww: WW) -> None:
    result = get_spec("werewolf_shaped").score(ww())  # bare name -> latest version
    assert result.spec == "werewolf_shaped@1"
    assert result.turns[2].components == {"prediction": pytest.approx(0.2 * RATIO)}
    assert result.turns[6].components == {"invalid_penalty": pytest.approx(-0.1)}
    expected = [0, 0, 0.2 * RATIO, -1, 1, -1, -0.1, -1, 1, -1]
    assert turn_rewards(result) == pytest.approx(expected)
    seats = {s: result.seat_reward(s) for s in result.seats}
    assert seats == pytest.approx({0: 1, 1: 1, 2: -1 + 0.2 * RATIO, 3: -1, 4: -1.1, 5: -1})
    assert result.seat_components(4) == pytest.approx({"outcome": -1, "invalid_penalty": -0.1})
    assert_invariant(result)


def test_village_win_and_team_magnitudes(ww: WW) -> None:
    cfg = get_spec("werewolf_outcome@1").config.merged(
        {"outcome": {"team_win": {"wolves": 1.5}, "role_loss": {"seer": -2.0}, "loss": -0.5}}
    )
    wolves = get_spec("werewolf_outcome@1").score(ww(), cfg)
    assert {s: wolves.seat_reward(s) for s in wolves.seats} == {
        0: 1.5,
        1: 1.5,
        2: -2,
        3: -0.5,
        4: -0.5,
        5: -0.5,
    }
    village = get_spec("werewolf_outcome@1").score(ww("village"), cfg)
    assert {s: village.seat_reward(s) for s in village.seats} == {0: -0.5, 1: -0.5, 2: 1, 3: 1, 4: 1, 5: 1}


def test_unspecified_outcome_is_derived_from_winner(ww: WW) -> None:
    traj = ww()
    for o in traj.outcomes:
        o.outcome = common_pb2.OUTCOME_KIND_UNSPECIFIED
        o.team = ""  # derived from the role too
    result = get_spec("werewolf_outcome@1").score(traj)
    assert {s: result.seat_reward(s) for s in result.seats} == {0: 1, 1: 1, 2: -1, 3: -1, 4: -1, 5: -1}
    assert result.seats[1].team == "wolves"
    traj.winner = ""
    aborted = get_spec("werewolf_outcome@1").score(traj)
    assert all(aborted.seat_reward(s) == 0 for s in aborted.seats)


def test_outcome_winner_mismatch_is_noted(ww: WW) -> None:
    traj = ww()
    traj.outcomes[0].outcome = common_pb2.OUTCOME_KIND_LOSS
    result = get_spec("werewolf_outcome@1").score(traj)
    assert "outcome_mismatch.seat0" in result.notes
    assert result.seat_reward(0) == -1  # the recorded outcome is used; the note flags it


@pytest.mark.parametrize(
    ("mode", "gamma", "seat4_turns"),
    [("terminal", 0.5, [0, -1]), ("uniform", 0.5, [-1, -1]), ("discounted", 0.5, [-0.5, -1])],
)
def test_credit_modes(ww: WW, mode: str, gamma: float, seat4_turns: list[float]) -> None:
    spec = get_spec("werewolf_outcome@1")
    result = spec.score(ww(), spec.config.merged({"credit": {"mode": mode, "gamma": gamma}}))
    assert [result.turns[6].reward, result.turns[9].reward] == seat4_turns  # seat 4 acts at 6 and 9
    assert result.seat_reward(4) == sum(seat4_turns)
    assert_invariant(result)


def test_discounted_three_turns() -> None:
    from wolfpack_rewards.credit import assign

    assert assign([1, 4, 7], 2.0, "discounted", 0.9) == pytest.approx({1: 2 * 0.81, 4: 1.8, 7: 2.0})
    assert assign([], 1.0, "terminal") == {}


def test_seat_without_turns_gets_terminal_outcome(ww: WW) -> None:
    traj = ww()
    del traj.turns[7]  # seat 5's only turn
    result = get_spec("werewolf_outcome@1").score(traj)
    assert result.seats[5].terminal == {"outcome": -1}
    assert result.seat_reward(5) == -1
    assert_invariant(result)


def test_survival_bonus(ww: WW) -> None:
    spec = get_spec("werewolf_outcome@1")
    cfg = spec.config.merged({"outcome": {"survival_bonus": 0.25}})
    traj = ww()
    skipped = spec.score(traj, cfg)
    assert "survival" in skipped.notes and skipped.seat_reward(0) == 1
    for o in traj.outcomes:
        o.alive = o.seat in (0, 1, 4)
    result = spec.score(traj, cfg)
    assert result.seats[0].terminal == {"survival": 0.25}
    assert {s: result.seat_reward(s) for s in result.seats} == {
        0: 1.25,
        1: 1.25,
        2: -1,
        3: -1,
        4: -0.75,
        5: -1,
    }
    assert_invariant(result)


def test_penalties_tags_and_length(ww: WW) -> None:
    traj = ww()
    traj.turns[0].response_text = "<think>hmm</think> kill 3"  # has think, lacks predict_next
    traj.turns[0].response_token_ids.extend(range(5))
    traj.turns[1].response_text = "x" * 50  # lacks both; over the char limit
    cfg = SpecConfig.model_validate(
        {
            "penalties": {
                "required_tags": ["think", "predict_next"],
                "missing_tag": 0.05,
                "max_tokens": 4,
                "max_chars": 40,
                "over_length": 0.3,
                "invalid": 0.2,
            }
        }
    )
    result = get_spec("werewolf_outcome@1").score(traj, cfg)
    assert result.turns[0].components == pytest.approx({"format_penalty": -0.05, "length_penalty": -0.3})
    assert result.turns[1].components == pytest.approx({"format_penalty": -0.1, "length_penalty": -0.3})
    assert result.turns[6].components == pytest.approx({"format_penalty": -0.1, "invalid_penalty": -0.2})
    assert_invariant(result)


def test_prediction_token_f1_and_outcome_zero(ww: WW) -> None:
    """The bonus is additive: it shows up even when every outcome is worth 0."""
    cfg = SpecConfig.model_validate(
        {"outcome": {"win": 0, "loss": 0}, "prediction": {"weight": 1.0, "metric": "token_f1"}}
    )
    result = get_spec("werewolf_outcome@1").score(ww(), cfg)
    # tokens: [seat, 0, is, a, werewolf] vs [seat, 0, is, a, wolf]: 4 common, P = R = 4/5.
    assert result.turns[2].components == {"prediction": pytest.approx(0.8)}
    assert result.seat_reward(2) == pytest.approx(0.8)


def test_prediction_field_wins_and_reprompts_are_skipped(ww: WW) -> None:
    traj = ww()
    traj.turns[2].prediction = NEXT = "Seat 0 is a wolf."
    traj.turns.insert(3, trajectory_pb2.Turn(index=3, seat=2, attempt=1, observation_text="retry"))
    result = get_spec("werewolf_shaped@1").score(traj)
    assert traj.turns[6].observation_text == NEXT
    assert result.turns[2].components == {"prediction": pytest.approx(0.2)}  # exact match, ratio 1


def test_prediction_without_next_turn_gets_nothing(ww: WW) -> None:
    traj = ww()
    traj.turns[9].response_text = "<predict_next>game over</predict_next> vote 1"
    result = get_spec("werewolf_shaped@1").score(traj)
    assert "prediction" not in result.turns[9].components


def test_to_response_fills_trajectory(ww: WW) -> None:
    traj = ww()
    resp = to_response(traj, get_spec("werewolf_shaped@1").score(traj))
    assert resp.spec == resp.trajectory.reward_spec == "werewolf_shaped@1"
    assert [t.turn_index for t in resp.turn_rewards] == list(range(10))
    assert resp.trajectory.turns[6].reward == pytest.approx(-0.1)
    for turn, scored in zip(resp.trajectory.turns, resp.turn_rewards, strict=True):
        assert dict(turn.reward_components) == pytest.approx(dict(scored.components))
        assert sum(turn.reward_components.values()) == pytest.approx(turn.reward, abs=1e-6)
    assert dict(resp.trajectory.turns[6].reward_components)  # the penalised turn names its component
    assert {o.seat: round(o.final_reward, 5) for o in resp.trajectory.outcomes}[4] == -1.1
    seat2 = next(s for s in resp.seat_rewards if s.seat == 2)
    assert seat2.reward == pytest.approx(-1 + 0.2 * RATIO)
    assert dict(seat2.components) == pytest.approx({"outcome": -1, "prediction": 0.2 * RATIO})
    assert traj.reward_spec == ""  # the input is not mutated


# --- registry, defaults, bad input ------------------------------------------------------------------------


def test_registry_and_defaults() -> None:
    assert {"werewolf_outcome@1", "werewolf_shaped@1", "scenario_verified@1", "scenario_shaped@1"} <= set(
        SPECS
    )
    assert resolve_spec("", "werewolf_v1").key == "werewolf_shaped@1"
    assert resolve_spec("", "bargaining_v1").key == "scenario_shaped@1"
    assert DEFAULT_SPECS["prisoners_dilemma_v1"] == "scenario_shaped@1"
    with pytest.raises(ScoreError, match=r"unknown reward spec 'nope@1'; valid: .*werewolf_outcome@1"):
        get_spec("nope@1")
    with pytest.raises(ScoreError, match="no default reward spec for game 'chess'"):
        resolve_spec("", "chess")


def test_bad_trajectories(ww: WW) -> None:
    spec = get_spec("werewolf_outcome@1")
    with pytest.raises(ScoreError, match="no turns"):
        spec.score(trajectory_pb2.Trajectory(game=common_pb2.GameRef(game_id="werewolf_v1")))
    traj = ww()
    traj.turns[3].seat = 9
    with pytest.raises(ScoreError, match="turn 3 is by seat 9"):
        spec.score(traj)
    traj = ww()
    del traj.outcomes[:]
    with pytest.raises(ScoreError, match="no outcomes"):
        spec.score(traj)
    traj = ww()
    traj.outcomes.add(seat=0)
    with pytest.raises(ScoreError, match="twice"):
        spec.score(traj)
    traj = ww()
    del traj.seats[5]
    with pytest.raises(ScoreError, match=r"not in trajectory\.seats"):
        spec.score(traj)
    traj = ww()
    traj.game.game_id = "bargaining_v1"
    with pytest.raises(ScoreError, match="not game 'bargaining_v1'"):
        spec.score(traj)


def test_load_specs_from_dict_and_yaml(ww: WW, tmp_path: object) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    (added,) = load_specs(
        {
            "specs": [
                {
                    "name": "test_wolfbonus",
                    "version": 1,
                    "base": "werewolf_outcome@1",
                    "config": {"outcome": {"team_win": {"wolves": 2.0}}, "credit": {"mode": "uniform"}},
                }
            ]
        }
    )
    assert get_spec("test_wolfbonus@1") is added and added.game_ids == ("werewolf_v1",)
    result = added.score(ww())
    assert result.spec == "test_wolfbonus@1"
    assert result.seat_reward(0) == 4.0  # 2 turns x 2.0 (uniform)
    path = tmp_path / "specs.yaml"
    path.write_text("specs:\n  - {name: test_yaml, version: 2, base: scenario_verified, config: {}}\n")
    assert [s.key for s in load_specs(path)] == ["test_yaml@2"]
    with pytest.raises(ValueError, match="already registered"):
        load_specs(path)
    with pytest.raises(ValueError, match="gama"):
        load_specs({"specs": [{"name": "t_bad", "version": 1, "base": "werewolf_outcome@1",
                               "config": {"credit": {"gama": 0.9}}}]})  # fmt: skip


# --- property: the invariant holds for any mix of turns, flags and configs ---------------------------------


@settings(max_examples=60, deadline=None)
@given(
    seats=st.lists(st.integers(0, 3), min_size=1, max_size=12),
    flags=st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), min_size=12, max_size=12),
    mode=st.sampled_from(["terminal", "uniform", "discounted"]),
    gamma=st.floats(0.1, 1.0),
)
def test_invariant_property(
    seats: list[int], flags: list[tuple[bool, bool, bool]], mode: str, gamma: float
) -> None:
    traj = trajectory_pb2.Trajectory(game=common_pb2.GameRef(game_id="werewolf_v1"), winner="village")
    for i, seat in enumerate(seats):
        valid, defaulted, predicts = flags[i]
        text = "<predict_next>you die</predict_next>" if predicts else "ok"
        traj.turns.add(index=i, seat=seat, valid=valid, defaulted=defaulted, response_text=text,
                       observation_text=f"you die at night {i}")  # fmt: skip
    for seat in range(4):
        traj.outcomes.add(seat=seat, role="werewolf" if seat == 0 else "seer")
    cfg = get_spec("werewolf_shaped@1").config.merged(
        {
            "credit": {"mode": mode, "gamma": gamma},
            "penalties": {"required_tags": ["think"], "missing_tag": 0.1},
        }
    )
    result = get_spec("werewolf_shaped@1").score(traj, cfg)
    assert_invariant(result)
    resp = to_response(traj, result)
    for tr in resp.turn_rewards:
        assert tr.reward == pytest.approx(math.fsum(tr.components.values()), abs=1e-5)


@pytest.mark.parametrize(
    ("tokens", "chars", "penalized"),
    [(1024, 6000, False), (1025, 10, True), (10, 6001, True)],
)
def test_shaped_length_limits_are_the_documented_ones(
    ww: WW, tokens: int, chars: int, penalized: bool
) -> None:
    """The reward README's table: werewolf_shaped@1 takes 0.1 off a response over 1024 tokens or over
    6000 characters, and nothing at the limits themselves."""
    traj = ww()
    traj.turns[0].response_text = "x" * chars
    del traj.turns[0].response_token_ids[:]
    traj.turns[0].response_token_ids.extend([7] * tokens)
    components = get_spec("werewolf_shaped@1").score(traj).turns[0].components
    assert components.get("length_penalty", 0.0) == pytest.approx(-0.1 if penalized else 0.0)


def test_spec_versions_start_at_one() -> None:
    from wolfpack_rewards.specs import RewardSpec, add_spec

    with pytest.raises(ValueError, match="bad spec name/version"):
        add_spec(RewardSpec("fresh_spec", 0, "", ("werewolf_v1",), SpecConfig(), lambda t, c: None))  # type: ignore[arg-type,return-value]
    assert "fresh_spec@0" not in SPECS
