"""``wolfpack train`` on a GPU host, end to end: the verl FSDP learner on CUDA, inference on vLLM in the job's
own stack, weights pushed after every update, evaluation through the served policy. Runs on the device
(``pytest -m gpu tests/test_train_gpu.py`` after ``. bench/trainer/gpu_env.sh``); CI deselects it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.gpu

CONFIG = {
    "name": "gpu-e2e",
    "description": "two verl_fsdp updates with vLLM inference and an evaluation (the GPU smoke test)",
    "seed": 0,
    "game": {"id": "ultimatum_v1", "variant": "easy", "bot": "heuristic"},
    "policies": [
        {
            "id": "responder",
            "seats": [1],
            "learner": "verl_fsdp",
            "model": "tiny",
            "lr": 1.0e-4,
            "micro_batch_size": 8,
            "mini_batch_size": 16,
            "device": "cuda",
        },
    ],
    "rollout": {"mode": "service", "episodes_per_update": 16, "group_size": 8, "max_tokens": 12},
    "algo": {"estimator": "grpo"},
    "loss": {"clip_ratio": 0.2, "tis_cap": 2.0},
    "batch": {"layout": "turn", "group_by": ["group", "policy", "role"]},
    "train": {"updates": 2, "push_every": 1, "checkpoint_every": 1},
    "eval": {"every": 2, "episodes": 16},
    "inference": {"backend": "vllm", "gpu_memory_utilization": 0.3, "enforce_eager": True},
}


SHARED = {
    **CONFIG,
    "name": "gpu-e2e-shared",
    "description": "both ultimatum seats one LoRA policy (share_policy): one learner, two vLLM engines",
    "policies": [
        {
            "id": pid,
            "seats": [seat],
            "learner": "verl_fsdp",
            "model": "tiny",
            "lora_rank": 8,
            "lora_alpha": 16,
            "lr": 1.0e-4,
            "micro_batch_size": 8,
            "device": "cuda",
        }
        for pid, seat in (("proposer", 0), ("responder", 1))
    ],
    "train": {"updates": 2, "push_every": 1, "checkpoint_every": 1, "share_policy": True},
    # each id also alone against the heuristic bot through the served adapters (eval.vs_bot's GPU path)
    "eval": {**CONFIG["eval"], "vs_bot": True},  # type: ignore[dict-item]
}


CONVERSATION = {
    **CONFIG,
    "name": "gpu-e2e-conversation",
    "description": "a bargaining seat's turns as one conversation: token prompts that extend each other on vLLM",
    "game": {"id": "bargaining_v1", "variant": "medium", "bot": "heuristic"},
    # the model: a tiny one with 4,096 positions (built by the test; "tiny" has 512, less than one
    # conversation: a bargaining seat's first prompt alone is ~540 of its tokens)
    "policies": [{**CONFIG["policies"][0], "id": "seller", "seats": [1]}],  # type: ignore[index]
    "rollout": {
        "mode": "service",
        "episodes_per_update": 8,
        "group_size": 4,
        "max_tokens": 12,
        "prompt": "conversation",
        "max_prompt_tokens": 3000,
    },
    "batch": {"layout": "episode", "max_prompt_len": 4096, "max_response_len": 4096},
    "eval": {"every": 2, "episodes": 8},
}


def _train_on_the_gpu(tmp_path: Path, config: dict[str, object]) -> tuple[str, Path, list[dict[str, float]]]:
    """``wolfpack train`` of ``config`` in a subprocess (as a user runs it); its output, run directory and
    metrics rows."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("vllm")
    pytest.importorskip("verl")
    cfg = tmp_path / f"{config['name']}.yaml"
    cfg.write_text(yaml.safe_dump(config))
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "WOLFPACK_REDIS_URL"}
    env.update(WOLFPACK_RUN_DIR=str(tmp_path / "wp"), WOLFPACK_BASE_PORT="0")
    proc = subprocess.run(
        [sys.executable, "-m", "wolfpack.cli.main", "train", "-c", str(cfg), "--run-dir", str(run)],
        env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "learning: win_rate" in out, out[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return out, run, rows


def test_wolfpack_train_uses_the_gpu_for_learner_and_inference(tmp_path: Path) -> None:
    out, run, rows = _train_on_the_gpu(tmp_path, CONFIG)
    updates = [r for r in rows if "perf/learner_max_memory_gb" in r]
    assert len(updates) == 2, rows
    assert all(r["perf/learner_max_memory_gb"] > 0 for r in updates)  # the update ran on the card
    assert all(abs(r["mismatch/abs_logprob_diff"]) < 0.1 for r in updates)  # vLLM samples the pushed weights
    versions = sorted(p.name for p in (run / "policies" / "responder").iterdir())
    assert versions[-1] == "v000003", versions  # v1 = initial weights pushed, then one per update
    stack_log = (run / "stack" / "up.log").read_text() if (run / "stack" / "up.log").exists() else ""
    assert "vllm" in stack_log.lower() or "vllm" in out.lower(), stack_log[-2000:]


def test_a_shared_lora_policy_updates_once_and_serves_both_engines(tmp_path: Path) -> None:
    """``train.share_policy`` on the card: one learner update per step over both seats' samples, each version
    written once (the other id's directory hard links) and served by both ids' vLLM engines; ``eval.vs_bot``
    plays each id alone against the heuristic bot through them."""
    out, run, rows = _train_on_the_gpu(tmp_path, SHARED)
    updates = [r for r in rows if "perf/learner_max_memory_gb" in r]
    assert len(updates) == 2, rows
    for r in updates:
        assert r["actor/optimizer_steps"] >= 1 and not any(k.startswith("proposer/actor/") for k in r), r
        assert abs(r["mismatch/abs_logprob_diff"]) < 0.1, r  # both engines sample the pushed adapter
        assert r["perf/episode_s"] >= r["perf/episode_generate_s"] > 0, r  # the episodes' time split
    last = {pid: sorted((run / "policies" / pid).iterdir())[-1] for pid in ("proposer", "responder")}
    assert [p.name for p in last.values()] == ["v000003", "v000003"], last
    for written in last["proposer"].iterdir():
        assert (last["responder"] / written.name).stat().st_ino == written.stat().st_ino, written.name
    assert "time per update" in out and "evaluation (median of" in out, out[-3000:]
    for pid in ("proposer", "responder"):
        assert f"learning vs-bot[{pid}]: win_rate" in out, out[-3000:]
        assert any(f"eval_vs_bot/{pid}/win_rate" in r for r in rows if r["step"] == 2), rows


def test_conversation_prompts_extend_each_other_through_vllm(tmp_path: Path) -> None:
    """``rollout.prompt: conversation`` with the job's vLLM: each seat's prompts are sent as token ids that
    extend the previous prompt + answer, so the episode layout trains fewer sequences than turns (a
    restart over the budget begins a new one), with vLLM's logprobs matching the learner's. On CPU (local
    mode, the CPU learner) the same config gave 48 turns -> 8 samples, one per game."""
    from wolfpack.models import tiny_model

    model = str(tiny_model(tmp_path / "models", max_positions=4096))
    config = {**CONVERSATION, "policies": [{**CONVERSATION["policies"][0], "model": model}]}  # type: ignore[index]
    _, _, rows = _train_on_the_gpu(tmp_path, config)
    updates = [r for r in rows if "batch/turns" in r]
    assert len(updates) == 2, rows
    for r in updates:
        assert 0 < r["batch/samples"] < r["batch/turns"], r
        assert r["batch/samples"] <= r["batch/trajectories"] + r["batch/split_sequences"], r
        assert abs(r["mismatch/abs_logprob_diff"]) < 0.1, r
