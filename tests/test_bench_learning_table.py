"""bench/trainer/learning_table.py: a run's learning row from its metrics CSV (the trainer's columns), on a
hand-made run and on the s23 village run whose numbers its results file states."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench" / "trainer"))

from learning_table import read_run  # noqa: E402


def _write(path: Path, rows: list[dict[str, float]]) -> Path:
    keys = sorted({k for r in rows for k in r} - {"step"})
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, ["step", *keys])
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_a_runs_row_reads_its_evaluations_references_and_clock(tmp_path: Path) -> None:
    path = _write(tmp_path / "run-metrics.csv", [
        {"step": 0, "reference/base/win_rate": 0.0, "reference/random/win_rate": 0.05,
         "reference/constant_pass/win_rate": 0.02, "reference/heuristic/win_rate": 0.4,
         "reference/initial/win_rate": 0.1},
        {"step": 0, "eval/win_rate": 0.1, "eval/win_rate_lo": 0.05, "eval/win_rate_hi": 0.2},
        {"step": 1, "perf/update_s": 30.0, "time/train_min": 1.0},
        {"step": 2, "perf/update_s": 31.0, "time/train_min": 2.5},
        {"step": 2, "eval/win_rate": 0.3, "eval/win_rate_lo": 0.2, "eval/win_rate_hi": 0.4},
    ])  # fmt: skip
    row = read_run(path)
    assert (row.run, row.minutes, row.updates) == ("run", 2.5, 2)
    assert (row.start, row.final, row.final_lo, row.final_hi) == (0.1, 0.3, 0.2, 0.4)
    # initial (update 0 itself), base and heuristic have their own columns: the best other is random
    assert (row.base, row.best_reference, row.heuristic) == (0.0, ("random", 0.05), 0.4)
    assert row.per_minute() == pytest.approx(0.3 / 2.5)


def test_a_run_with_one_evaluation_has_no_final(tmp_path: Path) -> None:
    path = _write(tmp_path / "short-metrics.csv", [{"step": 0, "eval/win_rate": 0.1}])
    row = read_run(path)
    assert row.start == 0.1 and row.final is None and row.per_minute() is None


def test_the_s23_village_row_matches_its_results_file() -> None:
    """bench/results/2026-11-28-h200-hold-s23.md: 15.8 training minutes, 25 updates, 0.18 -> 0.23 (0.17..0.31),
    base 0.00, random 0.02, heuristic 0.43."""
    csv_path = RESULTS / "2026-11-28-h200-village-seed1-bf16clone-s23-metrics.csv"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "trainer" / "learning_table.py"), str(csv_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "| 2026-11-28-h200-village-seed1-bf16clone-s23 | win_rate | 15.8 (25) | 0.18 -> 0.23 (0.17..0.31) | 0.00 |"
        " random 0.02 | 0.43 | +1.5 points |"
    ) in proc.stdout


def test_a_reward_judged_run_reads_its_reward_bounds() -> None:
    """IPPO is judged on the seats' mean reward, whose bounds are ``eval/reward_lo`` / ``_hi`` (no ``_mean``):
    bench/results/2026-11-27-h200x4-hold-s19.md's -0.45 -> +0.80 (+0.75..+0.84), base -1.00."""
    row = read_run(RESULTS / "2026-11-27-h200-ippo-s19-metrics.csv", "reward_mean")
    assert (round(row.start or 0, 2), round(row.final or 0, 2)) == (-0.45, 0.80)
    assert (round(row.final_lo or 0, 2), round(row.final_hi or 0, 2), round(row.base or 0, 2)) == (
        0.75,
        0.84,
        -1.0,
    )
