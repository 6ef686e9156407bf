"""Werewolf through the environment service vs in process, LLM-shaped, by CPU per action (one table).

Why: every LLM turn needs the acting seat's prompt rendered and its text answer parsed, in process or
through the service; what the service adds on top (protobuf, gRPC, the PlaySeats state machine, the
client) is the cost of running games in their own process. Wall-clock ratios on this shared 2-core
machine swing with other tenants' load, so the table's main column is CPU: user + system seconds of the
server process (``/proc``) plus the client process (``process_time``, gRPC's threads included) per
action, against the in-process cell's CPU per action.

Cells, alternating for several rounds (the order flips each round), fresh episodes every cell:

- in process: ``WerewolfEnv`` with, per acting seat, its prompt read from the observations ``step``
  returns and its move (the engine's random bot) written as text and parsed by the engine;
- service: ``wolfpack serve environment`` in its own process; the client plays ``--episodes`` episodes
  at a time over ``--streams`` PlaySeats streams (``play_episodes``: created in the stream, every seat
  external, observation text on), answering each decision with a random legal move written as text.
  Like the in-process cell, which renders no prompt once a game is over, it asks for final observations
  without their prompt (``final_text=False``: ``PlaySeatsRequest.omit_final_text``, what a caller that
  reads outcomes does); ``--final-text`` adds a row with them (every client before that field, and a
  ``--compare`` row, whose server predates it or whose client does not ask).

    .venv/bin/python bench/env/bench_env_cpu.py                       # 6, 9, 12 players, ~2 minutes
    .venv/bin/python bench/env/bench_env_cpu.py --players 6 --rounds 3 --seconds 2
    .venv/bin/python bench/env/bench_env_cpu.py --profile-server /tmp/server.prof   # cProfile the server
    .venv/bin/python bench/env/bench_env_cpu.py --compare HEAD~5   # also serve that revision, same rounds

``--compare REV`` serves a second environment from ``git archive REV`` (its ``libs`` and
``services/environment`` first on ``PYTHONPATH``), measured in the same rounds with this tree's client:
a before/after row of a server change under the same machine noise. ``--twice`` adds a row of this
tree's server with the client asking for the prompt twice (``Observation.text`` and ``messages``, as
every client did before ``PlaySeatsRequest.omit_messages``); a server from before that field ignores it
and always sends both. ``--delta`` adds a row with the client asking for each prompt as a delta to the
seat's previous one (``play_stream(prompt_delta=True)``; a server from before that field sends whole
prompts).

``--compare-client`` (with ``--compare``): the compare row's client is REV's too (``play_episodes`` of
REV's ``EnvironmentClient``, run by this bench in a subprocess with REV first on ``PYTHONPATH``, its CPU
measured inside that process as for the others): a before/after row of a server and client change
together, the row's server + client CPU both REV's.

``--transports NAME ...`` adds a row per named set of HTTP/2 transport options (``TRANSPORTS``): this
tree's server in a process of its own with those options in place of ``wolfpack.rpc.HTTP2_OPTIONS``
(``serve_transport.py``), and the client's channel with the same options, measured in the same rounds:
how ``rpc.py``'s transport options were chosen. The column "service CPU vs this tree" is each row's
service CPU over the first row's in the same round (paired, so machine load moves both).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench_env_grpc import checkout, cpu_seconds  # the sibling bench (this folder is on sys.path)

from wolfpack import rpc
from wolfpack.redis_server import free_port
from wolfpack.settings import load_settings
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.client import EnvironmentClient, episode_request
from wolfpack_games.base import Action
from wolfpack_games.werewolf import WerewolfEnv, random_bot

GOAL = 0.35
COMPARE_CLIENT = False  # the --compare row's client is REV's too (its label says so)

MIB = 1024 * 1024
TRANSPORTS: dict[str, list[tuple[str, int]]] = {
    "grpc defaults": [],
    "frames 4M": [("grpc.http2.max_frame_size", 4 * MIB)],
    "window 4M": [("grpc.http2.lookahead_bytes", 4 * MIB)],
    "frames+window 4M": [("grpc.http2.max_frame_size", 4 * MIB), ("grpc.http2.lookahead_bytes", 4 * MIB)],
    "frames+window 4M, no bdp": [
        ("grpc.http2.max_frame_size", 4 * MIB),
        ("grpc.http2.lookahead_bytes", 4 * MIB),
        ("grpc.http2.bdp_probe", 0),
    ],
    "no bdp": [("grpc.http2.bdp_probe", 0)],
    "frames 1M": [("grpc.http2.max_frame_size", MIB)],
    "read chunk 256K": [("grpc.experimental.tcp_read_chunk_size", 256 * 1024)],
    "frames 4M, read chunk 256K": [
        ("grpc.http2.max_frame_size", 4 * MIB),
        ("grpc.experimental.tcp_read_chunk_size", 256 * 1024),
    ],
}
"""HTTP/2 transport option sets ``--transports`` can compare (``wolfpack.rpc.HTTP2_OPTIONS`` replaced on
both ends)."""


def as_text(kind: str, target: int | None, text: str) -> str:
    """A move as a model would write it: the speech itself, the bare kind, or the kind and a seat number."""
    if text:
        return text
    return kind if target is None else f"{kind} {target + 1}"


def in_process(players: int, seconds: float, seed: int) -> tuple[int, float, float, int]:
    """(actions, wall s, CPU s, prompt characters) of LLM-shaped play for ``seconds``."""
    env = WerewolfEnv(f"{players}p")
    actions = chars = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    deadline = wall0 + seconds
    while time.perf_counter() < deadline:
        obs, _ = env.reset(seed=seed)
        rng = random.Random(seed)
        while not env.done:
            moves: dict[int, Action | str] = {}
            for s in env.acting_seats():
                chars += len(obs[s].text)
                a = random_bot(env, s, rng)
                moves[s] = as_text(a.kind, a.target, a.text if a.kind == "speak" else "")
            obs = env.step(moves).observations
            actions += len(moves)
        seed += 1
    return actions, time.perf_counter() - wall0, time.process_time() - cpu0, chars


async def over_service(
    target: str,
    players: int,
    episodes: int,
    streams: int,
    seconds: float,
    seed: int,
    prompt_once: bool = True,
    transport: list[tuple[str, int]] | None = None,
    prompt_delta: bool = False,
    final_text: bool = True,
) -> tuple[int, float, float, int]:
    """(actions, wall s, client CPU s, prompt characters) of ``play_episodes`` with text for ``seconds``;
    ``prompt_once=False`` asks for ``Observation.messages`` on the wire too (the PlaySeats wire before
    ``omit_messages``); ``transport``: HTTP/2 options for the client's channel instead of this tree's;
    ``prompt_delta``: each prompt as a delta to the seat's previous one (``PlaySeatsRequest.prompt_delta``);
    ``final_text=False``: final observations without their prompt (passed only then: an older tree's
    ``play_episodes``, run by ``--compare-client``, has no such argument)."""
    counts = {"actions": 0, "chars": 0}
    rng = random.Random(seed)

    def decide(obs: pb.Observation) -> str:
        counts["actions"] += 1
        counts["chars"] += len(obs.text)
        la = rng.choice(obs.legal_actions)
        speech = "I have nothing to add." if la.needs_text else ""
        return as_text(la.kind, rng.choice(la.targets) if la.targets else None, speech)

    wall0, cpu0 = time.perf_counter(), time.process_time()
    deadline = wall0 + seconds

    def requests(first: int) -> Iterator[pb.CreateEpisodeRequest]:
        s = first
        while time.perf_counter() < deadline:
            yield episode_request("werewolf_v1", f"{players}p", seed=s, external_seats=tuple(range(players)))
            s += 1

    own = list(rpc.HTTP2_OPTIONS)
    if transport is not None:
        rpc.HTTP2_OPTIONS[:] = transport  # read when the channel is built, just below
    try:
        client = EnvironmentClient(target, load_settings(rpc_timeout_s=60))
    finally:
        rpc.HTTP2_OPTIONS[:] = own
    options = {} if final_text else {"final_text": False}
    async with client:

        async def one(k: int) -> None:
            async for _done in client.play_episodes(
                requests(seed + k * 1_000_000),
                decide,
                concurrency=max(1, episodes // streams),
                include_text=True,
                prompt_once=prompt_once,
                prompt_delta=prompt_delta,
                **options,
            ):
                pass

        await asyncio.gather(*(one(k) for k in range(streams)))
    return counts["actions"], time.perf_counter() - wall0, time.process_time() - cpu0, counts["chars"]


def client_cell(
    target: str,
    players: int,
    episodes: int,
    streams: int,
    seconds: float,
    seed: int,
    pythonpath: str,
    pid: int,
) -> tuple[int, float, float, int, float]:
    """``over_service`` (prompt once, this tree's transport options) with the client code of the tree on
    ``pythonpath``: this file run in a subprocess with ``--client-cell``. (actions, wall s, client CPU s,
    prompt characters, server CPU s), the server's (``pid``) read by the subprocess right around its cell,
    so its start-up is counted on neither side."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, os.environ.get("PYTHONPATH", "")) if p),
    }
    cell = json.dumps([target, players, episodes, streams, seconds, seed, pid])
    out = subprocess.run(
        [sys.executable, __file__, "--client-cell", cell], env=env, check=True, capture_output=True, text=True
    ).stdout
    actions, wall, cpu, chars, scpu = json.loads(out.strip().splitlines()[-1])
    return int(actions), float(wall), float(cpu), int(chars), float(scpu)


def server_cpu(pid: int) -> float:
    """The server's CPU seconds so far (``bench_env_grpc.cpu_seconds``); this bench needs ``/proc``."""
    seconds = cpu_seconds(pid)
    if seconds is None:
        raise SystemExit("bench_env_cpu.py reads the server's CPU time from /proc (Linux)")
    return seconds


def serve(
    port: int, profile: str, pythonpath: str = "", transport: list[tuple[str, int]] | None = None
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "WOLFPACK_LOG_LEVEL": "WARNING"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable]
    if profile:
        cmd += ["-m", "cProfile", "-o", profile]
    if transport is None:
        cmd += ["-m", "wolfpack.cli.main"]
    else:
        cmd += [str(Path(__file__).with_name("serve_transport.py")), json.dumps(transport)]
    cmd += ["serve", "environment", "--address", f"127.0.0.1:{port}"]
    return subprocess.Popen(cmd, env=env)


def label(side: str) -> str:
    """A table row's server: this tree (prompt once or twice, as a delta or whole on the wire), with other
    transport options, or a ``--compare`` revision."""
    if side == "service":
        return "this tree"
    if side == "service twice":
        return "this tree, prompt twice"
    if side == "service final":
        return "this tree, final prompts sent"
    if side == "service delta":
        return "this tree, prompt once, as a delta"
    if side.startswith("transport "):
        return f"this tree, {side.removeprefix('transport ')}"
    return side.removeprefix("service ") + (" (server and client)" if COMPARE_CLIENT else "")


def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    return " / ".join(fmt.format(v) for v in (min(xs), statistics.median(xs), max(xs)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--players", type=int, nargs="+", default=[6, 9, 12], choices=[6, 9, 12])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="measuring time per cell")
    ap.add_argument("--episodes", type=int, default=64, help="episodes in flight over the service")
    ap.add_argument("--streams", type=int, default=2, help="PlaySeats streams they are spread over")
    ap.add_argument("--profile-server", default="", help="write the server's cProfile stats here")
    ap.add_argument("--compare", metavar="REV", default="", help="also serve git revision REV, same rounds")
    ap.add_argument("--twice", action="store_true", help="also a row with the prompt sent twice (old wire)")
    ap.add_argument(
        "--delta", action="store_true", help="also a row with each prompt sent as a delta (prompt_delta)"
    )
    ap.add_argument(
        "--final-text", action="store_true", help="also a row with the final observations' prompts sent"
    )
    ap.add_argument(
        "--transports", nargs="+", default=[], choices=list(TRANSPORTS), metavar="NAME",
        help=f"also rows with these HTTP/2 option sets on both ends: {', '.join(map(repr, TRANSPORTS))}",
    )  # fmt: skip
    ap.add_argument(
        "--compare-client", action="store_true", help="with --compare: that row's client is REV's too"
    )
    ap.add_argument("--client-cell", default="", help=argparse.SUPPRESS)  # see ``client_cell``
    args = ap.parse_args()
    if args.client_cell:
        target, players, episodes, streams, seconds, seed, pid = json.loads(args.client_cell)
        s0 = server_cpu(pid)
        cell = asyncio.run(over_service(target, players, episodes, streams, seconds, seed))
        print(json.dumps([*cell, server_cpu(pid) - s0]))
        return

    scratch = tempfile.TemporaryDirectory()
    port = free_port()
    servers = {"service": serve(port, args.profile_server)}
    targets = {"service": f"127.0.0.1:{port}"}
    once = {"service": True}
    delta = {"service": False}
    final = {"service": False}  # final observations' prompts: the in-process cell renders none
    if args.twice:
        targets["service twice"] = targets["service"]
        once["service twice"] = False
        delta["service twice"] = False
        final["service twice"] = False
    if args.delta:
        targets["service delta"] = targets["service"]
        once["service delta"] = True
        delta["service delta"] = True
        final["service delta"] = False  # as the main row: the in-process cell renders no final prompt
    if args.final_text:
        targets["service final"] = targets["service"]
        once["service final"] = True
        delta["service final"] = False
        final["service final"] = True
    global COMPARE_CLIENT
    COMPARE_CLIENT = bool(args.compare and args.compare_client)
    client_path: dict[str, str] = {}  # rows whose client runs from another tree (``--compare-client``)
    if args.compare:
        other = free_port()
        tree = checkout(args.compare, Path(scratch.name))
        servers[f"service {args.compare}"] = serve(other, "", tree)
        if args.compare_client:
            client_path[f"service {args.compare}"] = tree
        targets[f"service {args.compare}"] = f"127.0.0.1:{other}"
        once[f"service {args.compare}"] = True  # ignored by a server that predates omit_messages
        delta[f"service {args.compare}"] = False
        final[f"service {args.compare}"] = True  # what every client asked before omit_final_text
    transports: dict[str, list[tuple[str, int]] | None] = dict.fromkeys(targets)
    for name in args.transports:
        side, other = f"transport {name}", free_port()
        servers[side] = serve(other, "", transport=TRANSPORTS[name])
        targets[side] = f"127.0.0.1:{other}"
        once[side] = True
        delta[side] = False
        final[side] = False
        transports[side] = TRANSPORTS[name]
    sides = ["local", *targets]
    rows = []
    try:

        async def run() -> None:
            for target in targets.values():
                for _ in range(200):
                    if await rpc.check_health(target, timeout_s=0.5) == "SERVING":
                        break
                    await asyncio.sleep(0.1)
            for side, target in targets.items():  # warm both sides
                await over_service(target, 6, args.episodes, args.streams, 0.5, 0, transport=transports[side])
            for players in args.players:
                cells: dict[str, list[float]] = {}

                def add(key: str, value: float, into: dict[str, list[float]] = cells) -> None:
                    into.setdefault(key, []).append(value)

                for r in range(args.rounds):
                    order = sides if r % 2 == 0 else sides[::-1]
                    got: dict[str, tuple[float, float, float]] = {}
                    for side in order:
                        if side == "local":
                            n, wall, cpu, chars = in_process(players, args.seconds, 1000 * r)
                            got[side] = (n / wall, cpu / n * 1e6, 0.0)
                            add("local chars", chars / n)
                        else:
                            pid = servers[
                                "service"
                                if side in ("service twice", "service delta", "service final")
                                else side
                            ].pid
                            if side in client_path:  # REV's client, in a subprocess
                                n, wall, ccpu, chars, scpu = await asyncio.to_thread(
                                    client_cell, targets[side], players, args.episodes, args.streams,
                                    args.seconds, 1000 * r, client_path[side], pid,
                                )  # fmt: skip
                                got[side] = (n / wall, (scpu + ccpu) / n * 1e6, scpu / n * 1e6)
                                add(f"{side} client us", ccpu / n * 1e6)
                                add(f"{side} chars", chars / n)
                                continue
                            s0 = server_cpu(pid)
                            n, wall, ccpu, chars = await over_service(
                                targets[side],
                                players,
                                args.episodes,
                                args.streams,
                                args.seconds,
                                1000 * r,
                                once[side],
                                transports[side],
                                delta[side],
                                final[side],
                            )
                            scpu = server_cpu(pid) - s0
                            got[side] = (n / wall, (scpu + ccpu) / n * 1e6, scpu / n * 1e6)
                            add(f"{side} client us", ccpu / n * 1e6)
                            add(f"{side} chars", chars / n)
                    add("local us", got["local"][1])
                    for side in targets:
                        add(f"{side} us", got[side][1])
                        add(f"{side} server us", got[side][2])
                        add(f"{side} ratio cpu", got["local"][1] / got[side][1])
                        add(f"{side} ratio wall", got[side][0] / got["local"][0])
                        add(f"{side} vs first", got[side][1] / got["service"][1])
                rows.append((players, cells))
                print(f"{players} players done", file=sys.stderr, flush=True)

        asyncio.run(run())
    finally:
        for server in servers.values():
            server.terminate()
            server.wait(timeout=60)
        scratch.cleanup()
    print(
        f"\nwerewolf_v1 LLM-shaped (prompt + text move per action): service ({args.episodes} episodes over "
        f"{args.streams} PlaySeats streams, text on) vs in process; {args.rounds} alternating rounds of "
        f"{args.seconds:g} s; min / median / max over rounds\n"
    )
    print(
        "| players | server | in-process CPU µs/action | service CPU µs/action (server + client) | server "
        "| client | in-process / service by CPU (min / median / max) | service / in-process by wall "
        "| chars per prompt (local / service) | service CPU vs this tree, same round (min / median / max) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for players, c in rows:
        med = statistics.median
        for side in targets:
            print(
                f"| {players} | {label(side)} "
                f"| {med(c['local us']):.1f} | {med(c[f'{side} us']):.1f} | {med(c[f'{side} server us']):.1f} "
                f"| {med(c[f'{side} client us']):.1f} | {spread(c[f'{side} ratio cpu'])} "
                f"| {spread(c[f'{side} ratio wall'])} | {med(c['local chars']):,.0f} / {med(c[f'{side} chars']):,.0f} "
                f"| {spread(c[f'{side} vs first'])} |"
            )
    print(f"goal: in-process / service by CPU >= {GOAL}x at 6-12 players")


if __name__ == "__main__":
    main()
