"""LoRA on a warm-started base through the services: ``wolfpack train`` (real CLI process, real launcher,
services and Redis; tiny model, CPU learner, transformers inference) warm-starts *before* its stack starts,
the stack's inference serves the clone as the base, and each version's LoRA adapter is pushed onto it.

Run 1 is fresh and starts its own stack; run 2 resumes it on a running stack (a user's ``wolfpack up``
serving only ``default``) with a different model cache, so a second warm start would show as a second
clone. After run 2 the test asks the running inference itself: the policy's base model is the clone, the
version is the last pushed, and its logprobs on a fixed prompt are those of clone + that version's adapter,
not those of the clone alone (the adapter arrived) nor of the original model + adapter (the base is the
clone)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import inference_service_pb2 as inf_pb
from wolfpack.v1 import inference_service_pb2_grpc as inf_grpc
from wolfpack_inference.models import tiny_model
from wolfpack_trainer.config import load_config
from wolfpack_trainer.stack import child_stack
from wolfpack_trainer.warmstart import RECORD

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


def _config(path: Path, tiny: Path, stream: str) -> Path:
    cfg = {
        "name": "lora-warmstart-service",
        "game": {"id": "ultimatum_v1", "variant": "easy", "bot": "heuristic"},
        "policies": [
            {
                "id": "responder",
                "seats": [1],
                "learner": "cpu",
                "model": str(tiny),
                "lora_rank": 8,
                "lora_alpha": 16,
                "lr": 1e-2,
                "micro_batch_size": 8,
            },
        ],
        "warmstart": {"bot": "random", "episodes": 64, "steps": 60},
        "rollout": {
            "mode": "service",
            "episodes_per_update": 32,
            "group_size": 4,
            "max_tokens": 8,
            "max_prompt_tokens": 64,
        },
        "train": {"updates": 1, "checkpoint_every": 1},
        "eval": {"every": 100, "episodes": 2},
        "inference": {"backend": "transformers", "device": "cpu"},
        "stream": {"name": stream},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(cfg: Path, run: Path, settings_dir: Path, redis_url: str, *extra: str) -> str:
    env = {
        **os.environ,
        "WOLFPACK_RUN_DIR": str(settings_dir),
        "WOLFPACK_REDIS_URL": redis_url,
        "COLUMNS": "400",
    }
    cmd = [sys.executable, "-m", "wolfpack.cli.main", "train", "-c", str(cfg), "--run-dir", str(run), *extra]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=500)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    return done.stdout


def _logprobs(base: Path, adapter: Path | None, tokens: list[int]) -> torch.Tensor:
    """The logprobs of ``tokens`` after ``PROMPT`` under ``base`` (+ the peft ``adapter``), in process."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + tokens])).logits[0, len(PROMPT) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


async def _ask(addr: str) -> tuple[inf_pb.ListPoliciesResponse, inf_pb.GenerateResponse]:
    async with rpc.channel(addr, load_settings(rpc_timeout_s=60)) as ch:
        stub = inf_grpc.InferenceServiceStub(ch)
        listed = await stub.ListPolicies(inf_pb.ListPoliciesRequest())
        req = inf_pb.GenerateRequest(policy_id="responder")
        req.tokens.token_ids.extend(PROMPT)
        req.sampling.max_tokens = 6
        req.sampling.temperature = 0.0
        req.sampling.logprobs = True
        return listed, await stub.Generate(req)


@pytest.mark.slow
def test_lora_adapters_are_pushed_onto_the_warm_started_base(redis_url: str, tmp_path: Path) -> None:
    tiny = tiny_model(tmp_path / "models")
    cfg = _config(tmp_path / "cfg.yaml", tiny, f"test:lora-warm:{os.getpid()}:{time.monotonic_ns()}")
    run, job = tmp_path / "run", tmp_path / "job"  # job: the first run's settings dir (its model cache)

    first = _train(cfg, run, job, redis_url)
    assert first.count("warm start: cloning the random bot (64 episodes, 60 steps)") == 1, first
    assert "starting a stack for this job" in first
    clones = [p for p in (job / "models").iterdir() if p.name.startswith("warm-")]
    assert len(clones) == 1, clones
    clone = clones[0]
    assert f"warm start: serving {clone} (built in" in first
    record, built_at = (clone / RECORD).read_text(), (clone / RECORD).stat().st_mtime_ns
    # The job's stack was told to serve the clone; the learner trained from it; the sampler agreed.
    served = {
        p["policy_id"]: p["model"] for p in yaml.safe_load((run / "stack" / "policies.yaml").read_text())
    }
    # ... and the base model as configured, for the base evaluation (eval.base, on with a warm start)
    assert served == {"responder": str(clone), "base-responder": str(tiny)}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # The clone's build in the run's own metrics and summary (the clone's folder stays on the machine).
    setup = next(r for r in rows if "perf/setup_s" in r)
    assert setup["step"] == 0 and setup["warmstart/build_s"] == json.loads(record)["seconds"]
    assert setup["warmstart/pairs"] == json.loads(record)["pairs"] > 0
    assert "warm start: a clone of the random bot, " in first and " x 60 steps (fp32, cpu)" in first
    update = next(r for r in rows if "actor/pg_loss" in r)
    assert update["mismatch/abs_logprob_diff"] < 1e-3  # inference sampled with the learner's weights
    # 8 groups of 4 with a clone that wins some games: a group with mixed outcomes, so the adapter moves.
    assert update["actor/grad_norm"] > 0, "no gradient: the adapter would not move (advantages all 0?)"

    with child_stack(load_config(cfg), tmp_path / "up", {"default": str(tiny)}, timeout_s=300) as stack_dir:
        second = _train(cfg, run, stack_dir, redis_url, "train.updates=2")
        assert "warm start: cloning" not in second
        assert f"warm start: serving {clone} (the base this run's checkpoint was trained on" in second
        assert f"registered policy responder ({clone})" in second
        assert "resumed from the checkpoint of update 1" in second
        # No second warm start: the clone untouched, none in the second job's (empty) model cache.
        assert (clone / RECORD).read_text() == record and (clone / RECORD).stat().st_mtime_ns == built_at
        assert not list((stack_dir / "models").glob("warm-*"))

        addr = json.loads((stack_dir / "up.json").read_text())["services"]["inference"]
        listed, answer = asyncio.run(_ask(addr))

    state_dir = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()
    state = json.loads((state_dir / "state.json").read_text())
    assert state["step"] == 2 and state["model_path"] == str(clone)
    last = state["versions"]["responder"]
    assert last == 4  # run 1: v1 (start) and v2 (update 1); run 2: v3 (resumed start) and v4 (update 2)
    info = next(p for p in listed.policies if p.policy.policy_id == "responder")
    assert (info.base_model, info.policy.version) == (str(clone), last)
    assert answer.policy.version == last
    tokens, got = list(answer.completions[0].token_ids), torch.tensor(list(answer.completions[0].logprobs))
    adapter = run / "policies" / "responder" / f"v{last:06d}"
    assert (adapter / "adapter_config.json").exists()
    assert torch.allclose(got, _logprobs(clone, adapter, tokens), atol=1e-4)  # clone + the last adapter
    assert (got - _logprobs(clone, None, tokens)).abs().max() > 1e-3  # the adapter is no no-op
    before = run / "policies" / "responder" / f"v{last - 1:06d}"  # run 2's start: update 1's adapter again
    assert (got - _logprobs(clone, before, tokens)).abs().max() > 1e-3  # update 2's adapter arrived
    assert (got - _logprobs(tiny, adapter, tokens)).abs().max() > 1e-3  # the base is not the original
