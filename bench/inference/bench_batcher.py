"""Static vs. continuous batching in the transformers backend, side by side in one process.

"static" is the backend as of ``--baseline-rev`` (the last commit before continuous batching), loaded from
``git show`` into a module of its own; "continuous" is the working tree's. Both load the same checkpoint
with the same settings and run the same workloads, alternately, so the ratios compare like with like on a
machine whose load drifts:

* ``equal``: ``--batch`` requests with equal prompt lengths and equal ``max_tokens`` (EOS ignored), sent
  at once. Nothing joins or leaves early, so this is continuous batching's pure overhead. Shown per
  wall-clock second and per CPU-second of this process (both threads): on a shared machine the CPU time
  is far less disturbed by other processes' load than the wall clock.
* ``mixed``: ``--requests`` requests arriving over time (exponential gaps, mean ``--gap-ms``), prompt
  lengths 8-200 and ``max_tokens`` long-tailed (most 8-32, some 128-256), as agents in a game send them.
  The makespan and per-request latency (arrival to result) are what continuous batching should cut.

CPU (tiny random Qwen2):   python bench/inference/bench_batcher.py
SmolLM2-135M:              python bench/inference/bench_batcher.py --model smollm2 --max-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT / "libs", ROOT / "services" / "inference"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from wolfpack_inference.backends.base import Request, Sampling  # noqa: E402
from wolfpack_inference.backends.transformers_backend import TransformersBackend  # noqa: E402
from wolfpack_inference.models import resolve_model  # noqa: E402

BACKEND_FILE = "services/inference/wolfpack_inference/backends/transformers_backend.py"
STATIC_REV = "029b2ab46733b712f68c9819e6ff1641afed752f"
"""The last commit whose transformers backend batched statically."""


def static_backend_class(rev: str) -> Any:
    """``TransformersBackend`` as of ``rev``, imported from the file's text at that commit."""
    source = subprocess.run(
        ["git", "show", f"{rev}:{BACKEND_FILE}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "static_transformers_backend.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("static_transformers_backend", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.TransformersBackend


def request(rng: random.Random, prompt_len: int, max_tokens: int) -> Request:
    return Request(
        Sampling(max_tokens=max_tokens, temperature=0.0), [rng.randrange(10, 900) for _ in range(prompt_len)]
    )


async def run_equal(backend: Any, batch: int, prompt_len: int, max_tokens: int) -> tuple[float, float]:
    """Wall-clock and process CPU seconds for ``batch`` equal requests sent at once."""
    rng = random.Random(0)
    reqs = [request(rng, prompt_len, max_tokens) for _ in range(batch)]
    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*[backend.generate(r) for r in reqs])
    return time.perf_counter() - t0, time.process_time() - c0


def mixed_workload(n: int, gap_ms: float, seed: int) -> list[tuple[float, Request]]:
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(1000 / gap_ms) if gap_ms > 0 else 0.0
        tokens = rng.randint(128, 256) if rng.random() < 0.15 else rng.randint(8, 32)
        out.append((t, request(rng, rng.randint(8, 200), tokens)))
    return out


async def run_mixed(backend: Any, work: list[tuple[float, Request]]) -> tuple[float, list[float]]:
    """Makespan and each request's latency (its arrival to its result), in seconds."""
    t0 = time.perf_counter()

    async def one(at: float, r: Request) -> float:
        await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        start = time.perf_counter()
        await backend.generate(r)
        return time.perf_counter() - start

    latencies = await asyncio.gather(*[one(at, r) for at, r in work])
    return time.perf_counter() - t0, list(latencies)


def in_turn(engines: dict[str, Any], round_no: int) -> list[tuple[str, Any]]:
    """The engines, in reverse order every other round: whichever runs second in a round measured up to
    10% slower on the loaded 2-core machine, whatever it was."""
    items = list(engines.items())
    return items if round_no % 2 == 0 else items[::-1]


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="tiny, smollm2, or a checkpoint path")
    ap.add_argument("--cache-dir", default=str(ROOT / ".wolfpack" / "models"))
    ap.add_argument("--baseline-rev", default=STATIC_REV)
    ap.add_argument("--batch", default="1,8,32", help="comma-separated batch sizes for the equal workload")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--gap-ms", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per workload; medians reported")
    ap.add_argument("--max-batch", type=int, default=32)
    args = ap.parse_args()

    path = resolve_model(args.model, Path(args.cache_dir))
    kw: dict[str, Any] = dict(device="cpu", dtype="float32", ignore_eos=True, max_batch=args.max_batch)
    engines = {
        "static": static_backend_class(args.baseline_rev)(path, **kw),
        "continuous": TransformersBackend(path, **kw),
    }
    for engine in engines.values():  # warm-up: first forward passes allocate and pick kernels
        await run_equal(engine, 4, args.prompt_len, 8)

    print(
        f"model {args.model}; static = {args.baseline_rev[:7]}; medians of {args.rounds} rounds, order alternating\n"
    )
    print("| workload | static | continuous | continuous / static |")
    print("| --- | --- | --- | --- |")
    for batch in [int(b) for b in args.batch.split(",")]:
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
        for r in range(args.rounds):
            for name, engine in in_turn(engines, r):
                times[name].append(await run_equal(engine, batch, args.prompt_len, args.max_tokens))
        label = f"equal: {batch} x ({args.prompt_len} prompt + {args.max_tokens} new)"
        for what, col in (("tokens/s", 0), ("tokens per CPU-second", 1)):
            tps = {
                name: batch * args.max_tokens / statistics.median(x[col] for x in t)
                for name, t in times.items()
            }
            print(
                f"| {label}: {what} | {tps['static']:.0f} | {tps['continuous']:.0f} "
                f"| {tps['continuous'] / tps['static']:.3f} |"
            )

    spans: dict[str, list[float]] = {name: [] for name in engines}
    lat: dict[str, list[list[float]]] = {name: [] for name in engines}
    for r in range(args.rounds):
        work = mixed_workload(args.requests, args.gap_ms, seed=r)
        for name, engine in in_turn(engines, r):
            span, latencies = await run_mixed(engine, work)
            spans[name].append(span)
            lat[name].append(latencies)
    tokens = statistics.mean(
        sum(r.sampling.max_tokens for _, r in mixed_workload(args.requests, args.gap_ms, seed=s))
        for s in range(args.rounds)
    )
    label = f"mixed: {args.requests} requests, mean gap {args.gap_ms:g} ms"
    rows = [
        ("makespan, s", [statistics.median(spans[n]) for n in engines]),
        ("tokens/s", [tokens / statistics.median(spans[n]) for n in engines]),
        ("latency p50, ms", [1000 * statistics.median(pct(x, 0.5) for x in lat[n]) for n in engines]),
        ("latency p90, ms", [1000 * statistics.median(pct(x, 0.9) for x in lat[n]) for n in engines]),
        ("latency mean, ms", [1000 * statistics.median(statistics.mean(x) for x in lat[n]) for n in engines]),
    ]
    for what, (static, continuous) in rows:
        print(f"| {label}: {what} | {static:.3g} | {continuous:.3g} | {continuous / static:.3f} |")
    for engine in engines.values():
        await engine.close()


if __name__ == "__main__":
    asyncio.run(main())
