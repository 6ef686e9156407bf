"""Generated tokens/s of the inference service over gRPC vs. the same engine called in process.

Both paths drive one backend object (same weights, same batcher), with the same batch sizes, prompt
lengths and token budgets, so the ratio is the cost of our gRPC layer (serialisation, the servicer,
the interceptors, the client), measured side by side in one run. Client and server share this process
and event loop, as a rollout worker colocated with the service would.

CPU (tiny random Qwen2):     python bench/inference/bench_inference.py
CPU (SmolLM2-135M):          python bench/inference/bench_inference.py --model smollm2 --batch-sizes 1,8
GPU (vLLM, 0.5B-shaped):     python bench/inference/bench_inference.py --backend vllm \\
                                 --model random-qwen2.5-0.5b --prompt-len 512 --max-tokens 256 --batch-sizes 64,256
                                 (unary Generate and GenerateBatch columns side by side: ``--grpc-mode both``)
Service CPU per call:        python bench/inference/bench_inference.py --backend replay \\
                                 --prompt-len 512 --max-tokens 256 --batch-sizes 64,128,256 --repeats 20

``--backend replay`` (bench only, ``replay_backend.py``) swaps the engine for one that answers at once with
precomputed ids/logprobs of the right sizes, so the table shows microseconds of CPU per call: in process
(the backend alone) and over gRPC; their difference is what the service path costs per call.

``--grpc-mode`` picks how a batch goes over gRPC: ``unary`` (one Generate call per prompt, concurrently),
``batch`` (one GenerateBatch call for the whole batch, results streamed back as they finish), or ``both``
(the default: both, interleaved with the in-process runs, as separate columns). ``--uncoalesced`` adds a
GenerateBatch column served with one message per finished request, to show what coalescing saves.
``--stream`` adds a GenerateBatchStream column: each batch one message of a long-lived call (``BatchStream``,
what the rollout driver sends), so the difference to the GenerateBatch column is what a call per batch costs.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT / "libs", ROOT / "services" / "inference"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from wolfpack_inference.backends.base import Backend, Request, Sampling  # noqa: E402
from wolfpack_inference.config import PolicyConfig  # noqa: E402
from wolfpack_inference.policies import Policy, PolicyRegistry, build_backend  # noqa: E402


def random_qwen_05b(cache_dir: Path) -> Path:
    """A random-weight model shaped like Qwen2.5-0.5B (bf16, no tokenizer): for GPU throughput only."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    out = cache_dir / "random-qwen2.5-0.5b"
    if (out / "config.json").exists():
        return out
    cfg = Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        tie_word_embeddings=True, rope_theta=1_000_000.0,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(out)
    return out


def _client_process(
    conn: Any,
    targets: dict[str, str],
    prompts: list[list[int]],
    max_tokens: int,
    temperature: float,
    logprobs: bool,
) -> None:
    """A separate client process (like a rollout worker): runs batch b in mode m on request (m names its
    server in ``targets``), answers (seconds, tokens)."""
    for p in (ROOT / "libs", ROOT / "services" / "inference"):
        sys.path.insert(0, str(p))
    from wolfpack import rpc
    from wolfpack.settings import load_settings
    from wolfpack.v1 import common_pb2
    from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc

    async def serve_requests() -> None:
        settings = load_settings(rpc_timeout_s=3600)
        channels = {m: rpc.channel(t, settings, traced=False) for m, t in targets.items()}
        stubs = {m: pb_grpc.InferenceServiceStub(c) for m, c in channels.items()}
        params = common_pb2.SamplingParams(max_tokens=max_tokens, temperature=temperature, logprobs=logprobs)
        while True:
            job = conn.recv()
            if job is None:
                break
            b, mode = job
            start = time.perf_counter()
            tokens = await _grpc_batch(stubs[mode], mode, prompts[:b], params)
            conn.send((time.perf_counter() - start, tokens))
        for c in channels.values():
            await c.close()

    asyncio.run(serve_requests())


_STREAMS: dict[int, Any] = {}
"""One ``BatchStream`` per stub, kept across batches (as a rollout worker keeps its one)."""


async def _grpc_batch(stub: Any, mode: str, prompts: list[list[int]], params: Any) -> int:
    """Send ``prompts`` over gRPC as a client would (requests built here, inside the timing): ``unary``
    as one Generate call each, concurrently; ``batch``/``batch-uncoalesced`` as one GenerateBatch through
    the client helper; ``batch-stream`` as one message of a long-lived GenerateBatchStream call
    (``BatchStream``). Returns the generated tokens."""
    from wolfpack.v1 import inference_service_pb2 as pb
    from wolfpack_inference.client import BatchStream, generate_batch

    if mode == "unary":
        reqs = [pb.GenerateRequest(policy_id="bench", tokens=pb.TokenPrompt(token_ids=p), sampling=params)
                for p in prompts]  # fmt: skip
        resps = await asyncio.gather(*[stub.Generate(r) for r in reqs])
        return sum(r.usage.completion_tokens for r in resps)
    batch = pb.GenerateBatchRequest()
    add = batch.requests.add
    for p in prompts:
        add(policy_id="bench", tokens=pb.TokenPrompt(token_ids=p), sampling=params)
    tokens = 0
    if mode == "batch-stream":
        stream = _STREAMS.get(id(stub)) or _STREAMS.setdefault(id(stub), BatchStream(stub))
        items = stream.generate_batch(batch)
    else:
        items = generate_batch(stub, batch)
    async for item in items:
        if item.response is None:
            raise RuntimeError(f"request {item.index} failed: {item.code.name} {item.message}")
        tokens += item.response.usage.completion_tokens
    return tokens


async def timed(fn: Callable[[], Awaitable[int]]) -> tuple[float, int, float]:
    """(wall seconds, tokens, CPU seconds of this process: less sensitive than wall time to other load)."""
    start, cpu = time.perf_counter(), time.process_time()
    tokens = await fn()
    return time.perf_counter() - start, tokens, time.process_time() - cpu


async def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    cache = Path(args.cache_dir)
    model = str(random_qwen_05b(cache)) if args.model == "random-qwen2.5-0.5b" else args.model
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    cfg = PolicyConfig(
        policy_id="bench", backend="transformers" if args.backend == "replay" else args.backend, model=model,
        device=args.device, dtype=args.dtype, max_batch=max(sizes), batch_wait_ms=args.batch_wait_ms,
        ignore_eos=True, enforce_eager=args.enforce_eager, gpu_memory_utilization=args.gpu_memory_utilization,
        enable_lora=False, torch_threads=args.torch_threads,
    )  # fmt: skip
    if args.backend == "replay":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from replay_backend import ReplayBackend

        backend: Backend = ReplayBackend()
    else:
        backend = build_backend(cfg, cache)
    vocab = len(backend.tokenizer) if backend.tokenizer is not None else 32000
    rng = random.Random(0)
    prompts = [[rng.randrange(3, vocab - 2) for _ in range(args.prompt_len)] for _ in range(max(sizes))]
    sampling = Sampling(
        max_tokens=args.max_tokens, temperature=args.temperature, seed=None, logprobs=args.logprobs
    )

    async def inproc(b: int) -> int:
        results = await asyncio.gather(*[backend.generate(Request(sampling, prompts[i])) for i in range(b)])
        return sum(len(c.token_ids) for r in results for c in r.completions)

    async def staggered(b: int) -> int:
        """In process, but requests arrive ``--stagger-us`` apart, as they trickle in over a socket."""

        async def one(i: int) -> Any:
            await asyncio.sleep(i * args.stagger_us / 1e6)
            return await backend.generate(Request(sampling, prompts[i]))

        results = await asyncio.gather(*[one(i) for i in range(b)])
        return sum(len(c.token_ids) for r in results for c in r.completions)

    modes = ["unary", "batch"] if args.grpc_mode == "both" else [args.grpc_mode]
    if args.uncoalesced:
        modes.append("batch-uncoalesced")
    if args.stream:
        modes.append("batch-stream")
    grpc_calls: dict[str, Callable[[int], Awaitable[int]]] = {}
    servicer_calls: dict[str, Callable[[int], Awaitable[int]]] = {}
    servers: list[Any] = []
    channels: list[Any] = []
    if not args.no_grpc:
        from wolfpack import rpc
        from wolfpack.settings import load_settings
        from wolfpack.v1 import common_pb2
        from wolfpack.v1 import inference_service_pb2 as pb
        from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc
        from wolfpack_inference.server import InferenceServicer, register

        registry = PolicyRegistry(cache, [Policy(cfg, backend)])
        settings = load_settings(rpc_timeout_s=3600)
        servicer = InferenceServicer(registry)
        server = await rpc.start_server("inference", lambda s: register(s, servicer), settings, "127.0.0.1:0")
        servers.append(server)
        targets = {m: f"127.0.0.1:{server.port}" for m in modes}
        if "batch-uncoalesced" in modes:  # a second server whose servicer sends a message per result
            uncoalesced = InferenceServicer(registry, coalesce=False)
            server = await rpc.start_server(
                "inference", lambda s: register(s, uncoalesced), settings, "127.0.0.1:0"
            )
            servers.append(server)
            targets["batch-uncoalesced"] = f"127.0.0.1:{server.port}"
        stubs: dict[str, Any] = {}
        for mode, target in targets.items():
            channels.append(rpc.channel(target, settings, traced=False))
            stubs[mode] = pb_grpc.InferenceServiceStub(channels[-1])
        params = common_pb2.SamplingParams(
            max_tokens=args.max_tokens, temperature=args.temperature, logprobs=args.logprobs
        )
        for mode in modes:

            async def via_grpc(b: int, mode: str = mode) -> int:
                return await _grpc_batch(stubs[mode], mode, prompts[:b], params)

            grpc_calls[mode] = via_grpc

        async def via_servicer(b: int) -> int:
            """The servicer's own work (request → Policy.prepare → backend → response proto), no transport:
            replay mode shows it between the backend alone and the whole gRPC path."""
            reqs = [pb.GenerateRequest(policy_id="bench", tokens=pb.TokenPrompt(token_ids=prompts[i]), sampling=params)
                    for i in range(b)]  # fmt: skip
            resps = await asyncio.gather(*[servicer.Generate(r, None) for r in reqs])
            return sum(r.usage.completion_tokens for r in resps)

        async def via_servicer_batch(b: int) -> int:
            """GenerateBatch's servicer work alone: the batch request built, the handler iterated."""
            batch = pb.GenerateBatchRequest()
            for i in range(b):
                batch.requests.add(
                    policy_id="bench", tokens=pb.TokenPrompt(token_ids=prompts[i]), sampling=params
                )
            tokens = 0
            async for msg in servicer.GenerateBatch(batch, None):
                tokens += sum(r.response.usage.completion_tokens for r in msg.results)
            return tokens

        if args.backend == "replay":
            servicer_calls = {"unary": via_servicer, "batch": via_servicer_batch}
        if args.client_process:
            import multiprocessing as mp

            ctx = mp.get_context("spawn")
            parent, child = ctx.Pipe()
            client = ctx.Process(
                target=_client_process,
                args=(child, targets, prompts, args.max_tokens, args.temperature, args.logprobs),
                daemon=True,
            )
            client.start()
            for mode in modes:

                async def via_client_process(b: int, mode: str = mode) -> int:
                    parent.send((b, mode))
                    _seconds, tokens = await asyncio.to_thread(parent.recv)
                    return int(tokens)

                grpc_calls[mode] = via_client_process

    rows = []
    for b in sizes:
        await inproc(b)  # warm-up (allocator, kernels, CUDA graphs)
        for call in grpc_calls.values():
            await call(b)
        local: list[tuple[float, int, float]] = []
        stag: list[tuple[float, int, float]] = []
        remote: dict[str, list[tuple[float, int, float]]] = {m: [] for m in grpc_calls}
        direct: dict[str, list[tuple[float, int, float]]] = {m: [] for m in servicer_calls}
        for _ in range(args.repeats):  # interleaved, so drift hits every path alike
            local.append(await timed(functools.partial(inproc, b)))
            for mode, call in grpc_calls.items():
                remote[mode].append(await timed(functools.partial(call, b)))
            for mode, call in servicer_calls.items():
                direct[mode].append(await timed(functools.partial(call, b)))
            if args.stagger_us:
                stag.append(await timed(functools.partial(staggered, b)))
        row: dict[str, Any] = {"batch": b, "tokens": local[0][1]}
        row["inproc"] = statistics.median(t / s for s, t, _ in local)
        row["staggered"] = statistics.median(t / s for s, t, _ in stag) if stag else float("nan")
        row["inproc_us"] = statistics.median(s / b * 1e6 for s, _, _ in local)
        row["inproc_cpu_us"] = statistics.median(c / b * 1e6 for _, _, c in local)
        for mode, runs in remote.items():
            row[f"{mode}_tokens"] = runs[0][1]
            row[f"{mode}_tok_s"] = statistics.median(t / s for s, t, _ in runs)
            row[f"{mode}_us"] = statistics.median(s / b * 1e6 for s, _, _ in runs)
            row[f"{mode}_cpu_us"] = statistics.median(c / b * 1e6 for _, _, c in runs)
        for mode, runs in direct.items():
            row[f"servicer_{mode}_us"] = statistics.median(s / b * 1e6 for s, _, _ in runs)
        rows.append(row)
    if args.client_process and grpc_calls:
        parent.send(None)
        client.join(timeout=30)
    for stream in _STREAMS.values():
        await stream.aclose()
    for channel in channels:
        await channel.close()
    for server in servers:
        await server.stop(0)
    await backend.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--backend", choices=["transformers", "vllm", "replay"], default="transformers",
        help="replay: bench-only instant engine (replay_backend.py), to measure the service's CPU per call",
    )  # fmt: skip
    ap.add_argument("--model", default="tiny", help="tiny | smollm2 | random-qwen2.5-0.5b | HF id or dir")
    ap.add_argument("--batch-sizes", default="1,8,32", help="comma-separated concurrent requests")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32, help="new tokens per request (EOS ignored)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--logprobs", action="store_true", help="ask for per-token logprobs (as RL callers do)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--torch-threads", type=int, default=0, help="CPU threads (0: auto)")
    ap.add_argument("--batch-wait-ms", type=float, default=5.0)
    ap.add_argument("--enforce-eager", action="store_true", help="vllm: no CUDA graphs (faster start)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--no-grpc", action="store_true", help="in-process only (no wolfpack gRPC deps needed)")
    ap.add_argument(
        "--grpc-mode", choices=["unary", "batch", "both"], default="both",
        help="unary: one Generate per prompt; batch: one GenerateBatch per batch; both: a column each",
    )  # fmt: skip
    ap.add_argument(
        "--uncoalesced", action="store_true",
        help="also GenerateBatch with one message per finished request (a second server), to see what "
        "sending same-tick results together saves",
    )  # fmt: skip
    ap.add_argument(
        "--stream", action="store_true",
        help="also send each batch as one message of a long-lived GenerateBatchStream call (BatchStream), "
        "to see what one call per batch costs",
    )  # fmt: skip
    ap.add_argument(
        "--stagger-us", type=float, default=0.0,
        help="also run in process with requests arriving this many microseconds apart (arrival-skew control)",
    )  # fmt: skip
    ap.add_argument(
        "--client-process", action="store_true",
        help="gRPC client in its own process (like a rollout worker) instead of this event loop",
    )  # fmt: skip
    ap.add_argument("--json", default="", help="also write the rows to this JSON file")
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "wolfpack" / "inference"))
    args = ap.parse_args()
    rows = asyncio.run(bench(args))
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    lp = " · logprobs" if args.logprobs else ""
    modes = [
        k for k in ("unary", "batch", "batch-uncoalesced", "batch-stream") if rows and f"{k}_us" in rows[0]
    ]
    names = {
        "unary": "unary gRPC",
        "batch": "GenerateBatch",
        "batch-uncoalesced": "GenerateBatch 1 msg/result",
        "batch-stream": "GenerateBatchStream",
    }
    if args.backend == "replay":
        title = (f"replay (bench-only instant engine) · prompt {args.prompt_len} · {args.max_tokens} tokens per "
                 f"response{lp} · µs per request = whole batch / batch size, wall and process CPU (median of "
                 f"{args.repeats}); service = gRPC path − in-process")  # fmt: skip
        header: tuple[str, ...] = ("batch", "in-process µs", "servicer µs (unary / batch, no transport)")
        for m in modes:
            header = (*header, f"{names[m]} µs", f"{names[m]} service µs", f"{names[m]} service CPU µs")
        cells = []
        for r in rows:
            direct = " / ".join(f"{r[k]:,.1f}" for k in ("servicer_unary_us", "servicer_batch_us") if k in r)
            cell: tuple[str, ...] = (str(r["batch"]), f"{r['inproc_us']:,.1f}", direct or "-")
            for m in modes:
                cell = (*cell, f"{r[m + '_us']:,.1f}", f"{r[m + '_us'] - r['inproc_us']:,.1f}",
                        f"{r[m + '_cpu_us'] - r['inproc_cpu_us']:,.1f}")  # fmt: skip
            cells.append(cell)
    else:
        title = (f"{args.backend} · {args.model} · prompt {args.prompt_len} · {args.max_tokens} new tokens{lp} · "
                 f"generated tokens/s (median of {args.repeats}); overhead = in-process / gRPC − 1")  # fmt: skip
        header = ("batch", "tokens/run", "in-process tok/s")
        for m in modes:
            header = (*header, f"{names[m]} tok/s", f"{names[m]} overhead")
        if args.stagger_us:
            header = (*header, f"in-process, {args.stagger_us:g} µs apart")
        cells = []
        for r in rows:
            cell = (str(r["batch"]), str(r["tokens"]), f"{r['inproc']:,.0f}")
            for m in modes:
                tok_s = r[f"{m}_tok_s"]
                cell = (*cell, f"{tok_s:,.0f}", f"{(r['inproc'] / tok_s - 1) * 100:+.1f}%")
            if args.stagger_us:
                cell = (*cell, f"{r['staggered']:,.0f}")
            cells.append(cell)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # the GPU image may lack rich: plain text then
        print(title)
        for line in (header, *cells):
            print(" | ".join(f"{c:>17}" for c in line))
        return
    table = Table(title=title)
    for col in header:
        table.add_column(col, justify="right")
    for row in cells:
        table.add_row(*row)
    # piped into a log or a file: wide enough for every column (rich cuts headers at 80 otherwise)
    Console(width=None if sys.stdout.isatty() else 240).print(table)


if __name__ == "__main__":
    main()
