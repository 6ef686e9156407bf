"""GPU check of the vLLM backend (vLLM 0.24, one GPU). Standalone: run it on the lent GPU machine.

    . /tmp/site/env.sh && python3 services/inference/gpu_check.py [--out /tmp/gpu_check.json]

It builds a random-weight small Qwen2 (hidden 256, 2 layers, head_dim 64, locally trained tokenizer) with
transformers, saves it under /tmp, starts ``VLLMBackend`` (``AsyncLLM``, v1 engine) and checks:

1. greedy determinism: the same prompt alone, twice, and inside a batch of 16 gives identical ids;
2. logprobs of sampled tokens vs. a teacher-forced transformers forward on prompt + completion
   (engine in float32 by default, vs a float32 reference: reports the max abs diff; passes under 0.1);
3. seeded sampling is reproducible;
4. a LoRA switch (peft adapter with non-zero B, saved to /tmp): requests in flight when it happens report
   version 0, later ones version 1, and the adapter changes the greedy output;
5. a full weight update without restart (checkpoint dir → ``collective_rpc``), then a PushWeights-style
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
DTYPE = "float32"


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


def make_lora(model_dir: Path, out: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    peft_model.save_pretrained(out)
    return out


async def run(work: Path) -> None:
    from transformers import AutoTokenizer

    from wolfpack_inference.backends.vllm_backend import VLLMBackend
    from wolfpack_inference.prompts import render_chat

    model_dir = tiny_model(work, hidden_size=256, layers=2)
    tok = AutoTokenizer.from_pretrained(model_dir)
    REPORT["model"] = str(model_dir)
    cfg = PolicyConfig(
        policy_id="check", backend="vllm", model=str(model_dir), dtype=DTYPE, enforce_eager=True,
        gpu_memory_utilization=0.3, max_batch=64, enable_lora=True, max_loras=2, max_lora_rank=8,
    )  # fmt: skip
    REPORT["dtype"] = DTYPE
    started = time.perf_counter()
    backend = VLLMBackend(str(model_dir), cfg)
    REPORT["engine_start_s"] = round(time.perf_counter() - started, 1)
    print(f"engine up in {REPORT['engine_start_s']} s", flush=True)
    prompt = render_chat(tok, [{"role": "user", "content": "Bob says: vote Carol. Who is the wolf?"}])
    greedy = Sampling(max_tokens=24, temperature=0.0, logprobs=True)

    async def gen(s: Sampling, ids: list[int] = prompt) -> Any:
        return await backend.generate(Request(s, ids))

    # 1. greedy determinism
    a, b = await gen(greedy), await gen(greedy)
    batch = await asyncio.gather(*[gen(greedy) for _ in range(16)])
    ids0 = a.completions[0].token_ids
    same = ids0 == b.completions[0].token_ids and all(r.completions[0].token_ids == ids0 for r in batch)
    record("greedy_determinism", same and len(ids0) > 0, tokens=len(ids0), text=a.completions[0].text[:60])

    # 2. logprobs vs transformers (fp32 reference)
    ref = hf_logprobs(model_dir, prompt, ids0)
    diff = max(abs(x - y) for x, y in zip(ref, a.completions[0].logprobs, strict=True))
    record("logprobs_vs_transformers", diff < 0.1, max_abs_diff=round(diff, 5), n=len(ref))

    # 3. seeded sampling
    seeded = Sampling(max_tokens=24, temperature=1.0, top_p=0.9, seed=7, n=2, logprobs=True)
    s1, s2 = await gen(seeded), await gen(seeded)
    record(
        "seeded_sampling", [c.token_ids for c in s1.completions] == [c.token_ids for c in s2.completions],
        distinct_samples=len({tuple(c.token_ids) for c in s1.completions}),
    )  # fmt: skip

    # 4. LoRA switch with requests in flight
    try:
        lora_dir = make_lora(model_dir, work / "lora-v1")
        long = Sampling(max_tokens=200, temperature=0.0)
        inflight = [asyncio.create_task(gen(long)) for _ in range(8)]
        await asyncio.sleep(0.05)
        await backend.load(1, adapter_path=str(lora_dir))
        after = await gen(greedy)
        old = await asyncio.gather(*inflight)
        lora_ids = after.completions[0].token_ids
        lora_ref = hf_logprobs(model_dir, prompt, lora_ids, adapter=str(lora_dir))
        lora_diff = max(abs(x - y) for x, y in zip(lora_ref, after.completions[0].logprobs, strict=True))
        ok = all(r.version == 0 for r in old) and after.version == 1 and lora_ids != ids0 and lora_diff < 0.1
        record("lora_switch", ok, inflight_versions=sorted({r.version for r in old}), new_version=after.version,
               changed_output=lora_ids != ids0, lora_logprob_max_abs_diff=round(lora_diff, 5))  # fmt: skip
    except Exception as exc:
        record("lora_switch", False, error=repr(exc), trace=traceback.format_exc()[-800:])

    # 5. full weight update (checkpoint dir), then pushed tensors back to the original weights. Full-weight
    # policies run without LoRA (vLLM's LoRA wrappers break base-weight reloads), so a second engine.
    refused = False
    try:
        await backend.load(9, model_path=str(model_dir))
    except Exception as exc:
        refused = "enable_lora=false" in str(exc)
    record("weight_update_refused_with_lora", refused)
    await backend.close()
    backend = VLLMBackend(str(model_dir), cfg.model_copy(update={"enable_lora": False}))
    try:
        from safetensors.torch import load_file

        v2 = perturbed_copy(model_dir, work / "tiny-v2", scale=0.5)
        before = await backend.weight_checksum()
        await backend.load(2, model_path=str(v2))
        r2 = await gen(greedy)
        changed = await backend.weight_checksum()
        ref2 = hf_logprobs(v2, prompt, r2.completions[0].token_ids)
        diff2 = max(abs(x - y) for x, y in zip(ref2, r2.completions[0].logprobs, strict=True))
        original = load_file(str(model_dir / "model.safetensors"))
        await backend.update_weights(3, original, is_adapter=False)
        r3 = await gen(greedy)
        ok = (r2.version == 2 and r3.version == 3 and r2.completions[0].token_ids != ids0
              and r3.completions[0].token_ids == ids0 and diff2 < 0.1 and changed != before)  # fmt: skip
        record("weight_update", ok, checksum_changed=changed != before, v2_logprob_max_abs_diff=round(diff2, 5),
               restored_original_output=r3.completions[0].token_ids == ids0)  # fmt: skip
    except Exception as exc:
        record("weight_update", False, error=repr(exc), trace=traceback.format_exc()[-800:])

    # streaming equals unary
    chunks = [c async for c in backend.stream(Request(greedy, prompt))]
    streamed = [t for c in chunks for t in c.token_ids]
    final = await gen(greedy)
    record("stream_matches_unary", streamed == final.completions[0].token_ids, chunks=len(chunks))
    await backend.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/wolfpack-gpu-check", help="models and adapters go here")
    ap.add_argument("--out", default="/tmp/wolfpack-gpu-check/report.json")
    ap.add_argument("--hang-timeout-s", type=int, default=500, help="dump stacks and exit if stuck")
    ap.add_argument(
        "--dtype", default="float32", help="engine dtype; float32 makes the logprob comparison exact-ish"
    )
    args = ap.parse_args()
    global DTYPE
    DTYPE = args.dtype
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
