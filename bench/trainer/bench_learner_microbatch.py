"""Bench: what one micro-batch costs the ``verl_fsdp`` learner, split into a fixed part (Python in verl's
engine and our learner, FSDP2 hooks, op dispatch, host syncs) and a part that grows with the tokens.

Why: on one H100 the Werewolf village recipe (SmolLM2-135M, micro-batch 8) spent ~0.25 s per micro-batch
forward+backward while an earlier bench at micro-batch 32 took ~0.3 s for 4x the tokens, which points at a
cost per micro-batch that does not depend on its size. On the CPU the model's own compute is slow, so the
fixed part is measured on a model with SmolLM2's *depth* (30 decoder layers: the same number of FSDP2 units,
hooks and ops per micro-batch) but a tiny width, where almost all of the time is that overhead.

    python bench/trainer/bench_learner_microbatch.py                 # the sweep: same rows, micro 2..32, a fit
    python bench/trainer/bench_learner_microbatch.py --profile 2     # cProfile + torch op counts at micro 2

The sweep runs one actor + critic update (and the two forward-only passes) over the same rows at each
micro-batch size, rounds alternating the order, and fits ``time = fixed x micro-batches + rest`` by least
squares per pass. CPU only numbers: the fixed part is CPU time that a GPU run also spends on its host (the
GPU waits through it whenever a micro-batch's kernels are shorter, as they are at SmolLM2's size).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
for sub in ("libs", "services/trainer", "services/inference", "bench/trainer"):
    if str(ROOT / sub) not in sys.path:
        sys.path.insert(0, str(ROOT / sub))

from verl_learner_bench import SHAPES, build_model  # noqa: E402

from wolfpack_trainer.learners.base import LearnerConfig, LossConfig, TrainBatch, get_learner  # noqa: E402
from wolfpack_trainer.learners.synthetic import random_batch  # noqa: E402

FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
# SmolLM2-135M's depth and head layout at a width where compute is negligible on a CPU
SHAPES["deep"] = dict(arch="llama", hidden_size=64, num_hidden_layers=30, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, vocab_size=2048, tie_word_embeddings=True)  # fmt: skip


def uniform_batch(n: int, prompt: int, response: int, vocab: int, seed: int = 1) -> TrainBatch:
    """``n`` rows all ``prompt + response`` tokens long: no padding inside a micro-batch, so every micro-batch
    size computes exactly the same tokens and only the number of micro-batches changes."""
    g = torch.Generator().manual_seed(seed)
    full = torch.full((n,), prompt), torch.full((n,), response)
    return random_batch(*full, (prompt, response), vocab, g, turn=0, draw=("advantages", "returns"))


def make_learner(model_dir: Path, micro: int, mini: int, entropy: float, extra: dict[str, Any]) -> Any:
    cfg = LearnerConfig(
        model=str(model_dir), lr=1e-5, mini_batch_size=mini, micro_batch_size=micro, ppo_epochs=1, device="cpu",
        value_head=True, loss=LossConfig(clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=entropy),
        extra={"strategy": "fsdp2", "critic_lr": 5e-5, "mixed_precision": FP32, **extra},
    )  # fmt: skip
    return get_learner("verl_fsdp")(cfg)


def set_micro(learner: Any, micro: int) -> None:
    """One learner for every size (building one per size would time different allocator states): the
    learner's own split and the micro-batch size verl's workers put into each batch they are handed."""
    learner._micro = learner._infer_micro = micro
    for worker in learner.workers.local.values():
        worker.engine_config.micro_batch_size_per_gpu = micro
        worker.engine_config.infer_micro_batch_size_per_gpu = micro


def one(learner: Any, batch: TrainBatch) -> tuple[float, float]:
    t0 = time.perf_counter()
    learner.compute_log_probs(batch)
    learner.compute_values(batch)
    t1 = time.perf_counter()
    learner.update(batch)
    return t1 - t0, time.perf_counter() - t1


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a x + b``: (a, b)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return a, my - a * mx


def sweep(learners: dict[str, Any], batch: TrainBatch, micros: list[int], rounds: int) -> None:
    """Every (variant, micro-batch size) once per round, the order reversed every other round; each variant
    restarts from its own state after the warm-up, so all sizes train the same step."""
    n = len(batch)
    states = {name: learner.state_dict() for name, learner in learners.items()}
    cells = [(name, m) for name in learners for m in micros]
    rows: dict[tuple[str, int], list[tuple[float, float]]] = {c: [] for c in cells}
    for r in range(rounds + 1):  # round 0 warms every cell up: not counted
        for name, m in cells if r % 2 == 0 else cells[::-1]:
            learner = learners[name]
            set_micro(learner, m)
            learner.load_state_dict(states[name])
            got = one(learner, batch)
            if r:
                rows[(name, m)].append(got)
    print("| variant | micro-batch | micro-batches per pass | log-probs + values s | update s (actor + critic) "
          "| per micro-batch fwd-only ms | per micro-batch fwd+bwd ms |\n| --- | --- | --- | --- | --- | --- | --- |")  # fmt: skip
    fits: dict[str, tuple[tuple[float, float], tuple[float, float]] | None] = {}
    for name in learners:
        xs, inf, upd = [], [], []
        for m in micros:
            i = statistics.median(x[0] for x in rows[(name, m)])
            u = statistics.median(x[1] for x in rows[(name, m)])
            k = n // m
            xs.append(float(k))
            inf.append(i)
            upd.append(u)
            print(
                f"| {name} | {m} | {k} | {i:.3f} | {u:.3f} | {i / (2 * k) * 1e3:.1f} | {u / (2 * k) * 1e3:.1f} |"
            )
        fits[name] = (fit(xs, inf), fit(xs, upd)) if len(micros) > 1 else None
    print(
        f"\nfit time = fixed x micro-batches + rest (same {int(batch.attention_mask.sum())} tokens at every size):"
    )
    for name, lines in fits.items():
        if lines is None:
            continue
        (a_i, b_i), (a_u, b_u) = lines
        print(f"  {name}: forward-only (log-probs + values) {a_i / 2 * 1e3:.1f} ms fixed per micro-batch per model, "
              f"{b_i:.3f} s rest; update (actor + critic) {a_u / 2 * 1e3:.1f} ms fixed per micro-batch per model, "
              f"{b_u:.3f} s rest")  # fmt: skip


# (label, file suffix, function name): summed cumulative time; nested rows are parts of the rows above them
BUCKETS = [
    ("verl train_batch (whole update)", "verl/workers/engine/base.py", "train_batch"),
    ("  forward_step (forward + loss)", "fsdp/transformer_impl.py", "forward_step"),
    ("    model forward, actor (HF Llama + FSDP2 hooks)", "models/llama/modeling_llama.py", "forward@443"),
    ("    model forward, critic (HF + FSDP2 hooks)", "transformers/modeling_layers.py", "forward@253"),
    ("      FSDP2 pre-forward hooks (unshard/all-gather per layer)", "_fully_shard/_fsdp_state.py", "_pre_forward"),
    ("      FSDP2 post-forward hooks (reshard per layer)", "_fully_shard/_fsdp_state.py", "_post_forward"),
    ("    TensorDict micro_batch.to(device)", "tensordict/base.py", "to"),
    ("    prepare_model_inputs (nested -> padded, mask)", "fsdp/transformer_impl.py", "prepare_model_inputs"),
    ("    prepare_model_outputs (logits -> log-probs, entropy)", "fsdp/transformer_impl.py", "prepare_model_outputs"),
    ("    ppo_loss (actor)", "verl/workers/utils/losses.py", "ppo_loss"),
    ("    value_loss (critic)", "verl/workers/utils/losses.py", "value_loss"),
    ("  loss.backward (autograd engine)", "torch/autograd/__init__.py", "backward"),
    ("    FSDP2 pre-backward hooks (unshard per layer)", "_fully_shard/_fsdp_state.py", "_pre_backward"),
    ("    FSDP2 post-backward (reshard, grad accumulation)", "_fully_shard/_fsdp_param_group.py", "post_backward"),
    ("  prepare_micro_batches (chunk_tensordict)", "verl/workers/engine/utils.py", "prepare_micro_batches"),
    ("  postprocess_batch_func", "verl/workers/engine/utils.py", "postprocess_batch_func"),
    ("  optimizer_step (clip + AdamW, per mini-batch)", "fsdp/transformer_impl.py", "optimizer_step"),
    ("  _gradient_sync_context", "fsdp/transformer_impl.py", "_gradient_sync_context"),
    ("wolfpack learner: TensorDict build (_tensordict)", "learners/verl/learner.py", "_tensordict"),
    ("wolfpack learner: train_order", "learners/verl/learner.py", "train_order"),
    ("Tensor.item() (a device sync on a GPU)", "~", "<method 'item' of 'torch._C.TensorBase' objects>"),
    ("Tensor.tolist() (a device sync on a GPU)", "~", "<method 'tolist' of 'torch._C.TensorBase' objects>"),
    ("Tensor.cpu() (a device sync on a GPU)", "~", "<method 'cpu' of 'torch._C.TensorBase' objects>"),
]  # fmt: skip


def buckets(st: pstats.Stats) -> list[tuple[str, float]]:
    raw: Any = st.stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, callers)}
    out = []
    for label, path, name in BUCKETS:
        fn, _, line = name.partition("@")
        cum = sum(
            v[3]
            for (f, ln, n), v in raw.items()
            if f.endswith(path) and n == fn and (not line or ln == int(line))
        )
        out.append((label, cum))
    return out


def profile(learner: Any, batch: TrainBatch, micro: int, top: int) -> None:
    """cProfile of one update (+ forward-only passes) and torch's op counts, per micro-batch."""
    set_micro(learner, micro)
    one(learner, batch)  # warm-up
    k = len(batch) // micro
    prof = cProfile.Profile()
    prof.enable()
    t0 = time.perf_counter()
    learner.update(batch)
    wall = time.perf_counter() - t0
    prof.disable()
    per = 2 * k  # actor and critic each run k micro-batches
    print(f"cProfile of one update at micro-batch {micro} ({k} micro-batches x actor + critic): {wall:.2f} s, "
          f"{wall / per * 1e3:.1f} ms per micro-batch (under the profiler)\n")  # fmt: skip
    st = pstats.Stats(prof)
    print(
        "| where (cumulative, the profiler's own cost included) | ms per micro-batch | share |\n| --- | --- | --- |"
    )
    for label, cum in buckets(st):
        print(f"| {label} | {cum / per * 1e3:.2f} | {cum / wall:.1%} |")
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("cumulative").print_stats(top)
    st.print_callers(r"\(item\)|\(tolist\)|\(cpu\)")
    print(s.getvalue())
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("tottime").print_stats(top)
    print(s.getvalue())

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as tp:
        learner.update(batch)
    counts: Counter[str] = Counter()
    total = 0
    for ev in tp.events():  # aten ops not called from inside another aten op: what the Python side issues
        parent = str(getattr(ev.cpu_parent, "name", ""))
        if ev.name.startswith("aten::") and not parent.startswith("aten::"):
            counts[ev.name] += 1
            total += 1
    print(f"top-level aten ops per micro-batch (actor + critic averaged): {total / per:.0f}")
    for name, c in counts.most_common(25):
        print(f"  {name:45s} {c / per:8.1f}")
    syncs = {
        n: counts[n] / per for n in ("aten::_local_scalar_dense", "aten::item", "aten::to", "aten::_to_copy")
    }
    print(f"host-sync candidates per micro-batch: {syncs}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="deep")
    ap.add_argument("--rows", type=int, default=64, help="rows per update (one mini-batch)")
    ap.add_argument("--prompt", type=int, default=24)
    ap.add_argument("--response", type=int, default=8)
    ap.add_argument("--micros", default="2,4,8,16,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--entropy", type=float, default=0.001, help="entropy_coeff (the recipe's)")
    ap.add_argument("--profile", type=int, default=0, help="profile at this micro-batch size instead")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument(
        "--extra",
        nargs="*",
        default=[],
        help="a second variant with these learner extra keys, KEY=JSON (gradient_checkpointing=true); "
        "the profile takes it",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)  # the shared CPU: one thread makes rounds comparable
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, n_params = build_model(args.shape, Path(tmp) / "model", args.prompt + args.response + 8)
        vocab = int(SHAPES[args.shape]["vocab_size"])
        batch = uniform_batch(args.rows, args.prompt, args.response, vocab)
        extra = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in args.extra)}
        learners = {"default": make_learner(model_dir, 8, args.rows, args.entropy, {})}
        if extra:
            learners[" ".join(args.extra)] = make_learner(model_dir, 8, args.rows, args.entropy, extra)
        first = next(iter(learners.values()))
        batch.old_log_probs = first.compute_log_probs(batch)
        batch.values = first.compute_values(batch)
        print(f"verl_fsdp learner on cpu (1 thread), random {args.shape} ({n_params / 1e6:.2f}M params, "
              f"{SHAPES[args.shape]['num_hidden_layers']} layers), actor + critic, {args.rows} rows of "
              f"{args.prompt}+{args.response} tokens, one mini-batch, 1 epoch, entropy_coeff {args.entropy}\n")  # fmt: skip
        if args.profile:
            profile(learners[list(learners)[-1]], batch, args.profile, args.top)
        else:
            sweep(learners, batch, [int(m) for m in args.micros.split(",")], args.rounds)


if __name__ == "__main__":
    main()
