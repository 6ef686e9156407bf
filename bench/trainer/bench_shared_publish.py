"""A learner shared by several policy ids (``train.share_policy``): what one version costs to publish, and
one checkpoint to save, with the per-id loops the trainer had (``Publisher.publish`` per id: a directory
written and the weights exported once per id; ``Learner.save`` per id) against once per learner
(``Publisher.publish_learner``: one directory write, the other ids' directories hard links, one export; one
``Learner.save``). Interleaved rounds in one run, a real inference service (transformers backend, CPU) serving
every id, each id receiving every version either way.

    .venv/bin/python bench/trainer/bench_shared_publish.py                        # the test model, LoRA
    .venv/bin/python bench/trainer/bench_shared_publish.py --lora-rank 0 --hidden 576 --layers 30

On a shared CPU only the ratios mean anything.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


async def _serve(model: str, ids: list[str], cache: Path) -> tuple[Any, Any, str]:
    from wolfpack import rpc
    from wolfpack.settings import load_settings
    from wolfpack_inference.config import PolicyConfig
    from wolfpack_inference.policies import PolicyRegistry
    from wolfpack_inference.server import InferenceServicer, register

    configs = [PolicyConfig(policy_id=p, model=model, device="cpu", dtype="float32") for p in ids]  # type: ignore[arg-type]
    registry = PolicyRegistry.from_configs(configs, cache)
    server = await rpc.start_server(
        "inference", lambda s: register(s, InferenceServicer(registry)), load_settings(), "127.0.0.1:0"
    )
    return server, registry, f"127.0.0.1:{server.port}"


async def main(args: argparse.Namespace) -> None:
    import torch

    from wolfpack.models import tiny_model
    from wolfpack_trainer.learners import LearnerConfig, get_learner
    from wolfpack_trainer.publish import Publisher

    ids = [f"policy{i}" for i in range(args.ids)]
    with tempfile.TemporaryDirectory(prefix="wolfpack-bench-shared-") as tmp:
        root = Path(tmp)
        model = str(tiny_model(root / "models", hidden_size=args.hidden, layers=args.layers))
        learner = get_learner("cpu")(LearnerConfig(model=model, lora_rank=args.lora_rank))
        trainable = sum(p.numel() for p in learner.model.parameters() if p.requires_grad)
        server, registry, addr = await _serve(model, ids, root / "inference")
        times: dict[tuple[str, str], list[float]] = {}
        version = 0
        try:
            for r in range(args.rounds + 1):  # round 0 warms every way up, not counted
                for sync in args.sync:
                    pub = Publisher(root / "policies", inference_addr=addr, weight_sync=sync)  # type: ignore[arg-type]
                    for way in ("per id", "once") if r % 2 == 0 else ("once", "per id"):
                        version += 1
                        with torch.no_grad():  # a new version: weights unlike the served ones
                            next(p for p in learner.model.parameters() if p.requires_grad).add_(1e-3)
                        t0 = time.perf_counter()
                        if way == "per id":  # the trainer's loop before: each id on its own
                            done = [await pub.publish(pid, version, learner) for pid in ids]
                        else:
                            done = await pub.publish_learner(learner, [(pid, version) for pid in ids])
                        elapsed = time.perf_counter() - t0
                        assert [(d.policy_id, d.version, d.sync) for d in done] == [
                            (p, version, sync) for p in ids
                        ]
                        if r:
                            times.setdefault((f"publish ({sync})", way), []).append(elapsed)
                            times.setdefault((f"  of which save ({sync})", way), []).append(
                                sum(d.save_s for d in done)
                            )
                            times.setdefault((f"  of which sync ({sync})", way), []).append(
                                sum(d.push_s for d in done)
                            )
                for way in ("per id", "once") if r % 2 == 0 else ("once", "per id"):
                    ckpt = root / "checkpoints" / f"r{r}-{way.replace(' ', '')}"
                    t0 = time.perf_counter()
                    for pid in ids if way == "per id" else ids[:1]:
                        learner.save(ckpt / f"learner-{pid}")
                    if r:
                        times.setdefault(("checkpoint learners", way), []).append(time.perf_counter() - t0)
                print(f"round {r}/{args.rounds}", flush=True)
        finally:
            await server.stop(0)
            await registry.close()

    def cell(values: list[float]) -> str:
        return f"{min(values):.4f} / {statistics.median(values):.4f} / {max(values):.4f}"

    kind = f"LoRA rank {args.lora_rank}" if args.lora_rank else "full weights"
    print(
        f"\n{args.ids} policy ids on one learner, {kind} ({trainable:,} trainable parameters, "
        f"hidden {args.hidden}, {args.layers} layers), {args.rounds} rounds"
    )
    print("| what | per id s (min / median / max) | once s (min / median / max) | once / per id (medians) |")
    print("| --- | --- | --- | --- |")
    for what in dict.fromkeys(w for w, _ in times):
        before, after = times[(what, "per id")], times[(what, "once")]
        ratio = statistics.median(after) / statistics.median(before)
        print(f"| {what} | {cell(before)} | {cell(after)} | {ratio:.2f}x |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ids", type=int, default=2, help="policy ids sharing the learner")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--sync", nargs="+", default=["push", "path"], choices=["push", "path"])
    asyncio.run(main(ap.parse_args()))
