"""``RolloutSummary``: what a batch of rollouts did, from the trajectories themselves (pure).

Win rates are per trainee seat (a seat that won counts 1, a draw 0.5), grouped by the seat's role and by
the opponent kind the curriculum chose; invalid and defaulted moves count trainee turns only.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_curriculum.client import trainee_seats

_SCORE = {
    common_pb2.OUTCOME_KIND_WIN: 1.0,
    common_pb2.OUTCOME_KIND_DRAW: 0.5,
    common_pb2.OUTCOME_KIND_LOSS: 0.0,
}


class _Counters(Protocol):
    @property
    def generated_tokens(self) -> int: ...
    @property
    def truncated_responses(self) -> int: ...
    @property
    def compressed_prompts(self) -> int: ...
    @property
    def backpressure_wait_s(self) -> float: ...
    @property
    def stale_acts(self) -> int: ...


@dataclass(frozen=True)
class EpisodeFailure:
    """One failed episode as the driver counted it: the reason it is counted under, what went wrong in
    words (the status message, the exception), and which task it was (``bucket seed N``), so a failure
    can be reproduced and not only counted."""

    number: int
    """1-based count of this failure in the driver's life (the CLI prints the ones it has not printed)."""
    reason: str
    detail: str = ""
    where: str = ""


@dataclass
class RolloutSummary:
    """Totals of one ``run``/``play``: counts, rates by role and opponent kind, failures by reason."""

    episodes: int = 0
    failed: int = 0
    turns: int = 0
    trainee_turns: int = 0
    invalid_moves: int = 0
    defaulted_moves: int = 0
    truncated_episodes: int = 0
    truncated_responses: int = 0
    compressed_prompts: int = 0
    generated_tokens: int = 0
    elapsed_s: float = 0.0
    backpressure_wait_s: float = 0.0
    mean_trainee_reward: float = 0.0
    win_rate_by_role: dict[str, tuple[float, int]] = field(default_factory=dict)
    win_rate_by_opponent: dict[str, tuple[float, int]] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    failure_details: dict[str, str] = field(default_factory=dict)
    """Per failure reason, the detail of its first failed episode (``where: detail``)."""
    late_answers: int = 0
    """Answers that came after the environment's turn timeout had applied its default: the driver records
    those turns defaulted (so they are among ``defaulted_moves`` too). Only the driver's counters tell them
    apart; a summary of trajectories alone reports 0."""
    interrupted: int = 0
    """Episodes started but neither delivered nor failed when the run was stopped (Ctrl-C)."""

    @property
    def episodes_per_min(self) -> float:
        return 60.0 * self.episodes / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "episodes_per_min": self.episodes_per_min, "tokens_per_s": self.tokens_per_s}


def _trainee_seats(traj: trajectory_pb2.Trajectory) -> set[int]:
    return set(trainee_seats(traj))


def summarize(
    trajectories: Sequence[trajectory_pb2.Trajectory],
    failures: Mapping[str, int],
    elapsed_s: float,
    counters: _Counters | None = None,
    failure_examples: Iterable[EpisodeFailure] = (),
) -> RolloutSummary:
    """Totals of ``trajectories`` (the delivered ones) and ``failures`` (count by reason);
    ``failure_examples`` give each reason its first detail; ``counters`` are the driver's (else what the
    trajectories tell)."""
    s = RolloutSummary(episodes=len(trajectories), failed=sum(failures.values()), elapsed_s=elapsed_s)
    s.failures = dict(sorted(failures.items()))
    for f in failure_examples:
        if f.reason in s.failures and f.reason not in s.failure_details:
            s.failure_details[f.reason] = ": ".join(x for x in (f.where, f.detail) if x)
    by_role: dict[str, list[float]] = defaultdict(list)
    by_opp: dict[str, list[float]] = defaultdict(list)
    rewards: list[float] = []
    truncated: Counter[str] = Counter()
    for traj in trajectories:
        seats = _trainee_seats(traj)
        s.turns += len(traj.turns)
        if traj.metadata.get("truncated"):
            truncated[traj.metadata["truncated"]] += 1
        for t in traj.turns:
            if t.seat in seats:
                s.trainee_turns += 1
                s.invalid_moves += int(not t.valid and not t.defaulted)
                s.defaulted_moves += int(t.defaulted)
        opp = traj.metadata.get("opponent_kind", "").removeprefix("OPPONENT_KIND_").lower() or "unknown"
        for o in traj.outcomes:
            if o.seat not in seats:
                continue
            rewards.append(o.final_reward)
            if o.outcome in _SCORE:
                by_role[o.role or "?"].append(_SCORE[o.outcome])
                by_opp[opp].append(_SCORE[o.outcome])
    s.truncated_episodes = sum(truncated.values())
    s.mean_trainee_reward = sum(rewards) / len(rewards) if rewards else 0.0
    s.win_rate_by_role = {k: (sum(v) / len(v), len(v)) for k, v in sorted(by_role.items())}
    s.win_rate_by_opponent = {k: (sum(v) / len(v), len(v)) for k, v in sorted(by_opp.items())}
    if counters is not None:
        s.generated_tokens = counters.generated_tokens
        s.truncated_responses = counters.truncated_responses
        s.compressed_prompts = counters.compressed_prompts
        s.backpressure_wait_s = counters.backpressure_wait_s
        s.late_answers = counters.stale_acts
    else:  # what the trajectories themselves tell (compressed prompts are not recorded per turn)
        policy_turns = [t for tr in trajectories for t in tr.turns if t.response_token_ids]
        s.generated_tokens = sum(len(t.response_token_ids) for t in policy_turns)
        s.truncated_responses = sum(t.finish_reason == common_pb2.FINISH_REASON_LENGTH for t in policy_turns)
    return s
