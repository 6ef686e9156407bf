"""bench/trainer/vs_main_ppo.py on the records of its first GPU run (bench/results/2026-11-28-h200x4-hold-s21.md):
verl's console lines as Ray printed them on the lent machine, colour codes included, and the ``wolfpack
train`` run's metrics. The table in that results file must come back from them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench" / "trainer"))

from vs_main_ppo import main_ppo_steps  # noqa: E402


def test_coloured_and_plain_step_lines_both_parse(tmp_path: Path) -> None:
    log = tmp_path / "main_ppo.log"
    log.write_text(
        "\x1b[36m(TaskRunnerV1 pid=19660)\x1b[0m step:1 - perf/throughput:1405.6 - training/epoch:0\n"
        "(TaskRunner pid=7) step:2 - perf/throughput:1132.2 - actor/name:abc\n"
        "\x1b[36m(TaskRunnerV1 pid=19660)\x1b[0m Training Progress:  62%|██ | 5/8\n"
    )
    steps = main_ppo_steps(log)
    assert [s["step"] for s in steps] == [1.0, 2.0]
    assert steps[0]["perf/throughput"] == 1405.6 and steps[1]["perf/throughput"] == 1132.2
    assert "actor/name" not in steps[1]  # a string value is not a metric


def test_the_first_gpu_runs_table_comes_back_from_its_records() -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "trainer" / "vs_main_ppo.py"),
           str(RESULTS / "2026-11-28-h200-vs-main-ppo-s21-main_ppo-steps.log"),
           str(RESULTS / "2026-11-28-h200-vs-main-ppo-s21-wolfpack-metrics.jsonl")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "steps after the first: main_ppo 7, wolfpack 7" in proc.stdout
    assert "| actor update | 4,943 | 15,487 | 3.13x |" in proc.stdout
    assert "| whole step | 1,406 | 1,484 | 1.06x |" in proc.stdout
