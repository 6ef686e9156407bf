"""Bench of the ``verl_fsdp`` learner (verl 0.9.1 FSDP ``TrainingWorker``) on a random-weight Qwen2.

One command, one table: for each FSDP strategy, update time, tokens/s, losses, grad norm, how far the
parameters moved, and the learner's log-probs against a plain transformers forward of the same weights.

    python bench/trainer/verl_learner_bench.py --shape 0.5b              # on the GPU machine
    python bench/trainer/verl_learner_bench.py --shape tiny --device cpu --strategies fsdp2 --updates 1

Why random weights: no weights reach the GPU machine (no network); speed and correctness of the update
path do not depend on what the weights are.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
for sub in ("libs", "services/trainer", "services/inference"):
    if str(ROOT / sub) not in sys.path:
        sys.path.insert(0, str(ROOT / sub))

from wolfpack_trainer.learners.base import LearnerConfig, LossConfig, TrainBatch, get_learner  # noqa: E402
from wolfpack_trainer.learners.synthetic import random_batch  # noqa: E402

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=512, vocab_size=2048, tie_word_embeddings=False),
    # SmolLM2-135M-Instruct's shape (Llama): the model the GPU recipes train
    "smollm2": dict(arch="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True),
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
}  # fmt: skip


def build_model(shape: str, out: Path, max_positions: int) -> tuple[Path, int]:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    spec = dict(SHAPES[shape])
    llama = spec.pop("arch", "qwen2") == "llama"
    cfg = (LlamaConfig if llama else Qwen2Config)(**spec, max_position_embeddings=max_positions, bos_token_id=1,
                                                  eos_token_id=2, pad_token_id=0, attn_implementation="sdpa")  # fmt: skip
    torch.manual_seed(0)
    model = (LlamaForCausalLM if llama else Qwen2ForCausalLM)(cfg)
    model.save_pretrained(out)
    return out, sum(p.numel() for p in model.parameters())


def make_batch(n: int, p: int, r: int, vocab: int, seed: int) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    plen = torch.randint(p // 2, p + 1, (n,), generator=g)
    rlen = torch.randint(r // 2, r + 1, (n,), generator=g)
    batch = random_batch(plen, rlen, (p, r), vocab, g, uids=[f"g{i // 8}" for i in range(n)])
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)[:, None]
    batch.advantages = sign * batch.response_mask
    return batch


def hf_logprobs(model_dir: Path, batch: TrainBatch, device: str) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    r = batch.response_length
    outs = []
    with torch.no_grad():
        for i in range(0, len(batch), 8):
            mb = batch.select(list(range(i, min(i + 8, len(batch)))))
            logits = model(input_ids=mb.input_ids.to(device), attention_mask=mb.attention_mask.to(device),
                           position_ids=mb.position_ids.to(device)).logits[:, -r - 1 : -1].float()  # fmt: skip
            lp = torch.log_softmax(logits, -1).gather(-1, mb.responses.to(device).unsqueeze(-1)).squeeze(-1)
            outs.append(lp.cpu() * mb.response_mask)
    del model
    return torch.cat(outs)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def use_kernel(kernel: str) -> None:
    """``chunked``: the learner's block-wise log-probs; ``verl``: verl 0.9.1's own fallback without flash-attn
    (one kernel per row), to measure the difference side by side in one process."""
    import verl.utils.torch_functional as verl_f

    from wolfpack_trainer.learners.verl import workers

    verl_f.logprobs_from_logits_v2 = (
        workers.chunked_logprobs if kernel == "chunked" else verl_f.wolfpack_row_loop
    )


def run(strategy: str, model_dir: Path, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    cfg = LearnerConfig(
        model=str(model_dir), lr=args.lr, mini_batch_size=args.mini, micro_batch_size=args.micro, device=args.device,
        loss=LossConfig(clip_ratio=0.2, loss_agg_mode="token-mean"), extra={"strategy": strategy},
    )  # fmt: skip
    t0 = time.perf_counter()
    learner: Any = get_learner("verl_fsdp")(cfg)
    build_s = time.perf_counter() - t0
    batch = make_batch(args.batch, args.prompt, args.response, vocab, seed=1)
    sync(args.device)
    t0 = time.perf_counter()
    batch.old_log_probs = learner.compute_log_probs(batch)
    sync(args.device)
    logprob_s = time.perf_counter() - t0
    ref = hf_logprobs(model_dir, batch, args.device)
    mask = batch.response_mask
    lp_diff = ((batch.old_log_probs - ref).abs() * mask).max().item()
    before = learner.export_weights().tensors
    times, losses, norms = [], [], []
    for i in range(args.updates + 1):  # the first update warms up (allocator, kernels): not timed
        sync(args.device)
        t0 = time.perf_counter()
        metrics = learner.update(batch)
        sync(args.device)
        if i:
            times.append(time.perf_counter() - t0)
        losses.append(metrics["actor/pg_loss"])
        norms.append(metrics["actor/grad_norm"])
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
        with profile(activities=acts) as prof:
            t0 = time.perf_counter()
            learner.update(batch)
            sync(args.device)
        key = "cuda_time_total" if args.device.startswith("cuda") else "cpu_time_total"
        print(f"profiled update ({strategy}): {time.perf_counter() - t0:.2f} s wall")
        print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60))
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))
    after = learner.export_weights().tensors
    moved = max((after[k].float() - before[k].float()).abs().max().item() for k in before)
    new = learner.compute_log_probs(batch)
    gain = (
        (((new - batch.old_log_probs) * mask).sum(-1) / mask.sum(-1) * batch.advantages[:, 0]).mean().item()
    )
    tokens = int(batch.attention_mask.sum())
    row = {
        "strategy": strategy, "build_s": build_s, "logprob_s": logprob_s, "update_s": statistics.median(times),
        "update_min_s": min(times), "tokens": tokens, "tok_per_s": tokens / statistics.median(times),
        "optim_steps": metrics["actor/optimizer_steps"], "pg_loss": losses, "grad_norm": norms,
        "max_param_change": moved, "logprob_vs_hf": lp_diff, "adv_weighted_logprob_gain": gain,
    }  # fmt: skip
    del learner
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--strategies", default="fsdp2,fsdp", help="comma-separated: fsdp2, fsdp (FSDP1)")
    ap.add_argument("--batch", type=int, default=64, help="sequences per update")
    ap.add_argument("--prompt", type=int, default=256, help="prompt length (left-padded)")
    ap.add_argument("--response", type=int, default=256, help="response length (right-padded)")
    ap.add_argument("--mini", type=int, default=32, help="sequences per optimizer step")
    ap.add_argument("--micro", type=int, default=8, help="sequences per forward/backward")
    ap.add_argument("--updates", type=int, default=3, help="timed updates (after one warm-up)")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument(
        "--logprobs",
        default="chunked",
        help="comma-separated: chunked (the learner's), verl (verl's per-row fallback without flash-attn)",
    )
    ap.add_argument(
        "--profile", action="store_true", help="print torch.profiler's top ops of one more update"
    )
    args = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    console = Console(width=240)  # a wide table also when piped to a log
    device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, n_params = build_model(args.shape, Path(tmp) / "model", args.prompt + args.response + 8)
        vocab = int(SHAPES[args.shape]["vocab_size"])
        rows = []
        for kernel in args.logprobs.split(","):
            for strategy in args.strategies.split(","):
                with console.status(
                    f"{strategy}, {kernel} log-probs: build, log-probs, {args.updates + 1} updates"
                ):
                    get_learner("verl_fsdp")  # imports the learner, which installs the chunked kernel
                    use_kernel(kernel)
                    rows.append(
                        {**run(strategy, model_dir, args, vocab), "strategy": f"{strategy} ({kernel})"}
                    )
    table = Table(title=f"verl_fsdp learner on {device_name}: random Qwen2 {args.shape} ({n_params / 1e6:.1f}M params), "
                  f"batch {args.batch} x ({args.prompt}+{args.response}), mini {args.mini}, micro {args.micro}")  # fmt: skip
    for col in ("strategy", "build s", "log-probs s", "update s (median)", "tokens/s", "optimizer steps",
                "pg_loss per update", "grad_norm per update", "max |Δparam|", "max |logp - HF|",
                "adv-weighted Δlogp"):  # fmt: skip
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["strategy"], f"{r['build_s']:.1f}", f"{r['logprob_s']:.2f}", f"{r['update_s']:.3f}",
            f"{r['tok_per_s']:,.0f}", f"{r['optim_steps']:.0f}", " ".join(f"{x:+.4f}" for x in r["pg_loss"]),
            " ".join(f"{x:.3f}" for x in r["grad_norm"]), f"{r['max_param_change']:.2e}",
            f"{r['logprob_vs_hf']:.4f}", f"{r['adv_weighted_logprob_gain']:+.2e}",
        )  # fmt: skip
    console.print(table)
    if args.json:
        args.json.write_text(
            json.dumps(
                {"device": device_name, "shape": args.shape, "params": n_params, "rows": rows}, indent=2
            )
        )
    ok = all(r["max_param_change"] > 0 and r["adv_weighted_logprob_gain"] > 0 for r in rows)
    console.print(f"VERL_LEARNER_{'OK' if ok else 'FAIL'} device={device_name}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
