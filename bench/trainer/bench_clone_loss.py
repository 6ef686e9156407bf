"""Memory and time of one warm-start (behaviour-cloning) step: the model's own loss (logits at every position)
vs ``warmstart.response_loss`` (logits only where an answer token is predicted), on a random-weight model of
SmolLM2-135M's shape with Werewolf-like rows: long prompts, a few answer tokens.

    python bench/trainer/bench_clone_loss.py                      # CPU: 4 rows x 1,024 tokens, 8 answer tokens
    python bench/trainer/bench_clone_loss.py --rows 16 --tokens 4096 --device cuda

Each variant runs in its own process (peak RSS on the CPU, ``max_memory_allocated`` on CUDA), alternating over
``--rounds``; the table gives the median and the range, and the ratio of the two in the same round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
               intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True)  # fmt: skip


def one(variant: str, rows: int, tokens: int, answer: int, device: str, layers: int) -> dict[str, float]:
    """One forward + backward of ``variant`` in this process; its peak memory and seconds."""
    import resource

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    sys.path.insert(0, str(ROOT / "services/trainer"))
    sys.path.insert(0, str(ROOT / "libs"))
    from wolfpack_trainer.warmstart import response_loss

    torch.manual_seed(0)
    cfg = LlamaConfig(**{**SMOLLM2, "num_hidden_layers": layers})
    model = AutoModelForCausalLM.from_config(cfg).to(device)
    ids = torch.randint(0, cfg.vocab_size, (rows, tokens), device=device)
    att = torch.ones_like(ids)
    labels = torch.full_like(ids, -100)
    labels[:, -answer:] = ids[:, -answer:]
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    if variant == "full":
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
    else:
        loss = response_loss(model, ids, att, labels)
    loss.backward()
    seconds = time.perf_counter() - t0
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        peak_gb = (torch.cuda.max_memory_allocated() - base) / 1e9
    else:
        peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux
    return {"peak_gb": peak_gb, "seconds": seconds, "loss": float(loss)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--answer", type=int, default=8, help="answer tokens per row (the labels)")
    ap.add_argument("--layers", type=int, default=30, help="decoder layers (SmolLM2 has 30)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.rows, args.tokens, args.answer, args.device, args.layers)))
        return 0
    results: dict[str, list[dict[str, float]]] = {"full": [], "response": []}
    for _ in range(args.rounds):
        for variant in results:
            cmd = [sys.executable, __file__, "--one", variant, "--rows", str(args.rows), "--tokens",
                   str(args.tokens), "--answer", str(args.answer), "--device", args.device, "--layers",
                   str(args.layers)]  # fmt: skip
            out = (
                subprocess.run(cmd, check=True, capture_output=True, text=True)
                .stdout.strip()
                .splitlines()[-1]
            )
            results[variant].append(json.loads(out))
    unit = "peak RSS GB" if args.device == "cpu" else "peak allocated GB"
    print(f"{args.rows} rows x {args.tokens} tokens, {args.answer} answer tokens each, {args.layers} layers, "
          f"{args.device}, {args.rounds} alternating rounds")  # fmt: skip
    print(f"| loss | {unit}, median (min-max) | s, median (min-max) | loss value |")
    print("| --- | --- | --- | --- |")
    for variant, runs in results.items():
        mem = [r["peak_gb"] for r in runs]
        sec = [r["seconds"] for r in runs]
        print(f"| {variant} | {statistics.median(mem):.2f} ({min(mem):.2f}-{max(mem):.2f}) | "
              f"{statistics.median(sec):.2f} ({min(sec):.2f}-{max(sec):.2f}) | {runs[0]['loss']:.4f} |")  # fmt: skip
    ratios = [r["peak_gb"] / f["peak_gb"] for f, r in zip(results["full"], results["response"], strict=True)]
    print(f"response / full peak memory, same round: median {statistics.median(ratios):.2f} "
          f"({min(ratios):.2f}-{max(ratios):.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
