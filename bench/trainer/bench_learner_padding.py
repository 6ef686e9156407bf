"""Bench: the ``verl_fsdp`` learner with micro-batches of rows of like length and short padding rows
(``extra.sort_by_length``, ``extra.short_padding_rows``, both on by default) against both off (verl's
shuffled order, padding rows as copies of row 0), side by side in one process on the same weights.

The shape is the 6-player Werewolf village PPO recipe's (configs/gpu-werewolf-6p-ppo-smollm2.yaml): actor
and critic, mini-batches of 128 in micro-batches of 8, two PPO epochs, one update's worth of turns (not a
multiple of 128, so padding rows), prompts of 300-700 tokens, answers of a few tokens (votes, night actions)
or up to 64 (speeches). Per variant: the two forward-only passes of an update (old log-probs, values), the
update (actor + critic), the share of computed tokens that were padding (``perf/learner_*_pad_frac``: a number
that does not depend on the device) and, after one update from the same state, how far the weights of the two
variants are apart against how far the update moved them.

    python bench/trainer/bench_learner_padding.py                       # CPU: tiny model, 120 turns, lengths
                                                                        #   x 0.25, mini-batches of 32, fp32
    python bench/trainer/bench_learner_padding.py --shape smollm2       # GPU (CUDA if available): full lengths

Rounds alternate the variants' order; the table gives medians and ratios (CPU timings are noisy and shared).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
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
VARIANTS = {"before (verl order, full padding rows)": False, "after (sorted, short padding rows)": True}


def werewolf_batch(n: int, scale: float, vocab: int, seed: int) -> TrainBatch:
    """``n`` village turns: prompts 300-700 tokens, 60 % decisions (answers of 3-12 tokens) and 40 % speeches
    (20-64), all lengths times ``scale``; left-padded prompts, right-padded answers, random advantages and
    returns (the bench measures cost, not learning)."""
    g = torch.Generator().manual_seed(seed)
    p_max, r_max = round(700 * scale), max(2, round(64 * scale))
    plen = (torch.randint(300, 701, (n,), generator=g).float() * scale).round().long().clamp(min=1)
    speech = torch.rand(n, generator=g) < 0.4
    rlen = torch.where(
        speech, torch.randint(20, 65, (n,), generator=g), torch.randint(3, 13, (n,), generator=g)
    )
    rlen = (rlen.float() * scale).round().long().clamp(1, r_max)
    return random_batch(
        plen,
        rlen,
        (p_max, r_max),
        vocab,
        g,
        policy="village",
        role="villager",
        turn=0,
        draw=("advantages", "returns"),
    )


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def weights(learner: Any) -> dict[str, torch.Tensor]:
    out = {f"actor.{k}": v.float().clone() for k, v in learner.export_weights().tensors.items()}
    critic = learner.workers.call("critic", "full_state", False)["model"]
    out.update({f"critic.{k}": v.float().clone() for k, v in critic.items()})
    return out


def gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def one_round(learner: Any, batch: TrainBatch, on: bool, device: str) -> dict[str, float]:
    learner.sort_by_length = learner.short_padding_rows = on
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    sync(device)
    t0 = time.perf_counter()
    learner.compute_log_probs(batch)
    learner.compute_values(batch)
    sync(device)
    t1 = time.perf_counter()
    metrics = learner.update(batch)
    sync(device)
    t2 = time.perf_counter()
    return {
        "infer_s": t1 - t0, "update_s": t2 - t1,
        "infer_pad": metrics["perf/learner_infer_pad_frac"], "train_pad": metrics["perf/learner_train_pad_frac"],
        "mem_gb": torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else 0.0,
    }  # fmt: skip


def token_shares(
    batch: TrainBatch, mini: int, micro: int, epochs: int, seed: int
) -> dict[bool, tuple[float, float]]:
    """Without a model: the padded share of the forward-only and training passes' tokens, per variant, from
    the orders the learner would hand verl (one rank; its own functions)."""
    from wolfpack_trainer.learners.verl.learner import infer_order, padded_tokens, train_order

    n = len(batch)
    real = batch.attention_mask.sum(-1).tolist()
    out = {}
    for on in (False, True):

        def lengths(multiple: int, on: bool = on) -> list[int]:
            return real + [2 if on else real[0]] * (-n % multiple)

        inf = lengths(micro)
        inf_order = infer_order(inf, 1) if on else list(range(len(inf)))
        tr = lengths(-(-min(mini, n) // micro) * micro)
        held_i, comp_i = padded_tokens(inf, inf_order, micro, n)
        held_t, comp_t = padded_tokens(
            tr, train_order(tr, 1, -(-min(mini, n) // micro) * micro, epochs, seed, sort=on), micro, n
        )
        out[on] = (1 - held_i / comp_i, 1 - held_t / comp_t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cuda = torch.cuda.is_available()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2" if cuda else "tiny")
    ap.add_argument("--device", default="cuda" if cuda else "cpu")
    ap.add_argument(
        "--samples", type=int, default=450 if cuda else 120, help="turns per update (recipe: 350-550)"
    )
    ap.add_argument("--scale", type=float, default=1.0 if cuda else 0.25, help="lengths x this")
    ap.add_argument("--mini", type=int, default=128 if cuda else 32)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per variant (after one warm-up each)")
    ap.add_argument(
        "--fp32",
        action=argparse.BooleanOptionalAction,
        default=not cuda,
        help="compute in float32 (default on CPU, where bf16 autocast is slow); else verl's bf16",
    )
    ap.add_argument(
        "--tokens-only",
        action="store_true",
        help="no model: only the padded-token shares of this shape (seconds, any machine)",
    )
    args = ap.parse_args()
    if args.tokens_only:
        probe = werewolf_batch(args.samples, args.scale, 64, seed=1)
        print(
            f"{args.samples} turns, lengths x {args.scale}, mini {args.mini}, micro {args.micro}, {args.epochs} epochs"
        )
        print("| variant | padded share, forward-only | padded share, training |\n| --- | --- | --- |")
        shares = token_shares(probe, args.mini, args.micro, args.epochs, seed=0)
        for name, on in VARIANTS.items():
            print(f"| {name} | {shares[on][0]:.1%} | {shares[on][1]:.1%} |")
        return

    device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, n_params = build_model(args.shape, Path(tmp) / "model", round(1100 * max(args.scale, 1.0)))
        vocab = int(SHAPES[args.shape]["vocab_size"])
        cfg = LearnerConfig(
            model=str(model_dir), lr=5e-6, mini_batch_size=args.mini, micro_batch_size=args.micro,
            ppo_epochs=args.epochs, device=args.device, value_head=True,
            loss=LossConfig(clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=0.001),
            extra={"strategy": "fsdp2", "critic_lr": 5e-5, "mixed_precision": FP32 if args.fp32 else None},
        )  # fmt: skip
        learner: Any = get_learner("verl_fsdp")(cfg)
        batch = werewolf_batch(args.samples, args.scale, vocab, seed=1)
        learner.sort_by_length = learner.short_padding_rows = False
        batch.old_log_probs = learner.compute_log_probs(batch)
        batch.values = learner.compute_values(batch)
        learner.update(batch)  # the optimisers get their moments; every round starts from this state
        state = learner.state_dict()
        rows: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        after: dict[bool, dict[str, torch.Tensor]] = {}
        start = weights(learner)
        for r in range(args.rounds + 1):  # round 0 warms up each variant (allocator, kernels): not counted
            for on in (False, True) if r % 2 == 0 else (True, False):
                learner.load_state_dict(state)
                got = one_round(learner, batch, on, args.device)
                if r:
                    rows[on].append(got)
                else:
                    after[on] = weights(learner)

    lengths = batch.attention_mask.sum(-1)
    tokens = int(lengths.sum())
    print(f"verl_fsdp learner, actor + critic, on {device_name}: random {args.shape} ({n_params / 1e6:.1f}M params), "
          f"{args.samples} turns ({tokens} tokens, lengths {int(lengths.min())}-{int(lengths.max())}, "
          f"mean {lengths.float().mean():.0f}), mini {args.mini}, micro {args.micro}, {args.epochs} epochs, "
          f"{args.rounds} rounds\n")  # fmt: skip
    print("| variant | log-probs + values s | update s | padded share, forward-only | padded share, training |"
          " peak GB |\n| --- | --- | --- | --- | --- | --- |")  # fmt: skip
    med: dict[bool, dict[str, float]] = {}
    for name, on in VARIANTS.items():
        med[on] = {k: statistics.median(x[k] for x in rows[on]) for k in rows[on][0]}
        m = med[on]
        print(f"| {name} | {m['infer_s']:.2f} | {m['update_s']:.2f} | {m['infer_pad']:.1%} | {m['train_pad']:.1%} "
              f"| {m['mem_gb']:.1f} |")  # fmt: skip
    b, a = med[False], med[True]
    print(f"| ratio before/after | {b['infer_s'] / a['infer_s']:.2f}x | {b['update_s'] / a['update_s']:.2f}x | "
          f"computed tokens {(1 - a['infer_pad']) / (1 - b['infer_pad']):.2f}x fewer | "
          f"computed tokens {(1 - a['train_pad']) / (1 - b['train_pad']):.2f}x fewer | |")  # fmt: skip
    moved = gap(after[False], start)
    print(f"\nweights after one update from the same state: max |after - before| {gap(after[True], after[False]):.2e}"
          f" vs max |step| {moved:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
