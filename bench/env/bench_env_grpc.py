"""Werewolf over gRPC vs in process: actions/s with many concurrent episodes (one table, one run).

Why: external agents and rollout workers play through the environment service, so its per-action
overhead bounds rollout throughput. The server runs in its own process (as in production); every seat of
every episode is an external client choosing a random legal action from its observation. The in-process
row plays the same games with the engine's random bot and no network. In-process and gRPC cells
alternate for several rounds and each ratio uses the in-process rate measured just before it, because
this machine's CPUs are shared and noisy.

    .venv/bin/python bench/env/bench_env_grpc.py              # 6, 9, 12 players, ~3 minutes
    .venv/bin/python bench/env/bench_env_grpc.py --players 6 --rounds 5
    .venv/bin/python bench/env/bench_env_grpc.py --compare HEAD~3   # this tree vs a revision, one run

``--compare REV`` serves a second environment from ``git archive REV`` (its ``libs`` and
``services/environment``, first on ``PYTHONPATH``) and measures both servers in the same rounds (their
order alternating), with this tree's client: the before/after ratio of a server refactor, under the same
machine noise. The revision must speak the same wire contract as this tree. The "server µs/action"
column is the server process's own CPU time per action (Linux ``/proc``): on a shared, noisy machine it
compares two servers more steadily than throughput does.

Rows: in process; one Observe stream + unary Act per seat (what a single external agent does); the
batched ``PlaySeats`` stream joined to episodes created with unary calls, in waves; ``play_episodes``
(episodes created inside the stream, always ``--episodes`` in flight over ``--streams`` streams) without
observation text (structure only) and with text.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress, TaskID
from rich.table import Table

from wolfpack import rpc
from wolfpack.redis_server import free_port
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.client import EnvironmentClient, episode_request
from wolfpack_games import make_game
from wolfpack_games.werewolf import random_bot


def in_process(players: int, seconds: float) -> tuple[int, int, float]:
    env = make_game("werewolf_v1", f"{players}p")
    games = actions = 0
    start = time.perf_counter()
    seed = 0
    while time.perf_counter() - start < seconds:
        env.reset(seed=seed)
        rng = random.Random(seed)
        while not env.done:
            acting = env.acting_seats()
            env.step({s: random_bot(env, s, rng) for s in acting})
            actions += len(acting)
        games += 1
        seed += 1
    return games, actions, time.perf_counter() - start


def random_legal(rng: random.Random, counts: dict[str, int] | None = None):  # type: ignore[no-untyped-def]
    """A decider choosing a random legal action; counts its decisions in ``counts["actions"]``."""

    def decide(obs: pb.Observation) -> common_pb2.Action:
        if counts is not None:
            counts["actions"] += 1
        la = rng.choice(list(obs.legal_actions))
        action = common_pb2.Action(kind=la.kind, text="I have nothing to add." if la.needs_text else "")
        if la.targets:
            action.target = rng.choice(list(la.targets))
        return action

    return decide


async def over_grpc(target: str, players: int, episodes: int, seconds: float) -> tuple[int, int, float]:
    counts = {"games": 0, "actions": 0}
    settings = load_settings(rpc_timeout_s=60)
    async with EnvironmentClient(target, settings) as client:
        deadline = time.perf_counter() + seconds

        async def worker(w: int) -> None:
            rng = random.Random(w)
            seed = w * 100_000
            counted = random_legal(rng, counts)

            while time.perf_counter() < deadline:
                ep = await client.create_episode(
                    "werewolf_v1", f"{players}p", seed=seed, external_seats=tuple(range(players))
                )
                await asyncio.gather(
                    *(client.seat(ep.episode_id, t).play(counted) for t in ep.seat_tokens.values())
                )
                await client.close_episode(ep.episode_id, ep.admin_token)
                counts["games"] += 1
                seed += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(episodes)))
        return counts["games"], counts["actions"], time.perf_counter() - start


async def over_play_seats(
    target: str, players: int, episodes: int, seconds: float, include_text: bool
) -> tuple[int, int, float]:
    """Batched path: ``episodes`` games at a time over one PlaySeats stream, all answers to a batch of
    decisions in one message."""
    counts = {"games": 0, "actions": 0}
    counted = random_legal(random.Random(0), counts)

    settings = load_settings(rpc_timeout_s=60)
    async with EnvironmentClient(target, settings) as client:
        start = time.perf_counter()
        seed = 0
        while time.perf_counter() - start < seconds:
            created = await asyncio.gather(
                *(
                    client.create_episode(
                        "werewolf_v1", f"{players}p", seed=seed + i, external_seats=tuple(range(players))
                    )
                    for i in range(episodes)
                )
            )
            seed += episodes
            seats = [(ep.episode_id, s, t) for ep in created for s, t in ep.seat_tokens.items()]
            await client.play_seats(seats, counted, include_text=include_text)
            await asyncio.gather(*(client.close_episode(ep.episode_id, ep.admin_token) for ep in created))
            counts["games"] += episodes
        return counts["games"], counts["actions"], time.perf_counter() - start


async def over_play_episodes(
    target: str, players: int, episodes: int, seconds: float, include_text: bool, streams: int = 2
) -> tuple[int, int, float]:
    """Rollout-worker path: ``episodes`` games always in flight over ``streams`` PlaySeats streams,
    created in the stream as others end (no unary call per game), every seat external. Two streams keep
    the server busy while the client answers the other one's decisions."""
    counts = {"games": 0, "actions": 0}
    counted = random_legal(random.Random(0), counts)

    start = time.perf_counter()
    deadline = start + seconds

    def requests(first_seed: int) -> Iterator[pb.CreateEpisodeRequest]:
        seed = first_seed
        while time.perf_counter() < deadline:
            yield episode_request(
                "werewolf_v1", f"{players}p", seed=seed, external_seats=tuple(range(players))
            )
            seed += 1

    settings = load_settings(rpc_timeout_s=60)
    async with EnvironmentClient(target, settings) as client:

        async def one_stream(k: int) -> None:
            async for _finished in client.play_episodes(
                requests(k * 10_000_000), counted, concurrency=max(1, episodes // streams),
                include_text=include_text,
            ):  # fmt: skip
                counts["games"] += 1

        await asyncio.gather(*(one_stream(k) for k in range(streams)))
        return counts["games"], counts["actions"], time.perf_counter() - start


def modes(target: str, players: int, episodes: int, seconds: float, streams: int) -> list[tuple[str, Any]]:
    """The gRPC modes, each a coroutine factory returning (games, actions, seconds)."""
    return [
        # Many concurrent Observe streams on one client connection sometimes end CANCELLED before their
        # first message (grpcio 1.85 aio, >~1,000 calls): this per-seat mode stays well below that.
        (
            "Observe + Act per seat",
            lambda: over_grpc(target, players, min(episodes, 480 // players), seconds),
        ),
        (
            "PlaySeats, waves",
            lambda: over_play_seats(target, players, episodes, seconds, False),
        ),
        (
            f"play_episodes ×{streams}",
            lambda: over_play_episodes(target, players, episodes, seconds, False, streams),
        ),
        (
            f"play_episodes ×{streams} + text",
            lambda: over_play_episodes(target, players, episodes, seconds, True, streams),
        ),
    ]


def serve_environment(port: int, pythonpath: str = "") -> subprocess.Popen[bytes]:
    """The environment service in its own process; ``pythonpath`` first on the path (another revision)."""
    env = {**os.environ, "WOLFPACK_LOG_LEVEL": "WARNING"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen(
        [sys.executable, "-m", "wolfpack.cli.main", "serve", "environment", "--address", f"127.0.0.1:{port}"],
        env=env,
    )


def checkout(rev: str, into: Path) -> str:
    """``libs`` and ``services/environment`` of ``rev`` under ``into``; returns their PYTHONPATH."""
    root = Path(__file__).resolve().parents[2]
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", rev, "libs", "services/environment"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return os.pathsep.join([str(into / "libs"), str(into / "services" / "environment")])


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (None where ``/proc`` is absent)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(factory: Any) -> tuple[int, int, float] | str:
    """One cell; a mode that fails shows its error instead of a number (a benchmark reports failures)."""
    try:
        result: tuple[int, int, float] = await factory()
        return result
    except Exception as exc:
        return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:60]}"


async def wait_serving(target: str) -> None:
    for _ in range(200):
        if await rpc.check_health(target, timeout_s=0.5) == "SERVING":
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"environment service at {target} did not become healthy")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per cell")
    parser.add_argument("--episodes", type=int, default=256, help="concurrent episodes over gRPC")
    parser.add_argument(
        "--streams", type=int, default=2, help="PlaySeats streams play_episodes spreads them over"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="in-process and gRPC cells alternate this often"
    )
    parser.add_argument("--players", type=int, nargs="+", default=[6, 9, 12], choices=[6, 9, 12])
    parser.add_argument(
        "--compare", metavar="REV", default="", help="also serve git revision REV and measure it alongside"
    )
    args = parser.parse_args()

    port = free_port()
    servers = {"": serve_environment(port)}
    targets = {"": f"127.0.0.1:{port}"}
    scratch = tempfile.TemporaryDirectory()
    if args.compare:
        other, suffix = free_port(), f" [{args.compare}]"
        servers[suffix] = serve_environment(other, checkout(args.compare, Path(scratch.name)))
        targets[suffix] = f"127.0.0.1:{other}"
    rows: list[tuple[str, ...]] = []

    def all_modes(
        players: int, episodes: int, seconds: float, flip: bool = False
    ) -> list[tuple[str, Any, int]]:
        """Every target's modes, the targets in alternating order (``flip``) so neither always goes first."""
        order = list(targets)[::-1] if flip else list(targets)
        return [
            (name + suffix, factory, servers[suffix].pid)
            for suffix in order
            for name, factory in modes(targets[suffix], players, episodes, seconds, args.streams)
        ]

    async def run_all(progress: Progress, task: TaskID) -> None:
        """Every cell in one event loop (grpc.aio misbehaves across several loops in one process); the
        in-process cells run synchronously in between, with no call in flight."""
        for target in targets.values():
            await wait_serving(target)
        for players in args.players:
            rates: dict[str, list[float]] = {}
            games: dict[str, list[float]] = {}
            ratios: dict[str, list[float]] = {}
            server_us: dict[str, list[float]] = {}
            failures: dict[str, str] = {}
            base = "in process"
            for _round in range(args.rounds):
                g0, a0, t0 = in_process(players, args.seconds)
                progress.advance(task)
                rates.setdefault(base, []).append(a0 / t0)
                games.setdefault(base, []).append(g0 / t0)
                for name, factory, pid in all_modes(players, args.episodes, args.seconds, _round % 2 == 1):
                    cpu0 = cpu_seconds(pid)
                    result = await measure(factory)
                    cpu1 = cpu_seconds(pid)
                    progress.advance(task)
                    if isinstance(result, str):
                        failures[name] = result
                        continue
                    g1, a1, t1 = result
                    if cpu0 is not None and cpu1 is not None and a1:
                        server_us.setdefault(name, []).append((cpu1 - cpu0) / a1 * 1e6)
                    rates.setdefault(name, []).append(a1 / t1)
                    games.setdefault(name, []).append(g1 / t1)
                    ratios.setdefault(name, []).append((a1 / t1) / (a0 / t0))
            for name in [base, *(m for m, _f, _p in all_modes(players, 0, 0))]:
                if name not in rates:
                    rows.append((str(players), name, "-", failures.get(name, "no result"), "-", "-", "-"))
                    continue
                r, us = ratios.get(name, []), server_us.get(name, [])
                rows.append((
                    str(players), name, f"{statistics.median(games[name]):,.1f}",
                    f"{statistics.median(rates[name]):,.0f}",
                    f"{statistics.median(r):.3f}" if r else "",
                    f"{min(r):.3f}–{max(r):.3f}" if r else "",
                    f"{statistics.median(us):.1f}" if us else "",
                ))  # fmt: skip

    try:
        with Progress(transient=True) as progress:
            cells = 1 + 4 * len(targets)
            task = progress.add_task("measuring", total=len(args.players) * args.rounds * cells)
            asyncio.run(run_all(progress, task))
    finally:
        for server in servers.values():
            server.terminate()
            server.wait(timeout=30)
        scratch.cleanup()
    table = Table(
        title=f"werewolf_v1: in process vs over gRPC ({args.episodes} concurrent episodes, medians of "
        f"{args.rounds} alternating rounds of {args.seconds:g}s)"
    )
    for col in ("players", "mode", "games/s", "actions/s", "gRPC / in-process", "range", "server µs/action"):
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(*row)
    Console(width=max(Console().width, 150)).print(table)
    print("gRPC / in-process: each round's gRPC rate over the in-process rate measured just before it.")


if __name__ == "__main__":
    main()
