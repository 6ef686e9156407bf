"""Run metrics: one row per update to JSONL, CSV and TensorBoard; a PNG of reward and win rate (held-out
evaluations with their 95% CIs), loss, KL and entropy vs update; sample transcripts as TensorBoard text;
the console's one line per update; episode statistics with 95% confidence intervals for the ``learning:``
line. Optional extra trackers (W&B, MLflow, ...) through verl's ``Tracking``: see ``MetricsWriter``.

Names are namespaced like CleanRL/verl: ``charts/…`` (episode outcomes, also ``charts/<policy>/<role>/…``),
``actor/…`` (losses, clip fraction, KL, entropy, grad norm), ``mismatch/…`` (rollout vs learner logprobs),
``perf/…`` (tokens/s), ``staleness/…``, ``eval/…``, ``answers/<policy>/…`` and ``eval_answers/…`` (what the
answers parsed to, ``answer_metrics``).
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


def answer_metrics(
    trajectories: Iterable[trajectory_pb2.Trajectory], prefix: str = "answers"
) -> dict[str, float]:
    """What each policy's answers were, by the action each parsed to: ``<prefix>/<policy>/<kind>/share`` (of
    the policy's answered turns; kind ``invalid`` for answers the rules refused), ``.../token_share`` (of its
    answer tokens), and the mean of every turn-level reward component over the policy's turns that carry it,
    ``<prefix>/<policy>/component/<name>``.

    Why: a win rate says that a policy changed, not which of its decisions did. The 12p villagers' GRPO runs
    went down five times (s25-s27) with nothing in their metrics to say whether their votes got worse (the
    ``role_vote`` component: +-0.2 by the target's team) or their speeches took more of their tokens; what was
    found came from the few kept episodes (``bench/results/2026-11-28-h200x4-hold-s27.md``)."""
    turns: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    tokens: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    components: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for traj in trajectories:
        for t in traj.turns:
            policy = t.policy.policy_id
            if not policy or not t.response_token_ids:
                continue
            kind = (t.action.kind or "none") if t.valid else "invalid"
            turns[policy][kind] += 1
            tokens[policy][kind] += len(t.response_token_ids)
            for name, value in t.reward_components.items():
                components[policy][name].append(float(value))
    out: dict[str, float] = {}
    for policy, by_kind in turns.items():
        n, ntok = sum(by_kind.values()), sum(tokens[policy].values())
        for kind, count in by_kind.items():
            out[f"{prefix}/{policy}/{kind}/share"] = count / n
            out[f"{prefix}/{policy}/{kind}/token_share"] = tokens[policy][kind] / ntok if ntok else 0.0
        for name, values in components[policy].items():
            out[f"{prefix}/{policy}/component/{name}"] = statistics.fmean(values)
    return out


def episode_time_split(trajectories: Sequence[trajectory_pb2.Trajectory]) -> dict[str, float]:
    """Where an episode's time went, mean seconds per episode over those the driver timed
    (``Trajectory.started_at`` set): ``perf/episode_s`` from the driver beginning it to its end,
    ``perf/episode_generate_s`` the part it waited for its policies' answers (the union of its turns'
    ``[started_at, started_at + generate_ms]``: seats answering together count once),
    ``perf/episode_env_s`` the rest of that span (environment, scripted bots, the driver's own work) and
    ``perf/episode_score_s`` the reward service's scoring after it ended. Episodes run concurrently, so these
    say what one episode waits on, not how the collection's wall time divides."""
    timed = [t for t in trajectories if t.HasField("started_at") and t.HasField("finished_at")]
    if not timed:
        return {}
    spans, generate, score = [], [], []
    for traj in timed:
        begin, end = traj.started_at.ToNanoseconds() / 1e9, traj.finished_at.ToNanoseconds() / 1e9
        spans.append(max(0.0, end - begin))
        calls = sorted(
            (t.started_at.ToNanoseconds() / 1e9, t.started_at.ToNanoseconds() / 1e9 + t.generate_ms / 1e3)
            for t in traj.turns
            if t.generate_ms > 0 and t.HasField("started_at")
        )
        waited, reach = 0.0, float("-inf")
        for lo, hi in calls:  # the union of the intervals, in start order
            waited += max(0.0, hi - max(lo, reach))
            reach = max(reach, hi)
        generate.append(waited)
        score.append(traj.score_ms / 1e3)
    out = {
        "perf/episode_s": statistics.fmean(spans),
        "perf/episode_generate_s": statistics.fmean(generate),
        "perf/episode_score_s": statistics.fmean(score),
    }
    out["perf/episode_env_s"] = max(0.0, out["perf/episode_s"] - out["perf/episode_generate_s"])
    return out


def _median_of(rows: Sequence[Mapping[str, float]], key: str) -> float | None:
    """The median of ``key`` over the rows that logged a finite value of it."""
    values = [float(r[key]) for r in rows if key in r and math.isfinite(float(r[key]))]
    return statistics.median(values) if values else None


def time_split_line(rows: Sequence[Mapping[str, float]]) -> str:
    """The run's time split, medians over its updates, for the closing summary: ``time per update (median of
    12): collect 24.3 s (an episode: 9.8 s, waiting for answers 6.1 s, environment 3.7 s, scoring 0.02 s) ·
    train 12.2 s (learner forward-only 4.4 s, update 7.7 s) · publish 0.5 s · commit 0.1 s``; parts a run did
    not report are left out, and ``""`` without updates."""
    updates = [r for r in rows if "perf/update_s" in r]
    if not updates:
        return ""

    def part(label: str, key: str, digits: int = 1) -> str:
        value = _median_of(updates, key)
        return "" if value is None else f"{label} {value:.{digits}f} s"

    def joined(parts: Iterable[str], sep: str = ", ") -> str:
        return sep.join(p for p in parts if p)

    episode = joined(
        (
            part("an episode:", "perf/episode_s"),
            part("waiting for answers", "perf/episode_generate_s"),
            part("environment", "perf/episode_env_s"),
            part("scoring", "perf/episode_score_s", 2),
        )
    )
    learner = joined(
        (part("learner forward-only", "perf/learner_infer_s"), part("update", "perf/learner_train_s"))
    )
    sections = (
        part("collect", "perf/collect_s") + (f" ({episode})" if episode else ""),
        part("train", "perf/train_s") + (f" ({learner})" if learner else ""),
        part("publish", "perf/publish_s"),
        part("commit", "perf/commit_s"),
    )
    return f"time per update (median of {len(updates)}): " + joined(sections, " · ")


def eval_time_line(rows: Sequence[Mapping[str, float]]) -> str:
    """The held-out evaluations' time, medians over them, for the closing summary: ``evaluation (median of
    3): 26.4 s (an episode: 21.3 s, waiting for answers 21.1 s, environment 0.2 s)``; ``""`` when no
    evaluation was timed. A held-out game's turns come one after another, so its episode split says
    whether evaluations wait on the answers' latency or on the environment."""
    evals = [r for r in rows if "perf/eval_s" in r]
    if not evals:
        return ""
    parts = [
        f"{label} {value:.1f} s"
        for label, key in (
            ("an episode:", "perf/eval_episode_s"),
            ("waiting for answers", "perf/eval_episode_generate_s"),
            ("environment", "perf/eval_episode_env_s"),
        )
        if (value := _median_of(evals, key)) is not None
    ]
    total = _median_of(evals, "perf/eval_s") or 0.0
    return f"evaluation (median of {len(evals)}): {total:.1f} s" + (f" ({', '.join(parts)})" if parts else "")


def _first(values: Mapping[str, float], *keys: str) -> float | None:
    for k in keys:
        if k in values and math.isfinite(float(values[k])):
            return float(values[k])
    return None


def update_line(step: int, total: int, values: Mapping[str, float]) -> str:
    """One console line per update: ``update 3/20  reward +0.41  win 0.62  loss -0.013  kl 4.1e-04
    entropy 1.23  9.8 s`` (``-`` where the learner does not report a value). ``kl`` is the KL to the
    reference policy (``actor/kl_loss``, when ``kl_coef`` > 0), else the PPO KL between the policy before
    and after the update (``actor/ppo_kl``); the time is collect + update of this step."""

    def num(key: str, fmt: str, *keys: str) -> str:
        v = _first(values, *keys)
        return f"{key} " + ("-" if v is None else format(v, fmt))

    seconds = sum(float(values.get(k, 0.0)) for k in ("perf/collect_s", "perf/update_s"))
    return "  ".join(
        [
            f"update {step}/{total}",
            num("reward", "+.2f", "charts/reward_mean"),
            num("win", ".2f", "charts/win_rate"),
            num("loss", ".4g", "actor/pg_loss"),
            num("kl", ".2g", "actor/kl_loss", "actor/ppo_kl"),
            num("entropy", ".3g", "actor/entropy"),
            f"{seconds:.1f} s",
        ]
    )


def transcript(traj: trajectory_pb2.Trajectory, decode: Any = None) -> str:
    """One episode as Markdown for TensorBoard's text tab: game, seed, every turn's seat, observation and
    answer (``response_text``, else ``decode(response_token_ids)``), validity and reward, then outcomes."""
    lines = [
        f"**{traj.game.game_id}/{traj.game.variant or '-'}** seed {traj.seed} `{traj.trajectory_id}`",
        "",
    ]
    policy = {b.seat: b.policy.policy_id for b in traj.seats if b.policy.policy_id}
    for t in traj.turns:
        text = t.response_text
        if not text and t.response_token_ids and decode is not None:
            text = decode(list(t.response_token_ids))
        who = f"seat {t.seat}" + (f" ({policy[t.seat]})" if t.seat in policy else "")
        flag = "" if t.valid else f" — invalid: {t.invalid_reason or 'rejected'}"
        lines.append(f"- **{who}** sees: {t.observation_text.strip()[-400:]!r}")
        lines.append(f"  - answers: `{text.strip()[:200]!r}` (reward {t.reward:+.2f}{flag})")
    for o in traj.outcomes:
        kind = common_pb2.OutcomeKind.Name(o.outcome).removeprefix("OUTCOME_KIND_").lower()
        lines.append(f"- outcome seat {o.seat} {o.role}: {kind}, reward {o.final_reward:+.2f}")
    return "\n".join(lines)


class MetricsWriter:
    """Appends rows to ``metrics.jsonl`` (resumable: rows of a resumed step overwrite on read), TensorBoard
    events under ``tb/`` (scalars, and text: sample transcripts) and, on ``close``, ``metrics.csv`` and
    ``curves.png``.

    ``tracking`` names extra backends of verl's ``verl.utils.tracking.Tracking`` (``wandb``, ``mlflow``,
    ``swanlab``, ``clearml``, ``file``, ...) that receive the same scalar rows. Its ``console`` and
    ``tensorboard`` backends are refused: this writer already keeps the TensorBoard files in the run
    directory (verl's go to ``$TENSORBOARD_DIR`` or the working directory) and the console line is the
    CLI's (verl's would print raw dicts through the progress bar). verl is imported only when asked for
    (~4 s)."""

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = True,
        *,
        tracking: Sequence[str] = (),
        project: str = "wolfpack",
        experiment: str = "",
        config: Mapping[str, Any] | None = None,
    ) -> None:
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
        self._tracking: Any = None
        if tracking:
            refused = sorted(set(tracking) & {"console", "tensorboard"})
            if refused:
                raise ValueError(f"tracking {refused}: already written by MetricsWriter (console line, tb/)")
            from verl.utils.tracking import Tracking

            self._tracking = Tracking(
                project, experiment or run_dir.name, default_backend=list(tracking), config=dict(config or {})
            )

    def log(self, step: int, values: Mapping[str, float]) -> None:
        row = {"step": step, **{k: float(v) for k, v in values.items()}}
        with self.jsonl.open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        if self._tb is not None:
            for k, v in values.items():
                if math.isfinite(float(v)):
                    self._tb.add_scalar(k, float(v), step)
            self._tb.flush()
        if self._tracking is not None:
            self._tracking.log({k: float(v) for k, v in values.items()}, step)

    def text(self, tag: str, text: str, step: int) -> None:
        """A text entry (Markdown) in TensorBoard's text tab, e.g. ``transcripts/eval`` (no-op without
        TensorBoard: the JSONL holds numbers only)."""
        if self._tb is not None:
            self._tb.add_text(tag, text, step)
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
        """Six panels vs update: reward and win rate (training episodes as lines, held-out evaluations as
        points with their 95% CI shaded), policy loss (and value loss), KL (PPO KL and KL to the
        reference), entropy, invalid-answer rate. Several policies: one line per policy. Two more against
        the training clock (``TRAIN_MINUTES``), because what a user pays for is minutes, not updates: the
        held-out evaluations with their CIs, and the time split of each update (collect / train / publish)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.rows()
        fig, grid = plt.subplots(2, 4, figsize=(20, 8))
        axes = list(grid.flat)
        for ax, key, title in ((axes[0], "reward_mean", "mean reward"), (axes[1], "win_rate", "win rate")):
            train = _series(rows, f"charts/{key}")
            ev = [
                (
                    r["step"],
                    r[f"eval/{key}"],
                    r.get(f"eval/{_ci_key(key)}_lo"),
                    r.get(f"eval/{_ci_key(key)}_hi"),
                )
                for r in rows
                if f"eval/{key}" in r
            ]
            if train:
                ax.plot(*zip(*train, strict=True), label="training episodes", alpha=0.7)
            _draw_evals(ax, ev, "held-out eval")
            for pid, points in _vs_bot_series(rows, key).items():  # eval.vs_bot: each policy alone vs the bot
                ax.plot(*zip(*points, strict=True), "s--", label=f"held-out vs bot: {pid}", alpha=0.8)
            _finish(ax, title)
        panels = (
            (axes[2], "loss", ("actor/pg_loss", "critic/vf_loss")),
            (axes[3], "KL", ("actor/ppo_kl", "actor/kl_loss")),
            (axes[4], "entropy", ("actor/entropy",)),
            (axes[5], "invalid-answer rate", ("charts/invalid_rate",)),
        )
        for ax, title, names in panels:
            for name in names:
                for key in sorted({k for r in rows for k in r if k == name or k.endswith("/" + name)}):
                    series = _series(rows, key)
                    if series:
                        ax.plot(*zip(*series, strict=True), label=key, alpha=0.8)
            _finish(ax, title)
        _plot_wall_clock(axes[6], axes[7], rows)
        fig.tight_layout()
        path = self.run_dir / "curves.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._tracking is not None:
            self._tracking.finish()
            self._tracking = None


def _vs_bot_series(rows: Sequence[Mapping[str, float]], key: str) -> dict[str, list[tuple[float, float]]]:
    """Per policy, (update, ``eval_vs_bot/<policy>/<key>``) of each evaluation that played it alone against the
    bot (``eval.vs_bot``); empty without it."""
    out: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        for name, value in r.items():
            parts = name.split("/")
            if len(parts) == 3 and parts[0] == "eval_vs_bot" and parts[2] == key:
                out.setdefault(parts[1], []).append((r["step"], value))
    return dict(sorted(out.items()))


def _ci_key(key: str) -> str:
    """``eval/reward_mean``'s bounds are ``eval/reward_lo``/``_hi``; ``eval/win_rate``'s ``win_rate_lo``/``_hi``."""
    return key.removesuffix("_mean")


TRAIN_MINUTES = "time/train_min"
"""Minutes of the training loop when an update ended (the clock ``train.max_minutes`` reads: set-up and the
first evaluation excluded, later evaluations included; a resumed run's clock goes on from its last row)."""


def wall_clock_evals(
    rows: Sequence[Mapping[str, float]], key: str
) -> list[tuple[float, float, float | None, float | None]]:
    """(training minutes, held-out ``eval/<key>``, its CI bounds) per evaluation: an evaluation after
    update ``s`` is placed at the minute update ``s`` ended (its own row), the baseline at 0."""
    out = []
    for r in rows:
        if f"eval/{key}" not in r:
            continue
        minutes = 0.0 if r["step"] == 0 else r.get(TRAIN_MINUTES)
        if minutes is None:
            continue
        lo, hi = r.get(f"eval/{_ci_key(key)}_lo"), r.get(f"eval/{_ci_key(key)}_hi")
        out.append((float(minutes), float(r[f"eval/{key}"]), lo, hi))
    return out


def _draw_evals(ax: Any, ev: Sequence[tuple[float, float, float | None, float | None]], label: str) -> None:
    """Held-out evaluations (x, mean, CI low, CI high) as points, their 95% CIs shaded."""
    if not ev:
        return
    ax.plot([e[0] for e in ev], [e[1] for e in ev], "o-", label=label)
    bounds = [(x, lo, hi) for x, _, lo, hi in ev if lo is not None and hi is not None]
    if bounds:
        x, lo, hi = zip(*bounds, strict=True)
        ax.fill_between(x, lo, hi, alpha=0.25, label="eval 95% CI")


def _plot_wall_clock(ax_eval: Any, ax_split: Any, rows: Sequence[Mapping[str, float]]) -> None:
    key = "win_rate" if any("eval/win_rate" in r for r in rows) else "reward_mean"
    _draw_evals(ax_eval, wall_clock_evals(rows, key), f"held-out {key}")
    _finish(ax_eval, f"held-out {key.replace('_', ' ')} vs training time")
    ax_eval.set_xlabel("training minutes")
    for name in ("perf/collect_s", "perf/train_s", "perf/publish_s"):
        series = [(r[TRAIN_MINUTES], r[name]) for r in rows if TRAIN_MINUTES in r and name in r]
        if series:
            ax_split.plot(*zip(*series, strict=True), ".-", label=name.removeprefix("perf/"), alpha=0.8)
    _finish(ax_split, "seconds per update")
    ax_split.set_xlabel("training minutes")


def _series(rows: Sequence[Mapping[str, float]], key: str) -> list[tuple[float, float]]:
    return [(r["step"], r[key]) for r in rows if key in r and math.isfinite(float(r[key]))]


def _finish(ax: Any, title: str) -> None:
    ax.set_xlabel("update")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
