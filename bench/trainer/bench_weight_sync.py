"""How long a new policy version takes to reach a real inference service: ``PushWeights`` (tensors streamed
over gRPC) against the same-host path (``LoadPolicy`` of the version directory the learner just wrote),
interleaved rounds in one run, through ``wolfpack_trainer.publish.Publisher`` as the trainer calls it.

    .venv/bin/python bench/trainer/bench_weight_sync.py                 # ~120M-parameter random model, CPU
    .venv/bin/python bench/trainer/bench_weight_sync.py --hidden 64 --layers 2 --rounds 10   # the test model
    python3 bench/trainer/bench_weight_sync.py --model /tmp/wp/models/smollm2-135m-instruct --backend vllm

The model is a random-weight Qwen2 built from a config (``--hidden``/``--layers``; the default is about
SmolLM2-135M's size without its large vocabulary), or ``--model DIR``. ``save`` (writing the version
directory) is paid by both ways when versions are saved (``train.save_versions``, the default); ``sync`` is
from the directory written to inference confirming the new version. On a shared CPU only the ratio of the
two ways means anything; absolute times only on a GPU host (``--backend vllm``), naming the card.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path
from typing import Any


async def _serve(model: str, backend: str, device: str, cache: Path) -> tuple[Any, Any, str]:
    from wolfpack import rpc
    from wolfpack.settings import load_settings
    from wolfpack_inference.config import PolicyConfig
    from wolfpack_inference.policies import PolicyRegistry
    from wolfpack_inference.server import InferenceServicer, register

    cfg: dict[str, Any] = {"policy_id": "p", "model": model, "backend": backend, "device": device}
    if backend == "transformers":
        cfg["dtype"] = "float32"
    registry = PolicyRegistry.from_configs([PolicyConfig(**cfg)], cache)
    server = await rpc.start_server(
        "inference", lambda s: register(s, InferenceServicer(registry)), load_settings(), "127.0.0.1:0"
    )
    return server, registry, f"127.0.0.1:{server.port}"


async def main(args: argparse.Namespace) -> None:
    import torch

    from wolfpack.models import tiny_model
    from wolfpack_trainer.learners import LearnerConfig, get_learner
    from wolfpack_trainer.publish import Publisher

    with tempfile.TemporaryDirectory(prefix="wolfpack-bench-sync-") as tmp:
        root = Path(tmp)
        model = args.model or str(tiny_model(root / "models", hidden_size=args.hidden, layers=args.layers))
        learner = get_learner("cpu")(LearnerConfig(model=model, device=args.learner_device))
        params = sum(p.numel() for p in learner.model.parameters())
        server, registry, addr = await _serve(model, args.backend, args.device, root / "inference")
        try:
            times: dict[str, list[tuple[float, float]]] = {"push": [], "path": []}
            version = 0
            for r in range(args.rounds + 1):  # round 0 warms both ways up, not counted
                for way in ("push", "path") if r % 2 == 0 else ("path", "push"):
                    version += 1
                    with torch.no_grad():  # a new version: weights that differ from the served ones
                        next(learner.model.parameters()).add_(1e-3)
                    pub = Publisher(root / "policies", inference_addr=addr, weight_sync=way)  # type: ignore[arg-type]
                    done = await pub.publish("p", version, learner)
                    assert done.sync == way, (done.sync, way)
                    if r:
                        times[way].append((done.save_s, done.push_s))
                print(f"round {r}/{args.rounds}", flush=True)
        finally:
            await server.stop(0)
            await registry.close()

    def cell(values: list[float]) -> str:
        return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"

    print(f"\n{params / 1e6:.1f}M parameters, backend {args.backend} ({args.device}), {args.rounds} rounds")
    print("| way | save s (min / median / max) | sync s (min / median / max) | save + sync, median |")
    print("| --- | --- | --- | --- |")
    med = {}
    for way, rows in times.items():
        saves, syncs = [s for s, _ in rows], [p for _, p in rows]
        med[way] = statistics.median(s + p for s, p in rows)
        print(f"| {way} | {cell(saves)} | {cell(syncs)} | {med[way]:.3f} |")
    print(f"\npath / push (save + sync, medians): {med['path'] / med['push']:.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default="", help="a model directory (default: a random Qwen2 from --hidden/--layers)"
    )
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    ap.add_argument("--device", default="cpu", help="inference device (transformers backend)")
    ap.add_argument("--learner-device", default="cpu")
    ap.add_argument("--rounds", type=int, default=6)
    asyncio.run(main(ap.parse_args()))
