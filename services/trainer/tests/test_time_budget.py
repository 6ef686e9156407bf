"""``train.max_minutes``: a run ends after the update that passes its training-time budget, and still ends
the way a finished run does (checkpoint, final evaluation, learning line); a rerun resumes from there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wolfpack_inference.models import tiny_model
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.metrics import TRAIN_MINUTES
from wolfpack_trainer.train import run_training


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model(tmp_path_factory.mktemp("models")))


def test_budget_stops_after_the_update_that_passes_it(tmp_path: Path, tiny: str, redis_url: str) -> None:
    cfg = TrainConfig.model_validate(
        {
            "name": "budget",
            "game": {"id": "ultimatum_v1", "variant": "easy"},
            "policies": [{"id": "responder", "seats": [1], "model": tiny, "lr": 1e-3}],
            "rollout": {"episodes_per_update": 4, "group_size": 2, "max_tokens": 4, "max_prompt_tokens": 48},
            "stream": {"name": f"wolfpack:test:budget:{tmp_path.name}"},
            "train": {"updates": 50, "max_minutes": 1e-6},
            "eval": {"every": 100, "episodes": 4},
        }
    )
    trainer, evals = run_training(cfg, tmp_path / "run", redis_url, tmp_path / "models")
    assert trainer.state.step == 1  # the first update already passed a budget of ~0 s
    assert [e.step for e in evals] == [0, 1]  # the baseline and the final evaluation
    assert (tmp_path / "run" / "checkpoints" / "LATEST").read_text().strip().endswith("1")
    state = json.loads((tmp_path / "run" / "checkpoints" / "update_000001" / "state.json").read_text())
    assert state["step"] == 1
    # the update's time split: its parts add up to the update's time after collecting
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    update = next(r for r in rows if "perf/update_s" in r)
    parts = [update[k] for k in ("perf/train_s", "perf/publish_s", "perf/commit_s")]
    assert all(p >= 0 for p in parts) and update["perf/collect_s"] > 0 and update["perf/train_s"] > 0
    assert abs(sum(parts) - update["perf/update_s"]) < 0.05
    # the training clock: the minutes when the update ended, past its own collect + update time
    assert update[TRAIN_MINUTES] * 60 >= update["perf/collect_s"] + update["perf/update_s"] - 0.05

    # a rerun resumes, and its clock goes on from the first run's instead of starting at 0 again
    trainer, _ = run_training(cfg, tmp_path / "run", redis_url, tmp_path / "models")
    assert trainer.state.step == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    clock = {r["step"]: r[TRAIN_MINUTES] for r in rows if TRAIN_MINUTES in r}
    second = next(r for r in rows if r["step"] == 2 and "perf/update_s" in r)
    assert clock[2] * 60 >= clock[1] * 60 + second["perf/collect_s"] + second["perf/update_s"] - 0.05
