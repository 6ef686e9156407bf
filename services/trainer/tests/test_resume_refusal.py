"""A run directory holding a checkpoint of another config is refused with one line, before the job starts a
stack or Redis; how long to train (``train.updates``, ``train.max_minutes``) is not a change of config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.train import ResumeError, check_resumable, config_fingerprint

BASE: dict[str, Any] = {
    "name": "refusal",
    "game": {"id": "ultimatum_v1", "variant": "easy"},
    "policies": [{"id": "responder", "seats": [1], "model": "tiny", "lr": 1e-3}],
    "rollout": {"mode": "service", "episodes_per_update": 4, "group_size": 2},
    "train": {"updates": 3, "max_minutes": 1.0},
}


def _checkpoint(run_dir: Path, data: dict[str, Any]) -> None:
    ckpt = run_dir / "checkpoints" / "update_000001"
    ckpt.mkdir(parents=True)
    state = {"step": 1, "config": config_fingerprint(TrainConfig.model_validate(data))}
    (ckpt / "state.json").write_text(json.dumps(state))
    (run_dir / "checkpoints" / "LATEST").write_text("update_000001")


def _with(**train: Any) -> dict[str, Any]:
    return {**BASE, "train": {**BASE["train"], **train}}


def test_length_of_training_is_not_a_change(tmp_path: Path) -> None:
    _checkpoint(tmp_path, BASE)
    check_resumable(tmp_path, TrainConfig.model_validate(_with(updates=30, max_minutes=9.0)))


def test_another_config_is_refused_naming_what_changed(tmp_path: Path) -> None:
    _checkpoint(tmp_path, BASE)
    other = {**BASE, "policies": [{**BASE["policies"][0], "lr": 5e-4}]}
    with pytest.raises(ResumeError, match="changed: policies"):
        check_resumable(tmp_path, TrainConfig.model_validate(other))


def test_the_cli_refuses_before_starting_a_stack(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _checkpoint(run, BASE)
    cfg = tmp_path / "other.yaml"
    cfg.write_text(yaml.safe_dump({**BASE, "seed": 7}))
    env = {**os.environ, "WOLFPACK_RUN_DIR": str(tmp_path / "wp")}
    env.pop("WOLFPACK_REDIS_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "wolfpack.cli.main", "train", "-c", str(cfg), "--run-dir", str(run)],
        env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "holds a run of another config (changed: seed)" in " ".join(proc.stdout.split())  # rich wraps
    assert not (run / "stack").exists() and not (run / "redis").exists()  # nothing was started
