"""Rollout throughput: episodes/min and generated tokens/s of the whole self-play path (PlaySeats,
GenerateBatch, Score) against scripted opponents, next to the raw engine's tokens/s on the same prompts
at the same concurrency, in one run.

How the comparison is made fair: the rollout row plays ``--episodes`` games with at most ``c`` in flight
(one policy seat each, so at most ``c`` generations at once) and records every prompt it sent; the raw row
replays exactly those prompt token ids into the same backend object in process (no gRPC, no game), ``c``
at a time, with the same sampling. ``--ignore-eos`` makes both generate ``--max-tokens`` every turn, so
token counts match; the ratio rollout/raw is what the rollout path costs (goal: >= 0.9).

Rounds: ``--repeats`` rounds per concurrency, each a rollout row followed by the raw replay of that row's
prompts (rollout and raw alternate round by round); each round's ratio divides its own two rows, and the
table gives min / median / max over rounds, by wall clock and by CPU (tokens per CPU second of this
process, which hosts the services and the engine, plus the driver's process with ``--driver-process``):
on a shared machine one round's wall-clock ratio says more about the neighbours than about the code.

Where the CPU goes: each round also prints, per policy turn, the engine thread's CPU in the rollout row
and in its raw replay (``TransformersBackend._iteration``, timed with ``time.thread_time``) and the
rest of the rollout row's CPU (the environment, inference preparation, the driver, gRPC and asyncio, in
this process); the table gives their medians. On CPU with the tiny model a decode step's cost grows with
its live rows (the cache copies grow with them), so emptier batches cost little here: the rest is the gap.

Before/after: ``--baseline`` plays, in every round, a row with the current code paths ("new") and one
with them switched off in this process ("old", see ``use_baseline``), order alternating, each followed
by its own raw replay; the environment and everything else are the same objects for both.

Processes: ``--processes one`` (default) hosts the environment, reward and inference services and the
driver in this process; ``split`` runs the environment and reward services and the driver each in a
process of its own, as the product does (inference and the engine stay here, for the raw row), and sums
the CPU of all four (the driver's start-up excluded); ``one,split`` plays both in every round. Each row
also checks that its trajectories hold every token the driver generated.

Prompt cache: ``--prompt-cache both`` plays a row with the inference policy's prompt token cache and one
without in every round (order alternating), each followed by its own raw replay. Each round also prints
the engine's occupancy in both rows (live rows per decode step, jobs per prefill): on CPU a tiny model's
decode step costs about the same with 5 rows as with 8, so occupancy sets much of the CPU ratio.

CPU (tiny model):  python bench/rollout/bench_rollout.py
GPU (vLLM):        python bench/rollout/bench_rollout.py --backend vllm --model random-qwen2.5-0.5b \\
                       --concurrency 64,256 --episodes 512 --max-tokens 64 --device cuda --dtype bfloat16
Against a running stack (no raw row):  --environment H:P --inference H:P --reward H:P --policy-id default
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for sub in ("libs", "services/environment", "services/inference", "services/reward", "services/curriculum",
            "services/rollout"):  # fmt: skip
    if str(ROOT / sub) not in sys.path:
        sys.path.insert(0, str(ROOT / sub))

from wolfpack import rpc  # noqa: E402
from wolfpack.settings import load_settings  # noqa: E402
from wolfpack.v1 import common_pb2  # noqa: E402
from wolfpack.v1 import curriculum_service_pb2 as cur_pb  # noqa: E402
from wolfpack_environment.client import EnvironmentClient  # noqa: E402
from wolfpack_rollout.driver import RolloutConfig, RolloutDriver, SamplingConfig  # noqa: E402


def tasks(game: str, variant: str, n: int, policy_id: str, seat: int, seed0: int) -> list[cur_pb.Task]:
    out = []
    for i in range(n):
        t = cur_pb.Task(task_id=f"bench-{i}", seed=seed0 + i, trainee_seats=[seat], group_size=1,
                        opponent_kind=cur_pb.OPPONENT_KIND_SCRIPTED, opponent_id="scripted:heuristic")  # fmt: skip
        t.game.game_id, t.game.variant = game, variant
        b = t.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_POLICY)
        b.policy.policy_id = policy_id
        out.append(t)
    return out


def random_qwen_05b_chat(cache: Path) -> Path:
    """A random-weight model with Qwen2.5-0.5B's body (24 layers, hidden 896, 14/2 heads, MLP 4864) and the
    tiny model's ChatML tokenizer, in one directory of real files (no symlinks: an engine may resolve them
    to a directory without the tokenizer).

    Why the tokenizer's vocabulary and not Qwen's 151,936: rollout renders chat prompts and decodes every
    sampled id, and a random model over a vocabulary larger than its tokenizer samples ids the tokenizer
    cannot decode (an engine's incremental detokenizer may then fail inside its output loop, which looks
    like a stall: the first GPU attempt of this row hung after its first request). With the small
    vocabulary every id decodes; the lm_head is smaller than 0.5B's (the body dominates the FLOPs), and the
    raw row uses the same model, so the ratio stays like for like."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    from wolfpack_inference.models import tiny_model

    out = cache / "random-qwen2.5-0.5b-body-chat"
    if (out / "tokenizer_config.json").exists() and (out / "config.json").exists():
        return out
    tok = AutoTokenizer.from_pretrained(tiny_model(cache))  # type: ignore[no-untyped-call]
    vocab = len(tok)  # exactly: any id the model can sample decodes
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    tmp = out.with_name(out.name + ".tmp")
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(tmp)  # type: ignore[no-untyped-call]
    tok.save_pretrained(tmp)
    tmp.rename(out)
    return out


async def report_progress(driver: RolloutDriver, concurrency: int, every_s: float) -> None:
    """A line on stderr every ``every_s`` seconds while a row runs, so a slow row and a stalled one differ."""
    start = time.perf_counter()
    while True:
        await asyncio.sleep(every_s)
        st = driver.stats
        print(
            f"  [c={concurrency} {time.perf_counter() - start:6.0f}s] finished {st.episodes_finished}"
            f"/{st.episodes_started} started, in flight {st.in_flight}, policy turns {st.turns}, "
            f"tokens {st.generated_tokens}, retries {st.retries}, failed {dict(st.failures)}",
            file=sys.stderr, flush=True,
        )  # fmt: skip


async def reset_prefix_cache(backend: Any) -> None:
    """Empty the engine's prefix cache before the raw replay.

    Why: the replay sends prompts the rollout has just computed. With the cache warm, the engine skips
    their prefill entirely and the raw row measures decode only, while the rollout had to prefill each
    turn's new tokens: an unfair baseline (the first GPU rows, ratio ~0.6, were measured that way). Cold,
    both rows pay for the same prefill, and both still reuse what an episode's earlier turns computed."""
    engine = getattr(backend, "engine", None)
    if engine is not None and hasattr(engine, "reset_prefix_cache"):
        await engine.reset_prefix_cache()


async def raw_engine(
    backend: Any, prompts: list[list[int]], concurrency: int, max_tokens: int, temperature: float
) -> tuple[float, int]:
    """Replay ``prompts`` straight into the backend in order, ``concurrency`` at a time: (seconds, tokens)."""
    from wolfpack_inference.backends.base import Request, Sampling

    sampling = Sampling(max_tokens=max_tokens, temperature=temperature, logprobs=True)
    queue = list(prompts)
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        while queue:
            prompt = queue.pop(0)
            result = await backend.generate(Request(sampling, list(prompt)))
            tokens += sum(len(c.token_ids) for c in result.completions)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start, tokens


GENERATED: list[int] = []
"""Tokens each row's driver generated (``stats.generated_tokens``): the bench checks that its trajectories
hold them all, so the rollout row is credited with every token it paid for and no more."""


async def play_row(
    args: argparse.Namespace, env: Any, inference: Any, reward: Any, c: int, r: int
) -> tuple[list[Any], float, int]:
    """One timed rollout row in this process: (trajectories, seconds, failed episodes)."""
    config = RolloutConfig(
        concurrency=c, max_turns=args.max_turns, generate_timeout_s=args.generate_timeout,
        prompt_mode=args.prompt_mode, memory_steps=args.memory_steps,
        sampling=SamplingConfig(max_tokens=args.max_tokens, temperature=args.temperature),
    )  # fmt: skip
    driver = RolloutDriver(config, environment=env, inference_channel=inference, reward_channel=reward)
    start = time.perf_counter()
    reporter = asyncio.create_task(report_progress(driver, c, args.progress_s))
    played = await driver.play(
        tasks(args.game, args.variant, args.episodes, args.policy_id, args.seat, r * 100_000)
    )
    elapsed = time.perf_counter() - start
    reporter.cancel()
    await driver.close()
    GENERATED.append(driver.stats.generated_tokens)
    return played, elapsed, driver.stats.episodes_failed


async def play_in_child(
    args: argparse.Namespace, addr: dict[str, str], c: int, r: int, baseline_old: bool = False
) -> tuple[list[Any], float, int, float]:
    """The same row with the rollout driver in its own process, as the rollout service runs beside the
    inference service; this process keeps serving inference (and holds the engine for the raw row).
    Also returns the CPU seconds the child spent playing the row (its start-up and imports excluded)."""
    import tempfile

    from wolfpack.v1 import trajectory_pb2

    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        out = Path(tmp)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--driver-only", str(out), "--repeat-index", str(r),
               "--environment", addr["environment"], "--inference", addr["inference"], "--reward", addr["reward"],
               "--policy-id", args.policy_id, "--game", args.game, "--variant", args.variant,
               "--seat", str(args.seat), "--episodes", str(args.episodes), "--concurrency", str(c),
               "--max-tokens", str(args.max_tokens), "--max-turns", str(args.max_turns),
               "--temperature", str(args.temperature), "--prompt-mode", args.prompt_mode,
               "--memory-steps", str(args.memory_steps), "--progress-s", str(args.progress_s),
               "--generate-timeout", str(args.generate_timeout)]  # fmt: skip
        if baseline_old:
            cmd.append("--baseline-old")
        proc = await asyncio.create_subprocess_exec(*cmd)
        if await proc.wait() != 0:
            raise RuntimeError(f"the driver process exited with {proc.returncode}")
        meta = json.loads((out / "row.json").read_text())
        played = []
        data = (out / "trajectories.bin").read_bytes()
        pos = 0
        while pos < len(data):
            size = int.from_bytes(data[pos : pos + 4], "little")
            played.append(trajectory_pb2.Trajectory.FromString(data[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        GENERATED.append(int(meta["generated"]))
        return played, float(meta["elapsed"]), int(meta["failed"]), float(meta["cpu"])


async def driver_only(args: argparse.Namespace) -> None:
    """Child side of ``--driver-process``: play one row against the given services, write what it played."""
    settings = load_settings(rpc_timeout_s=3600)
    async with (
        EnvironmentClient(args.environment, settings) as env,
        rpc.channel(args.inference, settings) as inference,
        rpc.channel(args.reward, settings) as reward,
    ):
        cpu0 = own_cpu()
        played, elapsed, failed = await play_row(
            args, env, inference, reward, args.concurrency[0], args.repeat_index
        )
        cpu = own_cpu() - cpu0
    out = Path(args.driver_only)
    with (out / "trajectories.bin").open("wb") as f:
        for traj in played:
            blob = traj.SerializeToString()
            f.write(len(blob).to_bytes(4, "little") + blob)
    (out / "row.json").write_text(
        json.dumps({"elapsed": elapsed, "failed": failed, "cpu": cpu, "generated": GENERATED[-1]})
    )


def own_cpu() -> float:
    """CPU seconds of this process alone (all its threads), children not included."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


class ServiceProcess:
    """One service (environment or reward) in a process of its own, as the product runs it: this file
    again with ``--serve-only``, which starts the service's server on a free port, prints it and serves
    until its stdin closes. ``cpu()`` reads the process's CPU seconds so far (``/proc``, via psutil)."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.proc: Any = None
        self.address = ""

    async def start(self) -> None:
        import psutil

        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).resolve()), "--serve-only", self.service,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = (await self.proc.stdout.readline()).decode().strip()
        if not line.startswith("port "):
            raise RuntimeError(f"the {self.service} process did not start: {line!r}")
        self.address = f"127.0.0.1:{line.split()[1]}"
        self._ps = psutil.Process(self.proc.pid)

    def cpu(self) -> float:
        t = self._ps.cpu_times()
        return float(t.user + t.system)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def serve_only(service: str) -> None:
    """Child side of ``ServiceProcess``: serve ``service`` on a free port until stdin closes."""
    settings = load_settings(rpc_timeout_s=3600)
    if service == "environment":
        from wolfpack_environment.server import EnvironmentServicer
        from wolfpack_environment.server import register as reg_env

        server = await rpc.start_server(
            "environment", lambda s: reg_env(s, EnvironmentServicer()), settings, "127.0.0.1:0"
        )
    else:
        from wolfpack_reward.server import register as reg_rew

        server = await rpc.start_server("reward", reg_rew, settings, "127.0.0.1:0")
    print(f"port {server.port}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # returns when stdin closes
    await server.stop(0)


async def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    settings = load_settings(rpc_timeout_s=3600)
    servers: list[Any] = []
    backend: Any = None
    served: Any = None  # the in-process policy, whose prompt cache --prompt-cache switches
    policy_id = args.policy_id
    addr = {"environment": args.environment, "inference": args.inference, "reward": args.reward}
    if not all(addr.values()):
        from wolfpack_environment.server import EnvironmentServicer
        from wolfpack_environment.server import register as reg_env
        from wolfpack_inference.config import PolicyConfig
        from wolfpack_inference.policies import Policy, PolicyRegistry, build_backend
        from wolfpack_inference.server import InferenceServicer
        from wolfpack_inference.server import register as reg_inf
        from wolfpack_reward.server import register as reg_rew

        cache = Path(args.cache_dir)
        model = args.model
        if model == "random-qwen2.5-0.5b":
            model = str(random_qwen_05b_chat(cache))
        elif model == "tiny-4k":  # the tiny model with room for whole Werewolf prompts (no compression)
            from wolfpack_inference.models import tiny_model

            model = str(tiny_model(cache, max_positions=4096))
        cfg = PolicyConfig(
            policy_id=policy_id, backend=args.backend, model=model, device=args.device, dtype=args.dtype,
            max_batch=max(args.concurrency), ignore_eos=args.ignore_eos,
            gpu_memory_utilization=args.gpu_memory_utilization, context_budget=args.context_budget,
        )  # fmt: skip
        backend = build_backend(cfg, cache)
        served = Policy(cfg, backend)
        registry = PolicyRegistry(cache, [served])
        if not addr["environment"]:
            servers.append(
                await rpc.start_server(
                    "environment", lambda s: reg_env(s, EnvironmentServicer()), settings, "127.0.0.1:0"
                )
            )
            addr["environment"] = f"127.0.0.1:{servers[-1].port}"
        if not addr["inference"]:
            servers.append(
                await rpc.start_server(
                    "inference", lambda s: reg_inf(s, InferenceServicer(registry)), settings, "127.0.0.1:0"
                )
            )
            addr["inference"] = f"127.0.0.1:{servers[-1].port}"
        else:
            backend = None  # the engine is elsewhere: no raw row
        if not addr["reward"]:
            servers.append(await rpc.start_server("reward", reg_rew, settings, "127.0.0.1:0"))
            addr["reward"] = f"127.0.0.1:{servers[-1].port}"
    rows: list[dict[str, Any]] = []
    async with (
        EnvironmentClient(addr["environment"], settings) as env,
        rpc.channel(addr["inference"], settings) as inference,
        rpc.channel(addr["reward"], settings) as reward,
    ):
        # warm-up (model load, first compile) outside the timings
        warm_cfg = RolloutConfig(
            concurrency=2, max_turns=min(4, args.max_turns), sampling=SamplingConfig(max_tokens=4)
        )
        warm = RolloutDriver(warm_cfg, environment=env, inference_channel=inference, reward_channel=reward)
        await warm.play(tasks(args.game, args.variant, 2, policy_id, args.seat, 10_000))
        await warm.close()
        if args.baseline:
            codes = ["new", "old"]
        else:
            codes = ["on", "off"] if args.prompt_cache == "both" else [args.prompt_cache]
        # "one": the services and the driver in this process (the bench's first method); "split": the
        # environment and reward services and the driver each in a process of its own, as the product
        # runs them, CPU summed over all four processes
        modes = [f"{p}/{code}" if len(args.processes) > 1 else code for p in args.processes for code in codes]
        split_addr = dict(addr)
        services: list[ServiceProcess] = []
        if "split" in args.processes:
            services = [ServiceProcess("environment"), ServiceProcess("reward")]
            for sp in services:
                await sp.start()
            split_addr["environment"], split_addr["reward"] = services[0].address, services[1].address
            async with (  # the same warm-up through the services' own processes
                EnvironmentClient(split_addr["environment"], settings) as env2,
                rpc.channel(split_addr["reward"], settings) as reward2,
            ):
                warm = RolloutDriver(
                    warm_cfg, environment=env2, inference_channel=inference, reward_channel=reward2
                )
                await warm.play(tasks(args.game, args.variant, 2, policy_id, args.seat, 10_000))
                await warm.close()
        counters = EngineCounters(backend) if backend is not None else None
        for c in args.concurrency:
            by_mode: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
            for r in range(args.repeats):
                for mode in modes if r % 2 == 0 else modes[::-1]:  # alternate which mode goes first
                    samples = by_mode[mode]
                    how, _, code = mode.rpartition("/")
                    split = how == "split"
                    if served is not None:
                        set_prompt_cache(
                            served, code == "on" or (code in ("new", "old") and args.prompt_cache != "off")
                        )
                    if args.baseline:
                        use_baseline(code == "old")
                    cpu0 = own_cpu()
                    svc0 = [sp.cpu() for sp in services] if split else []
                    snap = counters.snapshot() if counters is not None else None
                    child_cpu = 0.0
                    if split or args.driver_process:
                        played, elapsed, failed, child_cpu = await play_in_child(
                            args, split_addr if split else addr, c, r, args.baseline and code == "old"
                        )
                    else:
                        played, elapsed, failed = await play_row(args, env, inference, reward, c, r)
                    self_cpu = own_cpu() - cpu0
                    svc_cpu = [sp.cpu() - x for sp, x in zip(services, svc0, strict=True)] if split else []
                    rollout_cpu = self_cpu + child_cpu + sum(svc_cpu)
                    tokens = sum(len(t.response_token_ids) for tr in played for t in tr.turns)
                    turns = sum(1 for tr in played for t in tr.turns if t.response_token_ids)
                    if GENERATED[-1] != tokens:  # generations the trajectories do not hold (closed episodes)
                        print(f"  note: the driver generated {GENERATED[-1]} tokens, its trajectories hold "
                              f"{tokens}", file=sys.stderr, flush=True)  # fmt: skip
                    sample = {"episodes_per_min": 60 * len(played) / elapsed, "rollout_tok_s": tokens / elapsed,
                          "turns_per_s": turns / elapsed, "failed": float(failed)}  # fmt: skip
                    if backend is not None:
                        # the rollout's generations in the order it issued them, so prefix reuse is alike
                        issued = sorted(
                        (t.started_at.ToNanoseconds(), list(t.prompt_token_ids))
                        for tr in played for t in tr.turns if t.response_token_ids
                    )  # fmt: skip
                        prompts = [p for _, p in issued]
                        if args.raw_cache == "cold":
                            await reset_prefix_cache(backend)
                        occupancy = counters.since(snap) if counters is not None and snap is not None else {}
                        snap = counters.snapshot() if counters is not None else None
                        cpu1 = own_cpu()
                        raw_s, raw_tokens = await raw_engine(
                            backend, prompts, c, args.max_tokens, args.temperature
                        )
                        raw_cpu = own_cpu() - cpu1
                        raw_occupancy = (
                            counters.since(snap) if counters is not None and snap is not None else {}
                        )
                        for key, value in occupancy.items():
                            sample[f"rollout_{key}"] = value
                        for key, value in raw_occupancy.items():
                            sample[f"raw_{key}"] = value
                        sample["raw_tok_s"] = raw_tokens / raw_s
                        sample["ratio"] = sample["rollout_tok_s"] / sample["raw_tok_s"]
                        sample["cpu_ratio"] = (tokens / rollout_cpu) / (raw_tokens / raw_cpu)
                        if "raw_engine_cpu" in sample:
                            # where the rollout's CPU went, per policy turn: the engine's thread (the same
                            # work as the raw row's, at the rollout's occupancy) and everything else (the
                            # services, gRPC, the driver, the game)
                            sample["rollout_engine_ms"] = 1e3 * sample["rollout_engine_cpu"] / max(turns, 1)
                            sample["raw_engine_ms"] = 1e3 * sample["raw_engine_cpu"] / max(turns, 1)
                            sample["services_ms"] = (
                                1e3 * (rollout_cpu - sample["rollout_engine_cpu"]) / max(turns, 1)
                            )
                            sample["raw_other_ms"] = (
                                1e3 * (raw_cpu - sample["raw_engine_cpu"]) / max(turns, 1)
                            )
                            # the rest by process: the inference process (this one, less the engine
                            # thread; in "one" rows also the environment, reward and driver), the
                            # driver's, the environment's and the reward's
                            sample["inference_ms"] = (
                                1e3 * (self_cpu - sample["rollout_engine_cpu"]) / max(turns, 1)
                            )
                            sample["driver_ms"] = 1e3 * child_cpu / max(turns, 1)
                            sample["environment_ms"] = 1e3 * (svc_cpu[0] if svc_cpu else 0.0) / max(turns, 1)
                            sample["reward_ms"] = 1e3 * (svc_cpu[1] if svc_cpu else 0.0) / max(turns, 1)
                        print(
                            f"  round {r + 1}/{args.repeats} c={c} {mode}: ratio {sample['ratio']:.3f} by wall, "
                            f"{sample['cpu_ratio']:.3f} by CPU"
                            + (
                                f"; rows per decode step {sample['rollout_rows_per_step']:.2f} rollout, "
                                f"{sample['raw_rows_per_step']:.2f} raw; jobs per prefill "
                                f"{sample['rollout_jobs_per_prefill']:.2f} / {sample['raw_jobs_per_prefill']:.2f}; "
                                f"CPU ms per turn: engine {sample['rollout_engine_ms']:.2f} rollout / "
                                f"{sample['raw_engine_ms']:.2f} raw, rest {sample['services_ms']:.2f} rollout / "
                                f"{sample['raw_other_ms']:.2f} raw ({turns} turns); rest by process: inference "
                                f"{sample['inference_ms']:.2f}, driver {sample['driver_ms']:.2f}, environment "
                                f"{sample['environment_ms']:.2f}, reward {sample['reward_ms']:.2f}"
                                if "raw_rows_per_step" in sample and "services_ms" in sample
                                else ""
                            ),
                            file=sys.stderr,
                            flush=True,
                        )
                    samples.append(sample)
            for mode, samples in by_mode.items():
                row: dict[str, Any] = {"concurrency": c, "episodes": args.episodes, "rounds": len(samples),
                                   "prompt_cache": mode}  # fmt: skip
                for key in samples[0]:
                    row[key] = statistics.median(s[key] for s in samples)
                for key in ("ratio", "cpu_ratio"):
                    if key in samples[0]:
                        row[f"{key}_min"] = min(s[key] for s in samples)
                        row[f"{key}_max"] = max(s[key] for s in samples)
                rows.append(row)
                print_row(row)
        for sp in services:
            await sp.stop()
    for server in servers:
        await server.stop(0)
    return rows


class EngineCounters:
    """Decode steps, live rows per step and prefill calls of the in-process transformers backend,
    counted by wrapping its ``_step``/``_prefill`` on the instance (bench instrumentation only).

    Why: on CPU a tiny model's step costs about the same whatever the batch's rows, so the CPU per token
    of a row follows how full the engine's batches were; these counts show how much of a rollout/raw gap
    is occupancy (requests arriving one at a time between game steps) rather than the services' work."""

    def __init__(self, backend: Any) -> None:
        self.steps = self.rows = self.prefills = self.prefilled = 0
        self.step_cpu = self.prefill_cpu = self.engine_cpu = 0.0
        if not all(hasattr(backend, name) for name in ("_step", "_prefill", "_iteration")):
            self.active = False
            return
        self.active = True
        step, prefill, iteration = backend._step, backend._prefill, backend._iteration

        def counted_iteration(batch: Any) -> Any:
            t0 = time.thread_time()
            try:
                return iteration(batch)
            finally:
                self.engine_cpu += time.thread_time() - t0

        def counted_step(batch: Any) -> Any:
            self.steps += 1
            self.rows += len(batch.live())
            t0 = time.thread_time()
            try:
                return step(batch)
            finally:
                self.step_cpu += time.thread_time() - t0

        def counted_prefill(jobs: Any) -> Any:
            self.prefills += 1
            self.prefilled += len(jobs)
            t0 = time.thread_time()
            try:
                return prefill(jobs)
            finally:
                self.prefill_cpu += time.thread_time() - t0

        backend._step, backend._prefill = counted_step, counted_prefill
        backend._iteration = counted_iteration

    def snapshot(self) -> tuple[float, ...]:
        return (self.steps, self.rows, self.prefills, self.prefilled, self.step_cpu, self.prefill_cpu,
                self.engine_cpu)  # fmt: skip

    def since(self, snap: tuple[float, ...]) -> dict[str, float]:
        steps, rows, prefills, prefilled, step_cpu, prefill_cpu, engine_cpu = (
            a - b for a, b in zip(self.snapshot(), snap, strict=True)
        )
        return {"rows_per_step": rows / max(steps, 1), "jobs_per_prefill": prefilled / max(prefills, 1),
                "steps": steps, "step_cpu": step_cpu, "prefill_cpu": prefill_cpu,
                "engine_cpu": engine_cpu}  # fmt: skip


def use_baseline(old: bool) -> None:
    """``--baseline``: switch this change's code path off (``old``) or on in this process, so the code
    before and after it play side by side in one run (everything else the same objects; in ``split``
    rows the driver's process gets ``--baseline-old`` and switches it there).

    This change (2026-11-27, fourth session): the driver's ``GrpcInference`` sends every batch as a
    message of one long-lived GenerateBatchStream call instead of a GenerateBatch call each
    (``wolfpack_rollout.backends.BATCH_STREAM``: off). The earlier sessions' switches
    (``token_cache.KNOWN_HEADS``, ``server.INLINE_BY_TIME``) are part of "old" now and stay on."""
    from wolfpack_rollout import backends

    if not _NEW:
        _NEW.update(BATCH_STREAM=getattr(backends, "BATCH_STREAM", False))
    if hasattr(backends, "BATCH_STREAM"):
        backends.BATCH_STREAM = False if old else _NEW["BATCH_STREAM"]


_NEW: dict[str, Any] = {}


def set_prompt_cache(policy: Any, on: bool) -> None:
    """Switch the in-process policy's prompt token cache on or off (off: every prompt tokenized whole,
    the path before the cache), starting empty either way so no row inherits another's entries."""
    tokens = type(policy.cfg).model_fields["prompt_cache_tokens"].default if on else 0
    policy.cfg = policy.cfg.model_copy(update={"prompt_cache_tokens": tokens})
    policy._token_cache = None


def print_row(row: dict[str, Any]) -> None:
    raw = (
        f"{row['raw_tok_s']:>10,.0f}  {row['ratio_min']:.3f} / {row['ratio']:.3f} / {row['ratio_max']:.3f}  "
        f"{row['cpu_ratio_min']:.3f} / {row['cpu_ratio']:.3f} / {row['cpu_ratio_max']:.3f}"
        if "raw_tok_s" in row
        else f"{'-':>10}  {'-':>21}  {'-':>21}"
    )
    split = (
        f"  {row['rollout_rows_per_step']:>5.2f} / {row['raw_rows_per_step']:<5.2f}  "
        f"{row['rollout_engine_ms']:>5.2f} / {row['raw_engine_ms']:<5.2f}  {row['services_ms']:>11.2f}"
        f"  {row['inference_ms']:>5.2f} / {row['driver_ms']:.2f} / {row['environment_ms']:.2f} / {row['reward_ms']:.2f}"
        if "services_ms" in row
        else ""
    )
    print(f"{row['concurrency']:>11}  {row.get('prompt_cache', '-'):>9}  {row['episodes']:>8}  {row['episodes_per_min']:>10,.1f}  {row['turns_per_s']:>8,.1f}"
          f"  {row['rollout_tok_s']:>11,.0f}  {raw}  {int(row['failed']):>6}{split}", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="transformers", choices=["transformers", "vllm"])
    ap.add_argument(
        "--model", default="tiny", help="tiny | tiny-4k | smollm2 | random-qwen2.5-0.5b | HF id or dir"
    )
    ap.add_argument("--game", default="werewolf_v1")
    ap.add_argument("--variant", default="6p")
    ap.add_argument("--seat", type=int, default=3, help="the policy seat (others: scripted heuristic bots)")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[8, 32])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-turns", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--prompt-mode", default="full", choices=["full", "memory"])
    ap.add_argument("--memory-steps", type=int, default=1)
    ap.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds per concurrency")
    ap.add_argument("--progress-s", type=float, default=15.0, help="seconds between progress lines (stderr)")
    ap.add_argument(
        "--generate-timeout", type=float, default=120.0, help="deadline of one GenerateBatch call"
    )
    ap.add_argument(
        "--raw-cache", default="cold", choices=["cold", "warm"],
        help="cold: empty the engine's prefix cache before the raw replay (fair); warm: keep it",
    )  # fmt: skip
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--context-budget", type=int, default=0, help="prompt budget (0: the model's positions)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument(
        "--prompt-cache", default="on", choices=["on", "off", "both"],
        help="the in-process policy's prompt token cache; both: a row of each per round, order alternating",
    )  # fmt: skip
    ap.add_argument(
        "--baseline", action="store_true",
        help="every round plays a row with this change's code paths ('new') and one without ('old'), "
             "order alternating, each with its own raw replay (see use_baseline)",
    )  # fmt: skip
    ap.add_argument("--policy-id", default="bench")
    ap.add_argument(
        "--environment", default="", help="use this environment service instead of one in process"
    )
    ap.add_argument("--inference", default="", help="use this inference service (then no raw-engine row)")
    ap.add_argument("--reward", default="", help="use this reward service")
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "wolfpack" / "inference"))
    ap.add_argument("--json", default="", help="also write the rows to this JSON file")
    ap.add_argument(
        "--driver-process", action="store_true",
        help="run the rollout driver in its own process (as the rollout service is), not beside inference",
    )  # fmt: skip
    ap.add_argument(
        "--processes", type=lambda v: v.split(","), default=["one"],
        help="one: services and driver in this process; split: environment, reward and driver each in a "
             "process of its own (inference and the engine stay here), CPU summed over all; one,split: both, "
             "interleaved",
    )  # fmt: skip
    ap.add_argument("--serve-only", default="", help=argparse.SUPPRESS)  # a ServiceProcess child
    ap.add_argument("--driver-only", default="", help=argparse.SUPPRESS)  # the child of --driver-process
    ap.add_argument("--repeat-index", type=int, default=0, help=argparse.SUPPRESS)
    # the driver's process of an "old" row (see use_baseline)
    ap.add_argument("--baseline-old", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_only:
        asyncio.run(serve_only(args.serve_only))
        return
    if args.driver_only:
        use_baseline(args.baseline_old)
        asyncio.run(driver_only(args))
        return
    print(f"rollout bench: backend={args.backend} model={args.model} game={args.game}/{args.variant} "
          f"max_tokens={args.max_tokens} ignore_eos={args.ignore_eos} prompt_mode={args.prompt_mode}")  # fmt: skip
    print(f"{'concurrency':>11}  {'mode':>9}  {'episodes':>8}  {'episodes/min':>10}  {'turns/s':>8}  {'rollout tok/s':>11}  "
          f"{'raw tok/s':>10}  {'ratio min/med/max':>21}  {'CPU ratio min/med/max':>21}  {'failed':>6}  {'rows/step r/raw':>13}  {'engine ms/turn r/raw':>13}  {'rest ms/turn':>11}  rest by process: inference / driver / environment / reward (ms/turn)")  # fmt: skip
    if args.baseline:
        if args.prompt_cache == "both":
            ap.error("--baseline compares two variants itself: not with --prompt-cache both")
        use_baseline(False)  # records the new code paths before any round switches them
    rows = asyncio.run(bench(args))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
