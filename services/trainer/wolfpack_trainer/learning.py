"""The ``learning:`` line of a model trained outside ``wolfpack train``, from two evaluation-only runs.

Why: a model trained by another trainer (stock verl ``main_ppo`` through the agent loop,
``bench/trainer/agent_loop_village.sh``) must be judged exactly as a ``wolfpack train`` run judges its
policy: the same held-out seeds, opponents, prompts, sampling and outcome rule, next to the same references
(the base model, the constant moves, the game's bots). ``wolfpack train -c <config> train.updates=0`` already
is that evaluation for one model (the update-0 evaluation, with ``eval.base`` the base model and the
in-process references on the same seeds); this module reads two such runs, one of the start model and one
of the final model, from their run directories (``metrics.jsonl``, step 0) and prints the summary a training
run ends with: the ``reference:`` lines (the start as ``initial``, ``base`` when the start's run measured it,
then the in-process references, recomputed here from the config: milliseconds a game) and the ``learning:``
line, start -> final.

    python -m wolfpack_trainer.learning -c <config> --start <run dir> --final <run dir> [key=value ...]

Both runs must have evaluated the config's held-out seeds: give this the config (and ``eval`` overrides)
both runs were given; the episode count of the estimates is its ``eval.episodes``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wolfpack_trainer.metrics import Estimate


class LearningError(RuntimeError):
    """A run directory holds no usable update-0 evaluation."""


def step0(run_dir: Path) -> dict[str, float]:
    """The metrics logged at step 0 of ``run_dir`` (the evaluation of an evaluation-only run), merged."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise LearningError(f"{run_dir}: no metrics.jsonl (did its evaluation-only run finish?)")
    out: dict[str, float] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if row.get("step") == 0:
                out.update(row)
    if "eval/win_rate" not in out:
        raise LearningError(f"{run_dir}: no evaluation at step 0 in metrics.jsonl")
    return out


def _estimate(row: dict[str, float], mean: str, lo: str, hi: str, n: int) -> Estimate:
    return Estimate(float(row[mean]), float(row[lo]), float(row[hi]), n)


def evaluation(row: dict[str, float], n: int, prefix: str = "eval") -> tuple[Estimate, Estimate]:
    """(reward, win rate) of ``prefix`` (``eval``, or ``reference/base``: its keys are named differently)."""
    if prefix == "eval":
        return (
            _estimate(row, "eval/reward_mean", "eval/reward_lo", "eval/reward_hi", n),
            _estimate(row, "eval/win_rate", "eval/win_rate_lo", "eval/win_rate_hi", n),
        )
    return (
        _estimate(row, f"{prefix}/reward_mean", f"{prefix}/reward_mean_lo", f"{prefix}/reward_mean_hi", n),
        _estimate(row, f"{prefix}/win_rate", f"{prefix}/win_rate_lo", f"{prefix}/win_rate_hi", n),
    )


def summary_lines(cfg: Any, start_dir: Path, final_dir: Path, *, start_is_base: bool = False) -> list[str]:
    """``start`` and ``final`` lines, the ``reference:`` block and the ``learning:`` line (see the module
    docstring). ``start_is_base``: the start model is the base model itself (no warm start), so its own
    evaluation is the ``base`` reference."""
    from wolfpack_trainer.evaluate import reference_lines
    from wolfpack_trainer.train import EvalResult, learning_line

    n = cfg.eval.episodes
    start_row, final_row = step0(start_dir), step0(final_dir)
    for run, row in ((start_dir, start_row), (final_dir, final_row)):
        failed = int(row.get("eval/failed_episodes", 0))
        if failed:
            print(f"warning: {run}: {failed} of {n} episodes failed (counted as losses)")
    start, final = evaluation(start_row, n), evaluation(final_row, n)
    base: tuple[Estimate, Estimate] | None = None
    if "reference/base/win_rate" in start_row:
        base = evaluation(start_row, n, "reference/base")
    elif start_is_base:
        base = start
    metric = cfg.eval.metric
    pick = 1 if metric == "win_rate" else 0
    lines = [
        f"start: {start_dir} {metric} {start[pick].mean:.2f} (95% CI {start[pick].lo:.2f}..{start[pick].hi:.2f})",
        f"final: {final_dir} {metric} {final[pick].mean:.2f} (95% CI {final[pick].lo:.2f}..{final[pick].hi:.2f})",
    ]
    lines += reference_lines(cfg, start[pick], final[pick], base)
    first, last = EvalResult(0, *start), EvalResult(0, *final)
    lines.append(learning_line(metric, first, last))
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    from wolfpack_trainer.config import load_config

    ap = argparse.ArgumentParser(
        prog="python -m wolfpack_trainer.learning", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("-c", "--config", type=Path, required=True, help="the config both runs evaluated")
    ap.add_argument("--start", type=Path, required=True, help="run dir of the start model's evaluation")
    ap.add_argument("--final", type=Path, required=True, help="run dir of the final model's evaluation")
    ap.add_argument("--start-is-base", action="store_true", help="the start model is the base model")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the config (as given to the runs)")
    args = ap.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    try:
        lines = summary_lines(cfg, args.start, args.final, start_is_base=args.start_is_base)
    except LearningError as exc:
        raise SystemExit(str(exc)) from None
    print("\n".join(lines))


if __name__ == "__main__":
    main()
