"""Run metrics: one row per update to JSONL, CSV and TensorBoard; a PNG of reward and win rate vs step;
episode statistics with 95% confidence intervals for the ``learning:`` line.

Names are namespaced like CleanRL/verl: ``charts/…`` (episode outcomes, also ``charts/<policy>/<role>/…``),
``actor/…`` (losses, clip fraction, KL, entropy, grad norm), ``mismatch/…`` (rollout vs learner logprobs),
``perf/…`` (tokens/s), ``staleness/…``, ``eval/…``.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wolfpack.v1 import common_pb2, trajectory_pb2


@dataclass(frozen=True)
class Estimate:
    """A mean with its 95% confidence interval over ``n`` episodes."""

    mean: float
    lo: float
    hi: float
    n: int


def mean_ci(values: Sequence[float]) -> Estimate:
    """Normal-approximation 95% CI of the mean (t quantile for small n would widen it by < 3% at n=32)."""
    n = len(values)
    if n == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    m = statistics.fmean(values)
    if n < 2:
        return Estimate(m, m, m, n)
    half = 1.96 * statistics.stdev(values) / math.sqrt(n)
    return Estimate(m, m - half, m + half, n)


def wilson_ci(successes: int, n: int) -> Estimate:
    """Wilson score 95% interval of a rate: sensible at 0% and 100%, unlike the normal approximation."""
    if n == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    z = 1.96
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n)


def seat_results(
    trajectories: Iterable[trajectory_pb2.Trajectory], policies: Sequence[str] = ()
) -> list[tuple[str, str, float, bool]]:
    """(policy, role, final reward, won) for every trainee seat of every trajectory."""
    out = []
    for traj in trajectories:
        bound = {b.seat: b.policy.policy_id for b in traj.seats if b.policy.policy_id}
        for o in traj.outcomes:
            policy = bound.get(o.seat, "")
            if not policy or (policies and policy not in policies):
                continue
            out.append((policy, o.role, float(o.final_reward), o.outcome == common_pb2.OUTCOME_KIND_WIN))
    return out


def episode_metrics(
    trajectories: Sequence[trajectory_pb2.Trajectory], prefix: str = "charts"
) -> dict[str, float]:
    """Mean reward and win rate overall and per policy/role, plus invalid-turn rate."""
    rows = seat_results(trajectories)
    out: dict[str, float] = {}
    if not rows:
        return out
    out[f"{prefix}/reward_mean"] = statistics.fmean(r[2] for r in rows)
    out[f"{prefix}/win_rate"] = statistics.fmean(float(r[3]) for r in rows)
    groups: dict[tuple[str, str], list[tuple[str, str, float, bool]]] = defaultdict(list)
    for r in rows:
        groups[(r[0], r[1])].append(r)
    for (policy, role), rs in groups.items():
        out[f"{prefix}/{policy}/{role}/reward_mean"] = statistics.fmean(r[2] for r in rs)
        out[f"{prefix}/{policy}/{role}/win_rate"] = statistics.fmean(float(r[3]) for r in rs)
    turns = [t for tr in trajectories for t in tr.turns if t.response_token_ids]
    if turns:
        out[f"{prefix}/invalid_rate"] = sum(not t.valid for t in turns) / len(turns)
        out[f"{prefix}/response_tokens_mean"] = statistics.fmean(len(t.response_token_ids) for t in turns)
    return out


class MetricsWriter:
    """Appends rows to ``metrics.jsonl`` (resumable: rows of a resumed step overwrite on read), TensorBoard
    events under ``tb/`` and, on ``close``, ``metrics.csv`` and ``curves.png``."""

    def __init__(self, run_dir: Path, tensorboard: bool = True) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = run_dir / "metrics.jsonl"
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(run_dir / "tb"))
            except ImportError:  # tensorboard is in the trainer extra; without it, JSONL/CSV only
                self._tb = None

    def log(self, step: int, values: Mapping[str, float]) -> None:
        row = {"step": step, **{k: float(v) for k, v in values.items()}}
        with self.jsonl.open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        if self._tb is not None:
            for k, v in values.items():
                if math.isfinite(float(v)):
                    self._tb.add_scalar(k, float(v), step)
            self._tb.flush()

    def rows(self) -> list[dict[str, float]]:
        """Rows by step, the last written row of a step winning (a resumed run rewrites its last step)."""
        if not self.jsonl.exists():
            return []
        merged: dict[int, dict[str, float]] = {}
        for line in self.jsonl.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                merged.setdefault(int(row["step"]), {}).update(row)
        return [merged[k] for k in sorted(merged)]

    def write_csv(self) -> Path:
        rows = self.rows()
        keys = sorted({k for r in rows for k in r} - {"step"})
        path = self.run_dir / "metrics.csv"
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", *keys])
            for r in rows:
                w.writerow([int(r["step"]), *(r.get(k, "") for k in keys)])
        return path

    def plot(self) -> Path:
        """Reward and win rate vs step: training episodes as lines, held-out evaluations as points."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.rows()
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, key, title in ((axes[0], "reward_mean", "mean reward"), (axes[1], "win_rate", "win rate")):
            train = [(r["step"], r[f"charts/{key}"]) for r in rows if f"charts/{key}" in r]
            ev = [(r["step"], r[f"eval/{key}"]) for r in rows if f"eval/{key}" in r]
            if train:
                ax.plot(*zip(*train, strict=True), label="training episodes", alpha=0.7)
            if ev:
                ax.plot(*zip(*ev, strict=True), "o-", label="held-out eval")
            ax.set_xlabel("update")
            ax.set_title(title)
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        path = self.run_dir / "curves.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
