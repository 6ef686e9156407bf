"""The README's order: ``wolfpack up`` (its inference serves only ``default``), then ``wolfpack train -c
configs/demo-ultimatum.yaml``. The run registers its policy on the running inference before any work
(it used to die after the warm start with ``unknown policy 'responder'; served: default``) and trains.
Real launcher, services and CLI process; tiny model, one small update. (What a running stack cannot serve
stops the run with one line: tests in services/trainer/tests/test_running_stack.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wolfpack_inference.models import tiny_model
from wolfpack_trainer.config import load_config
from wolfpack_trainer.stack import child_stack

DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo-ultimatum.yaml"
SMALL = [
    "warmstart=null",
    "train.updates=1",
    "train.save_versions=false",
    "rollout.episodes_per_update=4",
    "rollout.group_size=2",
    "rollout.max_tokens=4",
    "eval.episodes=2",
    "eval.every=1",
]


def wolfpack_train(stack_dir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WOLFPACK_RUN_DIR": str(stack_dir), "COLUMNS": "200"}
    env.pop("WOLFPACK_REDIS_URL", None)
    cmd = [
        sys.executable,
        "-m",
        "wolfpack.cli.main",
        "train",
        "-c",
        str(DEMO),
        "--run-dir",
        str(out),
        *SMALL,
        *extra,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.slow
def test_up_then_train(tmp_path: Path) -> None:
    tiny = tiny_model(tmp_path / "models")
    cfg = load_config(DEMO)
    # `wolfpack up` as a user starts it: one policy, "default" (here the tiny model, not SmolLM2).
    with child_stack(cfg, tmp_path / "up", {"default": str(tiny)}, timeout_s=300) as stack_dir:
        done = wolfpack_train(stack_dir, tmp_path / "run", f"policies.0.model={tiny}")
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        assert "using the running stack" in out and "registered policy responder" in out
        assert "unknown policy" not in out
        assert done.stdout.strip().splitlines()[-1].startswith("learning: win_rate")
