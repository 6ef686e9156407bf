"""Trainer tokens/s per GPU against stock verl ``main_ppo`` (issue 19, item 6), from the two runs' own records:
``main_ppo``'s console log (``bench/trainer/verl_agent_loop_ppo.sh`` tees it) and a ``wolfpack train`` run's
``metrics.jsonl``.

    python bench/trainer/vs_main_ppo.py MAIN_PPO_LOG WOLFPACK_METRICS_JSONL [--gpus N]

Two rows, medians over the steps after the first (the first pays for compilation and warm-up):

* *actor update*: prompt + response tokens of the batch over the actor's update time, per GPU: verl's
  ``perf/total_num_tokens / timing_s/update_actor``; ours ``batch/sequence_tokens / perf/learner_train_s``.
  The same verl FSDP engine does the work on both sides, so this ratio is what our learner wrapper (batch
  preparation, length sorting, padding rows) costs or saves.
* *whole step*: the same tokens over the whole step (generation, environment, reward, log-probs, update,
  weight sync): verl's ``perf/throughput``; ours ``batch/sequence_tokens / (perf/collect_s + perf/update_s)``.

Runs are comparable only on the same model, card and batch shapes (rows per step, turns per row, tokens
per turn); the table prints each side's tokens per step so a mismatch shows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
from pathlib import Path

STEP = re.compile(
    r"(?:^|\) )step:(\d+) - (.*)$"
)  # Ray prefixes the line: "(TaskRunner pid=...) step:1 - ..."
COLOUR = re.compile(r"\x1b\[[0-9;]*m")
"""Ray colours its prefix when its output is a terminal or forced (seen on the lent GPU machine: ``ESC[36m(TaskRunnerV1
pid=...)ESC[0m step:1 - ...``): stripped before matching, or only uncoloured lines were read."""


def main_ppo_steps(log: Path) -> list[dict[str, float]]:
    """The numeric metrics of every ``step:N - key:value - ...`` line verl's console logger printed."""
    steps = []
    for line in log.read_text(errors="replace").splitlines():
        m = STEP.search(COLOUR.sub("", line).strip())
        if not m:
            continue
        row = {"step": float(m.group(1))}
        for item in m.group(2).split(" - "):
            key, sep, value = item.rpartition(":")
            if sep:
                with contextlib.suppress(ValueError):  # a string or list value: not a metric
                    row[key] = float(value)
        steps.append(row)
    return steps


def wolfpack_steps(metrics: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [r for r in rows if "perf/update_s" in r and "batch/sequence_tokens" in r]


def _step_s(row: dict[str, float]) -> float:
    """A ``wolfpack train`` step's wall time: waiting for its batch (``perf/collect_s``, what generation the
    previous update did not overlap) plus everything after it (``perf/update_s``). The update alone left out
    the generation, which verl's step time includes."""
    return row.get("perf/collect_s", 0.0) + row["perf/update_s"]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("main_ppo_log", type=Path)
    ap.add_argument("wolfpack_metrics", type=Path)
    ap.add_argument(
        "--gpus", type=int, default=1, help="GPUs of both runs (verl's throughput is already per GPU)"
    )
    args = ap.parse_args()
    verl = main_ppo_steps(args.main_ppo_log)[1:]
    ours = wolfpack_steps(args.wolfpack_metrics)[1:]
    if not verl or not ours:
        print(f"need two steps or more on each side: main_ppo {len(verl) + 1}, wolfpack {len(ours) + 1}")
        return 1
    v_tokens = _median([r["perf/total_num_tokens"] for r in verl])
    o_tokens = _median([r["batch/sequence_tokens"] for r in ours])
    v_update = _median([r["perf/total_num_tokens"] / r["timing_s/update_actor"] / args.gpus for r in verl])
    # the verl learner's training passes; a learner that does not report them (the CPU one): its whole train
    learner_key = "perf/learner_train_s" if all("perf/learner_train_s" in r for r in ours) else "perf/train_s"
    o_update = _median([r["batch/sequence_tokens"] / r[learner_key] / args.gpus for r in ours])
    v_step = _median([r["perf/throughput"] for r in verl])
    o_step = _median([r["batch/sequence_tokens"] / _step_s(r) / args.gpus for r in ours])
    print(f"steps after the first: main_ppo {len(verl)}, wolfpack {len(ours)}; tokens per step: main_ppo "
          f"{v_tokens:,.0f}, wolfpack {o_tokens:,.0f}")  # fmt: skip
    if learner_key != "perf/learner_train_s":
        print(f"wolfpack's actor update from {learner_key} (the learner reported no perf/learner_train_s)")
    print("| tokens/s per GPU | main_ppo | wolfpack train | wolfpack / main_ppo |")
    print("| --- | --- | --- | --- |")
    print(f"| actor update | {v_update:,.0f} | {o_update:,.0f} | {o_update / v_update:.2f}x |")
    print(f"| whole step | {v_step:,.0f} | {o_step:,.0f} | {o_step / v_step:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
