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
