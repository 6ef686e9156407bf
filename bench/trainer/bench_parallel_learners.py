"""IPPO's two learners one after the other against side by side (``train.parallel_learners``): one update
(``Trainer.train_step``: old log-probs, reference, values for GAE, the optimiser steps) and one publish (each
learner's version directory written; no inference service here) of two CPU learners, on the same played
episodes, in interleaved rounds of two trainers built alike. Real parts: the trainer, verl's estimators, the
CPU learner, the publisher's directories.

    .venv/bin/python bench/trainer/bench_parallel_learners.py                       # the test model
    .venv/bin/python bench/trainer/bench_parallel_learners.py --hidden 256 --layers 8 --rounds 6

On a shared CPU only the ratios mean anything, and on a 2-core machine one learner's torch already uses both
cores, so side by side mostly overlaps the Python around the passes and the file writes: the GPU is where the
setting is meant to pay (a learner there leaves the card mostly idle), measured with
``bench/trainer/gpu_hold_x4.sh`` (``PLAN=s22``, card 3).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _trainer(root: Path, model: str, args: argparse.Namespace, parallel: bool) -> Any:
    from wolfpack_trainer.config import TrainConfig
    from wolfpack_trainer.train import Trainer

    policy: dict[str, Any] = {"model": model, "lr": 1e-3, "value_head": args.estimator == "gae",
                              "mini_batch_size": 8, "ppo_epochs": 2}  # fmt: skip
    cfg = TrainConfig.model_validate(
        {
            "name": "bench-ippo",
            "game": {"id": "ultimatum_v1", "variant": "easy"},
            "policies": [{"id": "proposer", "seats": [0], **policy}, {"id": "responder", "seats": [1], **policy}],
            "rollout": {"episodes_per_update": args.episodes, "group_size": 4, "max_tokens": 16,
                        "max_prompt_tokens": 1500},
            "algo": {"estimator": args.estimator},
            "batch": {"layout": "turn", "group_by": ["group", "role"]},
            "train": {"parallel_learners": parallel, "max_staleness": 1},
        }
    )  # fmt: skip
    name = "parallel" if parallel else "serial"
    t = Trainer(cfg, root / name, "redis://unused", cache_dir=root / "cache")
    t.setup()
    return t


def main(args: argparse.Namespace) -> None:
    import torch

    from wolfpack.models import tiny_model

    with tempfile.TemporaryDirectory(prefix="wolfpack-bench-ippo-") as tmp:
        root = Path(tmp)
        model = str(
            tiny_model(root / "models", hidden_size=args.hidden, layers=args.layers, max_positions=2048)
        )
        trainers = {
            way: _trainer(root, model, args, way == "side by side")
            for way in ("one after the other", "side by side")
        }
        first = trainers["one after the other"]
        trajs = first.play_local(first.tasks(list(range(args.episodes // 4)), 4, "bench"), 1.0)
        for i, traj in enumerate(trajs):  # the tiny model's answers score alike: spread the returns by hand
            for o in traj.outcomes:
                o.final_reward = float(i % 5 - 2) * (1 if o.seat == 0 else -1)
        params = sum(p.numel() for p in first.learners["proposer"].model.parameters())
        times: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds + 1):  # round 0 warms both up, not counted
            for way in list(trainers) if r % 2 == 0 else list(reversed(trainers)):
                t = trainers[way]
                t0 = time.perf_counter()
                t.train_step(trajs)
                t1 = time.perf_counter()
                asyncio.run(t.publish_current())
                t2 = time.perf_counter()
                if r:
                    for what, s in (("update", t1 - t0), ("publish", t2 - t1), ("update + publish", t2 - t0)):
                        times.setdefault((what, way), []).append(s)
            print(f"round {r}/{args.rounds}", flush=True)

    def cell(values: list[float]) -> str:
        return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"

    print(
        f"\nIPPO, two CPU learners ({params:,} parameters each: hidden {args.hidden}, {args.layers} layers), "
        f"{args.estimator}, {len(trajs)} episodes an update, {args.rounds} rounds, torch threads "
        f"{torch.get_num_threads()}"
    )
    print("| what | one after the other s (min / median / max) | side by side s | side by side / one after the other (medians) |")  # fmt: skip
    print("| --- | --- | --- | --- |")
    for what in dict.fromkeys(w for w, _ in times):
        a, b = times[(what, "one after the other")], times[(what, "side by side")]
        print(f"| {what} | {cell(a)} | {cell(b)} | {statistics.median(b) / statistics.median(a):.2f}x |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--episodes", type=int, default=16, help="episodes an update (groups of 4)")
    ap.add_argument("--estimator", default="gae", choices=["grpo", "gae"])
    ap.add_argument("--rounds", type=int, default=8)
    main(ap.parse_args())
