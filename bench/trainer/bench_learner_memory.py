"""Bench: where the ``verl_fsdp`` learner's memory per micro-batch goes (no padding removal, sdpa), and what
``extra.entropy_checkpointing`` / ``extra.gradient_checkpointing`` / ``extra.fused_kernels`` take off it, on the
CPU.

Why: the Werewolf village recipe trains SmolLM2-135M at micro-batch 8 because 32 ran out of memory beside
vLLM on an H100 (23.5 GB allocated at 8). A micro-batch's logits are ``rows x longest x 49,152`` and verl's
padded path keeps several full-vocabulary tensors of that shape for the backward; the transformer layers keep
their activations. This bench runs one actor update of ONE micro-batch per variant, each in a fresh process,
on a model of SmolLM2's width and vocabulary (fewer layers: the per-layer part is reported per layer), bf16
compute as on the GPU, and reports:

* the bytes autograd saved for the backward (``saved_tensors_hooks``, unique storages), split into
  vocabulary-sized tensors (last dimension = vocab: logits, softmax, log-prob blocks) and the rest;
* the process's peak resident memory during the update above its level before (``VmHWM`` reset through
  ``/proc/self/clear_refs``), a CPU stand-in for ``max_memory_allocated``;
* how far the variant's weights after the update are from the first variant's (the options must not change
  the result).

    python bench/trainer/bench_learner_memory.py                    # 4 rows x 512 tokens, 2 and 4 layers

CPU only: the GPU's caching allocator and kernels differ, the saved-tensor bytes do not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
for sub in ("libs", "services/trainer", "services/inference", "bench/trainer"):
    if str(ROOT / sub) not in sys.path:
        sys.path.insert(0, str(ROOT / sub))

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    # the learner's log-probs before they had their own backward (gather + float32 block log-sum-exp under
    # autograd, which keeps a float32 copy of the logits), for a side-by-side comparison
    "log-probs by autograd (before)": {"autograd_logprobs": True},
    # verl's engine option, not a learner key (it does not lower the peak, see the results note): set on the
    # engine the learner built
    "entropy_checkpointing": {"entropy_checkpointing": True},
    "gradient_checkpointing": {"gradient_checkpointing": True},
    # verl's fused-kernel forward (torch backend): log-probs and entropy from the hidden states, 512 tokens at
    # a time, recomputed in the backward: no full-vocabulary tensor is kept
    "fused_kernels": {"fused_kernels": True},
    "fused_kernels + gradient_checkpointing": {"fused_kernels": True, "gradient_checkpointing": True},
}


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def autograd_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    flat = logits.reshape(-1, logits.shape[-1])
    picked = flat.gather(-1, labels.reshape(-1, 1)).squeeze(-1).float()
    lse = torch.cat([torch.logsumexp(block.float(), dim=-1) for block in torch.split(flat, 4096)])
    return (picked - lse).view(labels.shape)


def child(args: argparse.Namespace) -> None:
    """One variant in this (fresh) process; prints one JSON line."""
    from bench_learner_microbatch import uniform_batch
    from verl_learner_bench import SHAPES, build_model

    from wolfpack_trainer.learners.base import LearnerConfig, LossConfig, get_learner

    torch.set_num_threads(2)
    spec = dict(SHAPES["smollm2"], num_hidden_layers=args.layers)
    SHAPES["mem"] = spec
    model_dir, _ = build_model(
        "mem", Path(args.tmp) / f"model-{args.layers}", args.prompt + args.response + 8
    )
    extra = dict(VARIANTS[args.variant])
    autograd = extra.pop("autograd_logprobs", False)
    entropy_ckpt = extra.pop("entropy_checkpointing", False)
    cfg = LearnerConfig(
        model=str(model_dir), lr=1e-4, mini_batch_size=args.rows, micro_batch_size=args.rows, ppo_epochs=1,
        device="cpu", loss=LossConfig(clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=args.entropy),
        extra={"strategy": "fsdp2", **extra},
    )  # fmt: skip
    learner: Any = get_learner("verl_fsdp")(cfg)
    object.__setattr__(learner.engine.engine_config, "entropy_checkpointing", entropy_ckpt)  # a frozen field
    if autograd:
        import verl.utils.torch_functional as verl_f

        verl_f.logprobs_from_logits_v2 = autograd_logprobs
    vocab = int(spec["vocab_size"])
    batch = uniform_batch(args.rows, args.prompt, args.response, vocab)
    batch.old_log_probs = learner.compute_log_probs(batch)
    seen: set[int] = set()
    saved = {"vocab": 0, "other": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t.values() if t.is_nested else t  # nested (jagged) tensors: their packed values
        try:
            storage = base.untyped_storage()
            key, size = storage._cdata, storage.nbytes()  # the storage itself, not its address: FSDP2 frees
            # gathered parameters by resizing their storage, so an address can come back in another tensor
        except RuntimeError:  # tensor subclasses without a plain storage
            key, size = id(base), base.numel() * base.element_size()
        if key not in seen:
            seen.add(key)
            saved["vocab" if base.dim() and base.shape[-1] == vocab else "other"] += size
        return t

    before = rss_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        learner.update(batch)
    peak = rss_kb("VmHWM")
    weights = learner.export_weights().tensors
    torch.save(
        {k: v.float() for k, v in weights.items()},
        Path(args.tmp) / f"w-{args.layers}-{list(VARIANTS).index(args.variant)}.pt",
    )
    print(
        json.dumps(
            {"saved_vocab": saved["vocab"], "saved_other": saved["other"], "peak": (peak - before) * 1024}
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=480)
    ap.add_argument("--response", type=int, default=32)
    ap.add_argument("--layers", default="2,4", help="comma-separated: per-layer part from the difference")
    ap.add_argument("--entropy", type=float, default=0.001, help="entropy_coeff (the recipe's)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.variant, args.layers = args.child, int(args.layers)
        child(args)
        return
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")  # big tensors come from mmap: freed = returned
    tokens = args.rows * (args.prompt + args.response)
    rows: dict[tuple[int, str], dict[str, float]] = {}
    layers = [int(x) for x in args.layers.split(",")]
    variants = args.variants.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for n in layers:
            for v in variants:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", v, "--layers", str(n), "--tmp", tmp, "--rows", str(args.rows),
                     "--prompt", str(args.prompt), "--response", str(args.response), "--entropy", str(args.entropy)],
                    env=env, capture_output=True, text=True, check=True,
                )  # fmt: skip
                rows[(n, v)] = json.loads(out.stdout.strip().splitlines()[-1])
                first = torch.load(Path(tmp) / f"w-{n}-{list(VARIANTS).index(variants[0])}.pt")
                mine = torch.load(Path(tmp) / f"w-{n}-{list(VARIANTS).index(v)}.pt")
                rows[(n, v)]["gap"] = max((first[k] - mine[k]).abs().max().item() for k in first)
    gb = 2**30
    print(f"verl_fsdp actor update of one micro-batch on cpu, bf16 compute: SmolLM2 width and vocab (49,152), "
          f"{args.rows} rows x {args.prompt + args.response} tokens = {tokens} tokens, entropy_coeff {args.entropy}\n")  # fmt: skip
    print("| layers | variant | saved for backward: vocab-sized GB | other GB | per token, vocab-sized KB "
          "| peak RSS above start GB | max weight gap to default |\n| --- | --- | --- | --- | --- | --- | --- |")  # fmt: skip
    for (n, v), r in rows.items():
        print(f"| {n} | {v} | {r['saved_vocab'] / gb:.3f} | {r['saved_other'] / gb:.3f} | "
              f"{r['saved_vocab'] / tokens / 1024:.0f} | {r['peak'] / gb:.2f} | {r['gap']:.1e} |")  # fmt: skip
    if len(layers) >= 2:
        a, b = layers[0], layers[-1]
        print(f"\nper decoder layer (from {a} vs {b} layers), saved for backward per token:")
        for v in variants:
            per = (rows[(b, v)]["saved_other"] - rows[(a, v)]["saved_other"]) / (b - a) / tokens
            print(f"  {v}: {per / 1024:.1f} KB per token per layer")


if __name__ == "__main__":
    main()
