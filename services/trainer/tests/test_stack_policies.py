"""The job's stack splits ``inference.gpu_memory_utilization`` among its vLLM engines (pure: the policies file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from wolfpack_trainer.config import load_config
from wolfpack_trainer.stack import stack_policies

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def shares(name: str, *overrides: str) -> dict[str, object]:
    cfg = load_config(CONFIGS / name, ["inference.backend=vllm", *overrides])
    models = {p.id: f"/models/{p.id}" for p in cfg.policies}
    return {e["policy_id"]: e.get("gpu_memory_utilization") for e in stack_policies(cfg, models)}


def test_one_policy_gets_the_whole_share() -> None:
    assert shares("gpu-bargaining-smollm2.yaml") == {"seller": 0.35}


def test_two_trained_policies_split_it() -> None:
    assert shares("gpu-ippo-smollm2.yaml", "inference.gpu_memory_utilization=0.4") == {
        "proposer": 0.2,
        "responder": 0.2,
    }


def test_a_served_opponent_counts_as_an_engine() -> None:
    got = shares("gpu-werewolf-12p-zh-grpo-smollm2.yaml", "inference.gpu_memory_utilization=0.3")
    assert got == {"player": pytest.approx(0.15), "frozen": pytest.approx(0.15)}


def test_the_transformers_backend_gets_no_vllm_share() -> None:
    cfg = load_config(CONFIGS / "gpu-ippo-smollm2.yaml", ["inference.backend=transformers"])
    entries = stack_policies(cfg, {p.id: "/m" for p in cfg.policies})
    assert all("gpu_memory_utilization" not in e for e in entries)


def test_a_served_opponent_is_served_from_the_checkpoint_the_job_resolved() -> None:
    cfg = load_config(CONFIGS / "gpu-werewolf-12p-zh-grpo-smollm2.yaml", ["inference.backend=vllm"])
    models = {p.id: "/models/warm" for p in cfg.policies}
    by_id = {
        e["policy_id"]: e["model"] for e in stack_policies(cfg, models, {"frozen": "/cache/smollm2-135m"})
    }
    assert by_id == {"player": "/models/warm", "frozen": "/cache/smollm2-135m"}
    # without a resolved checkpoint the entry keeps the spec (the stack's inference resolves it itself)
    assert {e["policy_id"]: e["model"] for e in stack_policies(cfg, models)}["frozen"] == "smollm2"


def test_the_job_resolves_served_opponents_with_its_own_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen on a lent H100 (no network): the 12p recipe's frozen ``smollm2`` opponent was handed to the stack
    as the spec, whose inference tried to download the package into its own cache and the job died before
    its first update. The job's stack now gets the checkpoint the job itself resolved (here ``tiny``, built
    for real in the job's cache); only the stack's start is replaced."""
    import contextlib

    import wolfpack_trainer.stack as stack_mod
    from wolfpack.settings import Settings
    from wolfpack_trainer import cli

    seen: dict[str, object] = {}

    @contextlib.contextmanager
    def fake_child_stack(cfg, run_dir, models, timeout_s=600.0, opponent_models=None):  # type: ignore[no-untyped-def]
        seen["models"], seen["opponents"] = models, opponent_models
        yield run_dir

    monkeypatch.setattr(stack_mod, "child_stack", fake_child_stack)
    monkeypatch.setattr(stack_mod, "running_stack", lambda settings: None)
    cfg = load_config(
        CONFIGS / "gpu-werewolf-12p-zh-grpo-smollm2.yaml",
        [
            "policies.0.model=tiny",
            "policies.0.lora_rank=0",
            "warmstart=null",
            "opponent_policies.0.model=tiny",
        ],
    )
    settings = Settings(run_dir=tmp_path / "run")
    with contextlib.ExitStack() as stack:
        cli._ensure_stack(stack, cfg, settings, tmp_path / "job")
    opponents = seen["opponents"]
    assert isinstance(opponents, dict) and set(opponents) == {"frozen"}
    assert Path(opponents["frozen"]).is_relative_to(tmp_path / "run" / "models")
    assert (Path(opponents["frozen"]) / "config.json").exists()
