"""The environment server's PlaySeats part in instructions per action (valgrind), next to the engine alone.

Why: CPU time on the shared 2-core machine moves ±30 % between identical runs, so a change worth a few
per cent of the server never shows in ``bench_env_cpu.py`` or ``bench_session_layer.py``. Instructions
executed do not depend on the load: the same seeded games (``bench_session_layer.session_layer`` with
``games``) give the same count run after run, so two trees are compared exactly, however busy the
machine is. Instructions are not time (cache misses, branch mispredictions and the load's own slowdown
are left out), so read this beside a CPU-time bench, never instead of one.

Cells, each in a fresh process under ``valgrind --tool=callgrind --collect-atstart=no``:

- *server part*: collection switched on only around the server's share of each PlaySeats message (parse
  the request, ``PlayStream.handle``, ``decisions``, serialise the response: the section the session
  layer bench times as "server"), the collector tuned as a server tunes it; 32 episodes in flight, prompt
  once, final observations without their prompt (what ``bench_env_cpu.py``'s main row asks for);
- *engine alone*: the same number of games on one engine (``start`` per game, each acting seat's prompt
  rendered, a random legal answer written as text, ``parse`` and ``step_seat``): what any host spends.
  Its games are not the same games (their answers come from another random stream), so compare it per
  action, not in total.

Each cell first plays as many uncounted warm-up games of the same shape (other seeds), as a long-running
server has: the prompt pack's YAML, the render memos and the legal-action encodings are loaded once per
process and were counted otherwise (~30k instructions per action at 9 players, 64 games, in both cells).

``server part - engine alone`` is the session and proto layer (and the creates' own work).

    .venv/bin/python bench/env/bench_layer_instructions.py --players 6 9 12 --games 64 --compare HEAD~2

Needs ``valgrind`` and a C compiler (a 3-line helper is built to switch collection on and off from
Python through ``callgrind.h``). About a minute per cell.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WARM_SEED = 100_000
"""Seeds of the warm-up games (``child``): not the counted games' (7 onwards)."""
TOGGLE_C = "#include <valgrind/callgrind.h>\nvoid toggle(void) { CALLGRIND_TOGGLE_COLLECT; }\n"


def build_toggle(into: Path) -> Path:
    src, lib = into / "toggle.c", into / "libtoggle.so"
    src.write_text(TOGGLE_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def child(kind: str, players: int, games: int, lib: str) -> None:
    """Runs under callgrind: play the cell, print the number of actions."""
    toggle = ctypes.CDLL(lib).toggle
    sys.path.insert(0, str(HERE))
    from bench_session_layer import play_engine_game, session_layer

    from wolfpack_games.werewolf import WerewolfEnv

    # A warm-up of the same shape first (other seeds), as a long-running server is: the prompt pack's YAML,
    # the render memos and the legal-action encodings are loaded or filled once per process, and counted
    # they added ~30k instructions per action at 9 players to both cells (64 games). The server cell's
    # ``Observations`` is shared by warm-up and count, as one servicer's is by all its streams.
    observations = None
    if kind == "engine":
        env = WerewolfEnv(f"{players}p")
        for seed in range(WARM_SEED, WARM_SEED + games):
            env.start(seed=seed, options={})
            play_engine_game(env, random.Random(seed))
    else:
        from wolfpack_environment.convert import Observations

        observations = Observations()
        asyncio.run(session_layer(players, 32, 0.0, WARM_SEED, "once", None, final_text=False, games=games,
                                  observations=observations))  # fmt: skip
    # Then the collector as ``wolfpack.rpc.tune_gc`` sets it in a server: start-up frozen (else the full
    # collections that fall inside the counted sections walk every module object, and whether one does
    # moves a count by ±2 % between trees that differ by a few instructions).
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    if kind == "engine":
        actions = 0
        toggle()
        for seed in range(7, 7 + games):
            env.start(seed=seed, options={})
            actions += play_engine_game(env, random.Random(seed))
        toggle()
        print(actions)
        return

    class Toggle:  # ``session_layer`` switches its profiler on and off around the server part
        def enable(self) -> None:
            toggle()

        def disable(self) -> None:
            toggle()

    toggler: Any = Toggle()  # stands in for the cProfile.Profile that ``session_layer`` switches
    n, _s, _c, _parts = asyncio.run(
        session_layer(
            players, 32, 0.0, 7, "once", toggler, final_text=False, games=games, observations=observations
        )
    )
    print(n)


def cell(kind: str, players: int, games: int, lib: Path, pythonpath: str) -> tuple[int, int]:
    """(actions, instructions collected) of one cell in a fresh process under callgrind."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--callgrind-out-file={tmp}/cg.out",
             sys.executable, __file__, "--child", kind, str(players), str(games), str(lib)],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
    found = re.search(r"Collected\s*:\s*([\d,]+)", out.stderr)
    if found is None:
        raise SystemExit(f"no instruction count from valgrind:\n{out.stderr[-2000:]}")
    return int(out.stdout.strip().splitlines()[-1]), int(found.group(1).replace(",", ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--players", type=int, nargs="+", default=[9], choices=[6, 9, 12])
    ap.add_argument("--games", type=int, default=64)
    ap.add_argument("--compare", metavar="REV", action="append", default=[], help="also this git revision")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, players, games, lib = args.child
        child(kind, int(players), int(games), lib)
        return
    sys.path.insert(0, str(HERE))
    from bench_env_grpc import checkout

    with tempfile.TemporaryDirectory() as tmp:
        lib = build_toggle(Path(tmp))
        trees = [("this tree", "")]
        for rev in args.compare:
            into = Path(tmp) / rev.replace("/", "_")
            into.mkdir()
            trees.append((rev, checkout(rev, into)))
        print("| players | tree | actions | server part, instructions/action | engine alone | server - engine "
              "| server vs this tree |")  # fmt: skip
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for players in args.players:
            n_e, ir_e = cell("engine", players, args.games, lib, "")
            engine = ir_e / n_e
            first = None
            for name, path in trees:
                n, ir = cell("server", players, args.games, lib, path)
                per = ir / n
                first = first or per
                print(f"| {players} | {name} | {n} | {per / 1e3:,.1f}k | {engine / 1e3:,.1f}k | "
                      f"{(per - engine) / 1e3:,.1f}k | {per / first:.3f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
