"""``werewolf_role@1``: the per-turn decision rewards (roles.py), each rule firing and not firing on
hand-built turns, added to exactly what ``werewolf_shaped@1`` gives; and a real seeded 6-player game,
played by the heuristic bots through the session rules, scored without error with a role reward on every
vote the policy seats' own answers made."""

from __future__ import annotations

import math
import random

import pytest

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_games import get_game
from wolfpack_games.session import SeatPlan, Session, start_session
from wolfpack_games.session_proto import action_to_pb, episode_state_pb
from wolfpack_games.werewolf.models import team_of
from wolfpack_rewards import examples
from wolfpack_rewards.config import SpecConfig
from wolfpack_rewards.result import ScoreResult
from wolfpack_rewards.specs import get_spec

W = 0.2
# examples.ROLES: seats 0 (werewolf) and 1 (wolf_king) are wolves; 2 seer, 3 witch, 4-5 villagers.
# (seat, kind, target, extra turn fields, expected role components)
CASES: list[tuple[int, str, int | None, dict[str, bool], dict[str, float]]] = [
    (4, "vote", 0, {}, {"role_vote": W}),  # village votes a wolf
    (5, "vote", 4, {}, {"role_vote": -W}),  # village votes a villager
    (0, "vote", 4, {}, {"role_vote": W}),  # wolf votes a village seat (mirror)
    (1, "vote", 0, {}, {"role_vote": -W}),  # wolf votes a fellow wolf
    (2, "inspect", 1, {}, {"role_inspect": W}),  # seer inspects the wolf king
    (2, "inspect", 4, {}, {}),  # a "good" result is no mistake
    (3, "poison", 0, {}, {"role_poison": W}),
    (3, "poison", 5, {}, {"role_poison": -W}),
    (3, "save", 4, {}, {"role_save": W}),  # the wolves' victim, a villager
    (3, "save", 1, {}, {"role_save": -W}),  # the wolves knifed their own king; saving him helps them
    (1, "shoot", 2, {}, {"role_shoot": W}),  # wolf king takes the seer
    (1, "shoot", 0, {}, {"role_shoot": -W}),
    (4, "vote", 0, {"valid": False, "defaulted": True}, {}),  # the engine's default, not the policy's
    (4, "vote", 0, {"valid": False}, {}),  # a rejected attempt (re-prompted)
    (5, "vote", 9, {}, {}),  # a target with no known team
    (5, "pass", None, {}, {}),
    (4, "speak", None, {}, {}),
    (3, "protect", 4, {}, {}),  # guard protections are not rewarded (not derivable)
    (0, "kill", 4, {}, {}),  # wolf kill votes are not rewarded
]


def hand_built(winner: str = "village") -> trajectory_pb2.Trajectory:
    traj = examples.werewolf_trajectory(winner)
    del traj.turns[:]
    for i, (seat, kind, target, extra, _) in enumerate(CASES):
        turn = examples.make_turn(i, seat, phase="day_vote", **extra)
        turn.action.kind = kind
        if target is not None:
            turn.action.target = target
        traj.turns.append(turn)
    return traj


def assert_invariant(result: ScoreResult) -> None:
    for seat in result.seats:
        turn_sum = math.fsum(t.reward for t in result.turns if t.seat == seat)
        assert result.seat_reward(seat) == pytest.approx(
            turn_sum + math.fsum(result.seats[seat].terminal.values())
        )
        assert math.fsum(result.seat_components(seat).values()) == pytest.approx(result.seat_reward(seat))


@pytest.mark.parametrize("winner", ["village", "wolves"])
def test_each_rule_fires_and_does_not_fire_on_top_of_werewolf_shaped(winner: str) -> None:
    traj = hand_built(winner)
    role = get_spec("werewolf_role@1").score(traj)
    shaped = get_spec("werewolf_shaped@1").score(traj)
    assert role.spec == "werewolf_role@1"
    for turn_role, turn_shaped, (*_, expected) in zip(role.turns, shaped.turns, CASES, strict=True):
        roles_only = {k: v for k, v in turn_role.components.items() if k.startswith("role_")}
        assert roles_only == pytest.approx(expected)
        rest = {k: v for k, v in turn_role.components.items() if not k.startswith("role_")}
        assert rest == turn_shaped.components  # additive: shaped's outcome and penalties untouched
    # the outcome is still there, on each seat's last turn, and the penalty on the two invalid turns
    assert sum(1 for t in role.turns if "outcome" in t.components) == 6
    assert [t.index for t in role.turns if "invalid_penalty" in t.components] == [12, 13]
    assert_invariant(role)


def test_outcome_dominates_a_seats_role_rewards_at_the_default_weight() -> None:
    """Seat 4 (villager) votes the right wolf in a lost game: its total stays negative."""
    result = get_spec("werewolf_role@1").score(hand_built("wolves"))
    assert result.seat_components(4) == pytest.approx(
        {"outcome": -1.0, "role_vote": W, "invalid_penalty": -0.2}
    )
    assert result.seat_reward(4) == pytest.approx(-1.0)


def test_worked_example_without_actions_scores_as_werewolf_shaped(ww) -> None:  # type: ignore[no-untyped-def]
    role = get_spec("werewolf_role@1").score(ww())
    shaped = get_spec("werewolf_shaped@1").score(ww())
    assert [t.components for t in role.turns] == [t.components for t in shaped.turns]


def test_weights_are_configurable_and_validated() -> None:
    spec = get_spec("werewolf_role@1")
    assert spec.config.roles.vote == W and get_spec("werewolf_shaped@1").config.roles.vote == 0.0
    cfg = spec.config.merged({"roles": {"vote": 0.5, "inspect": 0.0}})
    result = spec.score(hand_built(), cfg)
    assert result.turns[0].components["role_vote"] == pytest.approx(0.5)
    assert "role_inspect" not in result.turns[4].components
    with pytest.raises(ValueError, match="greater than or equal"):
        spec.config.merged({"roles": {"vote": -0.1}})
    with pytest.raises(ValueError, match="Extra inputs"):
        spec.config.merged({"roles": {"guard": 0.1}})
    assert SpecConfig().roles.model_dump() == dict.fromkeys(
        ("vote", "inspect", "poison", "save", "shoot"), 0.0
    )


def play_6p(seed: int) -> trajectory_pb2.Trajectory:
    """A real 6p game: every seat played through the session rules (as the environment service plays
    them), each answer chosen by the heuristic bot, recorded as the rollout records a policy turn (the
    applied action, phase and round of the observation), outcomes from the service's episode state."""
    ep = start_session(
        Session, episode_id=f"e{seed}", game_id="werewolf_v1", variant="6p", seed=seed,
        seats={s: SeatPlan("policy") for s in range(6)},
    )  # fmt: skip
    bot = get_game("werewolf_v1").bots["heuristic"]
    rng = random.Random(seed)
    traj = trajectory_pb2.Trajectory(
        trajectory_id=f"real-{seed}", game=common_pb2.GameRef(game_id="werewolf_v1", variant="6p"), seed=seed
    )
    ep.advance()
    while not ep.done:
        seat = min(ep.open_turns)
        obs = ep.env.observe(seat)
        applied = ep.apply(seat, bot(ep.env, seat, rng))
        turn = examples.make_turn(len(traj.turns), seat, phase=obs.phase, round=obs.round)
        turn.valid, turn.defaulted = applied.accepted, applied.defaulted
        turn.action.CopyFrom(action_to_pb(applied.action))
        traj.turns.append(turn)
        ep.advance()
    state = episode_state_pb(ep, None)
    traj.winner = state.winner
    for s in state.seats:
        traj.seats.add(seat=s.seat, controller=common_pb2.SEAT_CONTROLLER_POLICY)
        traj.outcomes.add(seat=s.seat, role=s.role, team=team_of(s.role), outcome=s.outcome, alive=s.alive)
    return traj


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_real_seeded_6p_game_gets_a_role_reward_on_every_vote(seed: int) -> None:
    traj = play_6p(seed)
    assert traj.winner in ("village", "wolves")
    result = get_spec("werewolf_role@1").score(traj)
    assert_invariant(result)
    teams = {o.seat: o.team for o in traj.outcomes}
    votes = [
        (t, s)
        for t, s in zip(traj.turns, result.turns, strict=True)
        if t.action.kind == "vote" and t.action.HasField("target")
    ]
    assert votes, "a 6p game always has a day vote"
    for turn, scored in votes:
        right = teams[turn.action.target] != teams[turn.seat]
        assert scored.components["role_vote"] == pytest.approx(W if right else -W)
    inspects = [s for t, s in zip(traj.turns, result.turns, strict=True) if t.action.kind == "inspect"]
    assert inspects and all(set(s.components) <= {"role_inspect", "outcome"} for s in inspects)
    # every seat got its +-1 outcome; the role rewards did not replace it
    for seat, score in result.seats.items():
        assert result.seat_components(seat)["outcome"] == (1.0 if score.team == traj.winner else -1.0)
