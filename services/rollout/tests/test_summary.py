"""``summarize`` on hand-made trajectories: every number below is counted by hand from the inputs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack.v1 import curriculum_service_pb2 as cur_pb
from wolfpack_rollout.summary import EpisodeFailure, RolloutSummary, summarize

WIN, LOSS, DRAW, ABORTED = (
    common_pb2.OUTCOME_KIND_WIN,
    common_pb2.OUTCOME_KIND_LOSS,
    common_pb2.OUTCOME_KIND_DRAW,
    common_pb2.OUTCOME_KIND_ABORTED,
)
LENGTH, STOP = common_pb2.FINISH_REASON_LENGTH, common_pb2.FINISH_REASON_STOP


@dataclass
class Counters:
    generated_tokens: int = 0
    truncated_responses: int = 0
    compressed_prompts: int = 0
    backpressure_wait_s: float = 0.0
    stale_acts: int = 0


def traj(
    trainee: int,
    outcomes: dict[int, tuple[str, int, float]],
    turns: list[tuple[int, int, bool, bool, int]],
    truncated: str = "",
    opponent: int = cur_pb.OPPONENT_KIND_SCRIPTED,
) -> trajectory_pb2.Trajectory:
    """``outcomes``: seat -> (role, outcome, final reward); ``turns``: (seat, tokens, valid, defaulted,
    finish reason)."""
    t = trajectory_pb2.Trajectory(trainee_seats=[trainee])
    for seat, (role, outcome, reward) in outcomes.items():
        t.outcomes.add(seat=seat, role=role, outcome=outcome, final_reward=reward)  # type: ignore[arg-type]
    for seat, n, valid, defaulted, finish in turns:
        t.turns.add(seat=seat, response_token_ids=list(range(n)), valid=valid, defaulted=defaulted,
                    finish_reason=finish)  # type: ignore[arg-type]  # fmt: skip
    t.metadata["opponent_kind"] = cur_pb.OpponentKind.Name(opponent)
    if truncated:
        t.metadata["truncated"] = truncated
    return t


def test_an_empty_summary_reports_nothing() -> None:
    for s in (RolloutSummary(), summarize([], {}, 0.0)):
        counts = {k: v for k, v in s.as_dict().items() if isinstance(v, int | float)}
        assert set(counts.values()) == {0}, counts
        assert (s.episodes_per_min, s.tokens_per_s) == (0.0, 0.0), "no time elapsed: no rate"
        assert s.win_rate_by_role == {} and s.win_rate_by_opponent == {} and s.failures == {}


def test_counts_rates_and_rewards_by_hand() -> None:
    a = traj(
        0, {0: ("seer", WIN, 1.0), 1: ("werewolf", LOSS, -1.0)},
        [(0, 5, True, False, STOP), (1, 7, True, False, STOP), (0, 8, False, False, LENGTH),
         (0, 2, False, True, STOP)],
    )  # fmt: skip
    b = traj(
        0, {0: ("seer", DRAW, 0.0), 1: ("werewolf", DRAW, 0.0)}, [(0, 3, True, False, LENGTH)],
        opponent=cur_pb.OPPONENT_KIND_SELF,
    )  # fmt: skip
    c = traj(0, {0: ("villager", ABORTED, -0.5)}, [(0, 4, True, False, STOP)], truncated="turn_cap")
    s = summarize([a, b, c], {"reward_unavailable": 2, "context_overflow": 1}, 30.0)
    assert (s.episodes, s.failed, s.turns, s.trainee_turns) == (3, 3, 6, 5)
    assert (s.invalid_moves, s.defaulted_moves, s.truncated_episodes) == (1, 1, 1)
    assert s.failures == {"context_overflow": 1, "reward_unavailable": 2}
    # trainee seat 0 only: a win (1), a draw (0.5); the aborted episode has no score but a reward
    assert s.win_rate_by_role == {"seer": (0.75, 2)}
    assert s.win_rate_by_opponent == {"scripted": (1.0, 1), "self": (0.5, 1)}
    assert s.mean_trainee_reward == pytest.approx((1.0 + 0.0 - 0.5) / 3)
    # without the driver's counters: read from the turns (5+7+8+2+3+4 tokens; 2 cut at max_tokens)
    assert (s.generated_tokens, s.truncated_responses, s.compressed_prompts) == (29, 2, 0)
    assert s.episodes_per_min == pytest.approx(6.0) and s.tokens_per_s == pytest.approx(29 / 30)
    assert s.as_dict()["tokens_per_s"] == pytest.approx(29 / 30)


@pytest.mark.parametrize(
    ("elapsed", "per_s", "per_min"), [(30.0, 4.0, 4.0), (0.5, 240.0, 240.0), (0.0, 0.0, 0.0)]
)
def test_rates_use_the_driver_counters_when_given(elapsed: float, per_s: float, per_min: float) -> None:
    two = [traj(0, {0: ("seer", WIN, 1.0)}, [(0, 1, True, False, STOP)]) for _ in range(2)]
    s = summarize(two, {}, elapsed, Counters(120, 3, 4, 1.5, 2))
    assert (s.generated_tokens, s.truncated_responses, s.compressed_prompts) == (120, 3, 4)
    assert s.late_answers == 2 and summarize(two, {}, elapsed).late_answers == 0
    assert s.backpressure_wait_s == 1.5
    assert s.tokens_per_s == pytest.approx(per_s) and s.episodes_per_min == pytest.approx(per_min)


def test_each_reason_keeps_its_first_failure_detail_and_where() -> None:
    examples = [
        EpisodeFailure(1, "no_turns", "the episode ended before any policy seat acted", "werewolf_v1/6p seed 15"),
        EpisodeFailure(2, "inference_unavailable", "DEADLINE_EXCEEDED: Deadline Exceeded", "bargaining_v1/easy seed 3"),
        EpisodeFailure(3, "no_turns", "a later one", "werewolf_v1/6p seed 16"),
        EpisodeFailure(4, "context_overflow", "", ""),
        EpisodeFailure(5, "not_counted", "an example whose reason is not in the counts is ignored", "x"),
    ]  # fmt: skip
    failures = {"no_turns": 2, "inference_unavailable": 1, "context_overflow": 1}
    s = summarize([], failures, 10.0, failure_examples=examples)
    assert s.failed == 4 and s.interrupted == 0
    assert s.failure_details == {
        "no_turns": "werewolf_v1/6p seed 15: the episode ended before any policy seat acted",
        "inference_unavailable": "bargaining_v1/easy seed 3: DEADLINE_EXCEEDED: Deadline Exceeded",
        "context_overflow": "",
    }
    assert summarize([], failures, 10.0).failure_details == {}, "no examples given: counts only"
