"""The base a run trains and serves is settled before its stack starts (``warmstart.run_base``, used by
``wolfpack train`` in service mode with LoRA): a fresh run warm-starts once (a second call finds the clone),
a resumed run keeps its checkpoint's base without warm-starting again, and a resumed run whose base is gone
stops with one line before anything starts. ``--check`` says where the weights start and what is served."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from wolfpack.cli.main import app
from wolfpack_inference.models import tiny_model
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.warmstart import RECORD, BaseMissingError, WarmStartConfig, clone_dir, run_base

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("models"))


def _config(tiny: Path, **extra: Any) -> TrainConfig:
    data: dict[str, Any] = {
        "name": "run-base",
        "game": {"id": "ultimatum_v1", "variant": "easy", "bot": "heuristic"},
        "policies": [{"id": "responder", "seats": [1], "model": str(tiny), "lora_rank": 4, "lora_alpha": 8}],
        "warmstart": {"bot": "random", "episodes": 2, "steps": 2},
        "rollout": {"mode": "service", "episodes_per_update": 4, "group_size": 2},
        **extra,
    }
    return TrainConfig.model_validate(data)


def _checkpoint(run_dir: Path, model_path: str) -> None:
    ckpt = run_dir / "checkpoints" / "update_000001"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(json.dumps({"step": 1, "model_path": model_path}))
    (run_dir / "checkpoints" / "LATEST").write_text("update_000001")


def test_a_fresh_run_warm_starts_once(tiny: Path, tmp_path: Path) -> None:
    cfg, cache = _config(tiny), tmp_path / "cache"
    told: list[WarmStartConfig] = []
    first = run_base(cfg, tmp_path / "run", cache, on_build=told.append)
    assert first.how == "built" and first.warm and len(told) == 1
    assert Path(first.path).parent == cache and Path(first.path).name.startswith("warm-")
    record = json.loads((Path(first.path) / RECORD).read_text())
    assert record["model"] == str(tiny) and record["config"]["steps"] == 2 and record["last_loss"] > 0
    again = run_base(cfg, tmp_path / "other-run", cache, on_build=told.append)
    assert (again.path, again.how, len(told)) == (first.path, "cached", 1)
    assert [p.name for p in cache.iterdir()] == [Path(first.path).name]  # no second clone, no leftovers


def test_a_resumed_run_keeps_its_checkpoints_base_without_a_warm_start(tiny: Path, tmp_path: Path) -> None:
    """The cache here is empty: a fresh run would build a clone; the resumed one takes its own base."""
    cfg = _config(tiny)
    saved = tmp_path / "elsewhere" / "warm-tiny-0123456789ab"
    saved.mkdir(parents=True)
    (saved / "config.json").write_text("{}")
    _checkpoint(tmp_path / "run", str(saved))
    told: list[WarmStartConfig] = []
    base = run_base(cfg, tmp_path / "run", tmp_path / "cache", on_build=told.append)
    assert (base.path, base.how, base.warm) == (str(saved), "checkpoint", True)
    assert told == [] and not (tmp_path / "cache").exists()
    wcfg = WarmStartConfig(game_id="ultimatum_v1", episodes=2, steps=2, seats=(1,))
    assert not clone_dir(str(tiny), wcfg, tmp_path / "cache").exists()


def test_a_resumed_run_whose_base_is_gone_is_refused(tiny: Path, tmp_path: Path) -> None:
    _checkpoint(tmp_path / "run", str(tmp_path / "gone" / "warm-tiny-0123456789ab"))
    with pytest.raises(BaseMissingError, match=r"which is gone.*--fresh"):
        run_base(_config(tiny), tmp_path / "run", tmp_path / "cache")


def test_without_a_warm_start_the_base_is_the_model(tiny: Path, tmp_path: Path) -> None:
    base = run_base(_config(tiny, warmstart=None), tmp_path / "run", tmp_path / "cache")
    assert (base.path, base.how, base.warm) == (str(tiny), "model", False)


def test_the_job_stops_before_its_stack_when_the_resumed_base_is_gone(
    tiny: Path, tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One line and exit 2 from ``wolfpack train``, and no stack directory: nothing was started."""
    path = tmp_path / "cfg.json"  # JSON is YAML
    path.write_text(json.dumps(_config(tiny).model_dump(mode="json", exclude_unset=True)))
    run = tmp_path / "run"
    _checkpoint(run, str(tmp_path / "gone" / "warm-tiny-0123456789ab"))
    monkeypatch.setenv("WOLFPACK_REDIS_URL", redis_url)
    monkeypatch.setenv("WOLFPACK_RUN_DIR", str(tmp_path / "wp"))
    result = CliRunner().invoke(app, ["train", "-c", str(path), "--run-dir", str(run)])
    assert result.exit_code == 2, result.output
    assert "which is gone" in result.output and "Traceback" not in result.output
    assert not (run / "stack").exists()


def test_check_says_the_stack_serves_the_warm_started_base_under_the_adapters() -> None:
    path = CONFIGS / "gpu-scenarios-selfplay-lora-smollm2.yaml"
    result = CliRunner().invoke(app, ["train", "-c", str(path), "--check"])
    assert result.exit_code == 0, result.output
    weights = next(line for line in result.output.splitlines() if line.strip().startswith("weights:"))
    assert "warm-started on the random bot (200 episodes, 60 steps) before the stack starts" in weights
    assert "buyer, seller: LoRA rank 32 alpha 64" in weights
    assert "inference serves the clone as the base" in weights and "adapter is pushed onto it" in weights
    local = CliRunner().invoke(
        app, ["train", "-c", str(path), "--check", "rollout.mode=local", "inference={}",
              "policies.0.learner=cpu", "policies.1.learner=cpu"],
    )  # fmt: skip
    assert local.exit_code == 0, local.output
    assert "in the trainer's set-up" in local.output and "sampled in process" in local.output
    assert "inference serves" not in local.output
