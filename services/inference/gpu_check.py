"""GPU check of the vLLM backend (vLLM 0.24, one GPU). Standalone: run it on the lent GPU machine.

    . /tmp/site/env.sh && python3 services/inference/gpu_check.py [--out /tmp/gpu_check.json]

It builds a random-weight small Qwen2 (hidden 256, 2 layers, head_dim 64, locally trained tokenizer) with
transformers, saves it under /tmp, starts ``VLLMBackend`` (``AsyncLLM``, v1 engine) and checks:

1. greedy determinism: the same prompt alone, twice, and inside a batch of 16 gives identical ids;
2. logprobs of sampled tokens vs. a teacher-forced transformers forward on prompt + completion
   (float32 engine vs a float32 reference: reports the max abs diff; passes under 0.1);
3. seeded sampling is reproducible;
4. (bfloat16 engine with LoRA, whose kernels need half precision) a LoRA switch (peft adapter with non-zero
   B): requests in flight report version 0, later ones version 1, the adapter changes the greedy output and
   its logprobs match a float32 peft reference as closely as the base model's do (x2); a full-weight update
   on that engine is refused with a clear error;
5. (same LoRA engine) a LoRA pushed as tensors + config (``PolicyRegistry.push``, the PushWeights path): requests
   in flight keep the previous version, the pushed adapter changes the output and matches a float32 peft
   reference within the same tolerance, a rank-mismatched push is INVALID_ARGUMENT and changes nothing, and
   the pushed adapter's temporary directory is deleted once a newer push replaced it;
6. (float32 engine, no LoRA) a full weight update without restart (checkpoint dir → ``collective_rpc``), then a PushWeights-style
   update from in-memory tensors back to the original weights: outputs change, then return exactly.

It prints one line per check and a JSON report; exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# The engine process imports the worker extension by name: it must find this package too.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
for key, value in {
    "VLLM_HOST_IP": "127.0.0.1", "VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
}.items():  # fmt: skip
    os.environ.setdefault(key, value)

from wolfpack_inference.backends.base import Request, Sampling  # noqa: E402
from wolfpack_inference.config import PolicyConfig  # noqa: E402
from wolfpack_inference.models import perturbed_copy, tiny_model  # noqa: E402

REPORT: dict[str, Any] = {"checks": {}}


def record(name: str, ok: bool, **info: Any) -> None:
    REPORT["checks"][name] = {"ok": ok, **info}
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: {json.dumps(info, default=str)}", flush=True)


def hf_logprobs(model_dir: Path, prompt: list[int], completion: list[int], adapter: str = "") -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    ids = torch.tensor([prompt + completion], device="cuda")
    with torch.no_grad():
        logp = model(ids).logits.float().log_softmax(-1)[0]
    return [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(completion)]


def lora_model(model_dir: Path, seed: int = 1) -> Any:
    """A peft LoRA (rank 8) on the base with non-zero B, so it changes the output."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return peft_model


def make_lora(model_dir: Path, out: Path, seed: int = 1) -> Path:
    lora_model(model_dir, seed).save_pretrained(out)
    return out


async def run(work: Path) -> None:
    """Engine A (float32, no LoRA): exact checks and full-weight updates. Engine B (bfloat16, LoRA: vLLM's
    LoRA kernels take only half precision): the adapter switch with requests in flight."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from wolfpack_inference.backends.vllm_backend import VLLMBackend
    from wolfpack_inference.prompts import render_chat

    model_dir = tiny_model(work, hidden_size=256, layers=2)
    tok = AutoTokenizer.from_pretrained(model_dir)
    REPORT["model"] = str(model_dir)
    cfg = PolicyConfig(
        policy_id="check", backend="vllm", model=str(model_dir), dtype="float32", enforce_eager=True,
        gpu_memory_utilization=0.3, max_batch=64, enable_lora=False, max_loras=2, max_lora_rank=8,
    )  # fmt: skip
    started = time.perf_counter()
    backend = VLLMBackend(str(model_dir), cfg)
    REPORT["engine_start_s"] = round(time.perf_counter() - started, 1)
    print(f"engine A (float32) up in {REPORT['engine_start_s']} s", flush=True)
    prompt = render_chat(tok, [{"role": "user", "content": "Bob says: vote Carol. Who is the wolf?"}])
    greedy = Sampling(max_tokens=24, temperature=0.0, logprobs=True)

    async def gen(engine: Any, s: Sampling, ids: list[int] = prompt) -> Any:
        return await engine.generate(Request(s, ids))

    def max_diff(ref: list[float], got: list[float]) -> float:
        return max(abs(x - y) for x, y in zip(ref, got, strict=True))

    # 1. greedy determinism: alone twice and inside a batch of 16
    a, b = await gen(backend, greedy), await gen(backend, greedy)
    batch = await asyncio.gather(*[gen(backend, greedy) for _ in range(16)])
    ids0 = a.completions[0].token_ids
    same = ids0 == b.completions[0].token_ids and all(r.completions[0].token_ids == ids0 for r in batch)
    record("greedy_determinism", same and len(ids0) > 0, tokens=len(ids0))

    # 2. logprobs vs a float32 transformers forward
    diff = max_diff(hf_logprobs(model_dir, prompt, ids0), a.completions[0].logprobs)
    record("logprobs_vs_transformers", diff < 0.1, max_abs_diff=round(diff, 5), dtype="float32")

    # 3. seeded sampling
    seeded = Sampling(
        max_tokens=24, temperature=1.0, top_p=0.9, seed=7, n=2
    )  # top_p: no logprobs (convention)
    s1, s2 = await gen(backend, seeded), await gen(backend, seeded)
    record(
        "seeded_sampling", [c.token_ids for c in s1.completions] == [c.token_ids for c in s2.completions],
        distinct_samples=len({tuple(c.token_ids) for c in s1.completions}),
    )  # fmt: skip

    # 4. full weight update from a checkpoint dir, then pushed tensors back to the original weights
    try:
        v2 = perturbed_copy(model_dir, work / "tiny-v2", scale=0.5)
        before = await backend.weight_checksum()
        await backend.load(2, model_path=str(v2))
        r2 = await gen(backend, greedy)
        changed = await backend.weight_checksum()
        diff2 = max_diff(hf_logprobs(v2, prompt, r2.completions[0].token_ids), r2.completions[0].logprobs)
        original = load_file(str(model_dir / "model.safetensors"))
        await backend.update_weights(3, original, is_adapter=False)
        r3 = await gen(backend, greedy)
        ok = (r2.version == 2 and r3.version == 3 and r2.completions[0].token_ids != ids0
              and r3.completions[0].token_ids == ids0 and diff2 < 0.1 and changed != before)  # fmt: skip
        record("weight_update", ok, checksum_changed=changed != before, v2_logprob_max_abs_diff=round(diff2, 5),
               restored_original_output=r3.completions[0].token_ids == ids0)  # fmt: skip
    except Exception as exc:
        record("weight_update", False, error=repr(exc), trace=traceback.format_exc()[-800:])

    # 5. streaming equals unary
    chunks = [c async for c in backend.stream(Request(greedy, prompt))]
    final = await gen(backend, greedy)
    streamed = [t for c in chunks for t in c.token_ids]
    record("stream_matches_unary", streamed == final.completions[0].token_ids, chunks=len(chunks))
    await backend.close()

    # 6. engine B: LoRA switch with requests in flight (bfloat16)
    lora_engine = VLLMBackend(
        str(model_dir), cfg.model_copy(update={"dtype": "bfloat16", "enable_lora": True})
    )
    base_diff: float | None = None
    try:
        base = await gen(lora_engine, greedy)
        base_ids = base.completions[0].token_ids
        base_diff = max_diff(hf_logprobs(model_dir, prompt, base_ids), base.completions[0].logprobs)
        lora_dir = make_lora(model_dir, work / "lora-v1")
        long = Sampling(max_tokens=200, temperature=0.0)
        inflight = [asyncio.create_task(gen(lora_engine, long)) for _ in range(8)]
        await asyncio.sleep(0.05)
        await lora_engine.load(1, adapter_path=str(lora_dir))
        after = await gen(lora_engine, greedy)
        old = await asyncio.gather(*inflight)
        lora_ids = after.completions[0].token_ids
        lora_ref = hf_logprobs(model_dir, prompt, lora_ids, adapter=str(lora_dir))
        lora_diff = max_diff(lora_ref, after.completions[0].logprobs)
        # bf16 vs a float32 reference: the adapter must be as close as the base model is (x2), not exact
        tolerance = max(0.1, 2 * base_diff)
        ok = (
            all(r.version == 0 for r in old)
            and after.version == 1
            and lora_ids != base_ids
            and lora_diff < tolerance
        )
        record("lora_switch", ok, inflight_versions=sorted({r.version for r in old}), new_version=after.version,
               changed_output=lora_ids != base_ids, base_bf16_max_abs_diff=round(base_diff, 5),
               lora_bf16_max_abs_diff=round(lora_diff, 5), tolerance=round(tolerance, 5))  # fmt: skip
        refused = False
        try:
            await lora_engine.load(9, model_path=str(model_dir))
        except Exception as exc:
            refused = "enable_lora=false" in str(exc)
        record("weight_update_refused_with_lora", refused)
    except Exception as exc:
        record("lora_switch", False, error=repr(exc), trace=traceback.format_exc()[-800:])

    # 7. engine B: a LoRA pushed as tensors + config (the PushWeights path: checks, a temp PEFT directory,
    # then the adapter_path load), with requests in flight; a malformed push changes nothing; the pushed
    # directory is deleted once a newer version replaced it and its requests finished.
    try:
        from wolfpack_inference.backends.base import InferenceError
        from wolfpack_inference.policies import Policy, PolicyRegistry
        from wolfpack_inference.push import peft_adapter

        registry = PolicyRegistry(work, [Policy(lora_engine.cfg, lora_engine)])
        pushed_model = lora_model(model_dir, seed=2)
        ref_dir = work / "lora-pushed-ref"
        pushed_model.save_pretrained(ref_dir)  # only for the float32 peft reference
        state, config_json = peft_adapter(pushed_model)
        before = await gen(lora_engine, greedy)
        v = lora_engine.version
        long = Sampling(max_tokens=200, temperature=0.0)
        inflight = [asyncio.create_task(gen(lora_engine, long)) for _ in range(8)]
        await asyncio.sleep(0.05)
        await registry.push("check", v + 1, state, True, config_json)
        pushed_dir = Path(lora_engine.adapter)
        after = await gen(lora_engine, greedy)
        old = await asyncio.gather(*inflight)
        ids = after.completions[0].token_ids
        ref = hf_logprobs(model_dir, prompt, ids, adapter=str(ref_dir))
        diff = max_diff(ref, after.completions[0].logprobs)
        tolerance = max(0.1, 2 * base_diff) if base_diff is not None else 0.35
        refused = ""
        try:
            bad = json.dumps(json.loads(config_json) | {"r": 4})
            await registry.push("check", v + 2, state, True, bad)
        except InferenceError as exc:
            refused = exc.code.value if "rank mismatch" in str(exc) else str(exc)
        unchanged = await gen(lora_engine, greedy)
        kept = pushed_dir.is_dir()
        next_state, next_config = peft_adapter(lora_model(model_dir, seed=3))
        await registry.push("check", v + 2, next_state, True, next_config)
        await gen(lora_engine, greedy)
        replaced = lora_engine.version == v + 2 and not pushed_dir.exists()
        # The same adapter saved by peft and loaded by path must give exactly what the push gave: same
        # engine, same bf16 kernels. (The float32 peft reference differs by bf16 rounding, which grows
        # with the adapter's size: reported, and held to a looser bound.)
        await lora_engine.load(v + 3, adapter_path=str(ref_dir))
        loaded = await gen(lora_engine, greedy)
        same_as_load = loaded.completions[0].token_ids == ids
        push_vs_load = (
            max_diff(loaded.completions[0].logprobs, after.completions[0].logprobs) if same_as_load else 1e9
        )
        ok = (
            all(r.version == v for r in old)
            and after.version == v + 1
            and ids != before.completions[0].token_ids
            and same_as_load
            and push_vs_load < 1e-3
            and diff < 2 * tolerance
            and refused == "INVALID_ARGUMENT"
            and unchanged.version == v + 1
            and unchanged.completions[0].token_ids == ids
            and kept
            and replaced
        )
        record("lora_push", ok, inflight_versions=sorted({r.version for r in old}), new_version=after.version,
               changed_output=ids != before.completions[0].token_ids, same_as_loaded_by_path=same_as_load,
               push_vs_load_max_abs_diff=push_vs_load, lora_bf16_vs_fp32_max_abs_diff=round(diff, 5),
               fp32_tolerance=round(2 * tolerance, 5), bad_push=refused,
               unchanged_after_bad_push=unchanged.version == v + 1, dir_kept_while_current=kept,
               dir_removed_after_replace=replaced)  # fmt: skip
    except Exception as exc:
        record("lora_push", False, error=repr(exc), trace=traceback.format_exc()[-800:])
    await lora_engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/wolfpack-gpu-check", help="models and adapters go here")
    ap.add_argument("--out", default="/tmp/wolfpack-gpu-check/report.json")
    ap.add_argument("--hang-timeout-s", type=int, default=500, help="dump stacks and exit if stuck")
    args = ap.parse_args()
    faulthandler.dump_traceback_later(args.hang_timeout_s, exit=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    try:
        import torch
        import vllm  # type: ignore[import-not-found]

        REPORT["versions"] = {
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(),
        }
        print(REPORT["versions"], flush=True)
        asyncio.run(run(work))
    except Exception as exc:
        record("run", False, error=repr(exc), trace=traceback.format_exc()[-1500:])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(REPORT, indent=2, default=str))
    print(json.dumps(REPORT, indent=2, default=str))
    sys.exit(0 if REPORT["checks"] and all(c["ok"] for c in REPORT["checks"].values()) else 1)


if __name__ == "__main__":
    main()
