"""werewolf_v1 against TextArena's SecretMafia, the way an LLM trainer drives them (one core, no I/O).

Why: the bare engine is not what training pays for. Every LLM turn needs the acting seat's prompt
rendered and its text answer parsed, so the column that matters is "LLM-shaped": per acting seat, read
the prompt (``env.observe(seat).text``; TextArena: ``get_observation()`` through its default wrappers,
``LLMObservationWrapper`` + ``ClipCharactersActionWrapper``), let a cheap scripted policy choose, write
the choice as text and step with the text (which the engine parses). The "raw" column is the bare
engine beside it (structured ``Action`` objects here; TextArena has only text actions, through its
``-raw`` registration without wrappers).

Each side runs in its own worker process and environment: wolfpack in the project's venv, TextArena
(``textarena==0.7.4``, PyPI) in the bench's own venv, ``bench/env/.venv`` (make it with
``bash bench/env/textarena_venv.sh``). The coordinator runs the cells in interleaved rounds (the order
alternates each round) and reports, per pairing, the median actions/s of each side and the min / median /
max over rounds of the per-round ratio, by wall clock and by the worker's CPU time. The machine is
shared, so only ratios from the same round are compared.

    .venv/bin/python bench/env/bench_vs_textarena.py --rounds 7 --seconds 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TEXTARENA_PYTHON = HERE / ".venv" / "bin" / "python"
# (wolfpack players, TextArena players): TextArena's SecretMafia takes 6..15 seats but has no 9/12-seat
# preset of its own; the 9p and 12p tables are compared with its 10-player game.
PAIRINGS: tuple[tuple[int, int], ...] = ((6, 6), (9, 10), (12, 10))
GOAL = 1.0

# --- workers -----------------------------------------------------------------------------------------


def _wolfpack_cell(players: int, mode: str, seconds: float, seed: int) -> dict[str, Any]:
    """Play whole games for ``seconds``; ``llm``: prompt + text action per acting seat."""
    from wolfpack_games.base import Action
    from wolfpack_games.werewolf import WerewolfEnv, random_bot

    def as_text(a: Action) -> str:
        if a.kind == "speak":
            return a.text
        if a.target is None:
            return a.kind
        return f"{a.kind} {a.target + 1}"

    env = WerewolfEnv(f"{players}p")
    llm = mode == "llm"
    games = actions = chars = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    deadline = wall0 + seconds
    while True:
        obs, _ = env.reset(seed=seed)
        rng = random.Random(seed)
        step, acting_seats = env.step, env.acting_seats
        while not env.done:
            acting = acting_seats()
            if llm:  # the observations step returns, as a PettingZoo-style driver reads them
                moves: dict[int, Action | str] = {}
                for s in acting:
                    chars += len(obs[s].text)
                    moves[s] = as_text(random_bot(env, s, rng))
                obs = step(moves).observations
            else:
                step({s: random_bot(env, s, rng) for s in acting})
            actions += len(acting)
        games += 1
        seed += 1
        if time.perf_counter() >= deadline:
            break
    return _cell(games, actions, chars, wall0, cpu0)


_TA_SPEECHES = (
    "I am a villager, trust me.",
    "I think Player {x} is suspicious.",
    "Let's listen carefully before voting.",
    "I have nothing to add.",
    "Player {x} sounded odd to me.",
)


def _textarena_cell(players: int, mode: str, seconds: float, seed: int) -> dict[str, Any]:
    """SecretMafia-v0 (default wrappers) for ``llm``; SecretMafia-v0-raw (no wrappers) for ``raw``."""
    import textarena as ta  # only in the bench venv
    from textarena.envs.SecretMafia.env import Phase

    env_id = "SecretMafia-v0" if mode == "llm" else "SecretMafia-v0-raw"
    speeches = [t.format(x=x) for t in _TA_SPEECHES for x in range(players)]
    games = actions = chars = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    deadline = wall0 + seconds
    while True:
        # A fresh env per game, as TextArena is used: its observation wrapper keeps every message and
        # its reset does not clear them.
        env = ta.make(env_id)
        env.reset(num_players=players, seed=seed)
        inner = env.unwrapped if hasattr(env, "unwrapped") else env
        while hasattr(inner, "env"):
            inner = inner.env
        rng = random.Random(seed)
        roles = inner.player_roles
        done = False
        while not done:
            pid, obs = env.get_observation()
            if mode == "llm":
                chars += len(obs)
            phase = inner.phase
            if phase is Phase.DAY_DISCUSSION:
                action = rng.choice(speeches)
            else:
                alive = inner.state.game_state["alive_players"]
                if phase is Phase.NIGHT_MAFIA:
                    options = [p for p in alive if roles[p] != "Mafia"]
                elif phase is Phase.DAY_VOTING:
                    options = alive
                else:
                    options = [p for p in alive if p != pid]
                action = f"[{rng.choice(options)}]"
            done, _info = env.step(action)
            actions += 1
        env.close()
        games += 1
        seed += 1
        if time.perf_counter() >= deadline:
            break
    return _cell(games, actions, chars, wall0, cpu0)


def _cell(games: int, actions: int, chars: int, wall0: float, cpu0: float) -> dict[str, Any]:
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    return {
        "games": games,
        "actions": actions,
        "wall_s": wall,
        "cpu_s": cpu,
        "actions_per_s": actions / wall,
        "actions_per_cpu_s": actions / cpu if cpu > 0 else 0.0,
        "chars_per_action": chars / actions if actions else 0.0,
        "actions_per_game": actions / games,
    }


def worker(side: str) -> None:
    """Serve cells on stdin/stdout, one JSON request and one JSON answer per line."""
    run = _wolfpack_cell if side == "wolfpack" else _textarena_cell
    run(6, "llm", 0.2, 0)  # warm imports and caches before the first timed cell
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        print(json.dumps(run(req["players"], req["mode"], req["seconds"], req["seed"])), flush=True)


# --- coordinator -------------------------------------------------------------------------------------


class Worker:
    def __init__(self, side: str, python: str, pythonpath: str = "") -> None:
        env = dict(os.environ, PYTHONHASHSEED="0")
        if pythonpath:  # ahead of the venv's editable install: another checkout's libs
            env["PYTHONPATH"] = pythonpath
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--worker", side],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.side = side
        self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.side} worker exited (rc {self.proc.wait()})")
        data: dict[str, Any] = json.loads(line)
        return data

    def cell(self, players: int, mode: str, seconds: float, seed: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(
            json.dumps({"players": players, "mode": mode, "seconds": seconds, "seed": seed})
        )
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _spread(xs: list[float]) -> tuple[float, float, float]:
    return min(xs), statistics.median(xs), max(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (order alternates)")
    ap.add_argument("--seconds", type=float, default=2.0, help="wall time per cell")
    ap.add_argument("--modes", default="llm,raw", help="comma-separated: llm (prompt + text action), raw")
    ap.add_argument("--textarena-python", default=str(TEXTARENA_PYTHON), help="python of the bench venv")
    ap.add_argument(
        "--before",
        default="",
        help="another checkout (e.g. a git worktree of an older commit) measured as a third worker, "
        "its libs/ ahead of the installed ones: before/after rows in the same rounds",
    )
    ap.add_argument("--json", action="store_true", help="print the per-round cells as JSON too")
    ap.add_argument("--worker", choices=["wolfpack", "textarena"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    if not Path(args.textarena_python).exists():
        sys.exit(f"{args.textarena_python} is missing: run `bash bench/env/textarena_venv.sh` first")
    sides = {"ours": Worker("wolfpack", sys.executable)}
    if args.before:
        sides["before"] = Worker("wolfpack", sys.executable, str(Path(args.before).resolve() / "libs"))
    theirs = Worker("textarena", args.textarena_python)
    modes = args.modes.split(",")
    cells: dict[tuple[str, str, int, int], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    try:
        for r in range(args.rounds):
            for mode in modes:
                for wp, tp in PAIRINGS:
                    seed = 1000 * r
                    order = [*sides, "textarena"]
                    if r % 2:
                        order.reverse()
                    got = {}
                    for name in order:
                        if name == "textarena":
                            got[name] = theirs.cell(tp, mode, args.seconds, seed)
                        else:
                            got[name] = sides[name].cell(wp, mode, args.seconds, seed)
                    for name in sides:
                        cells.setdefault((name, mode, wp, tp), []).append((got[name], got["textarena"]))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        for w in [*sides.values(), theirs]:
            w.close()
    if args.json:
        print(json.dumps({f"{n}/{m}/{w}/{t}": v for (n, m, w, t), v in cells.items()}, indent=1))
    print(
        f"\nwerewolf_v1 vs TextArena SecretMafia-v0: {args.rounds} interleaved rounds of {args.seconds:g} s "
        "per cell, one process per side"
    )
    print(
        "| column | players (ours / TA) | ours actions/s | TA actions/s | ratio by wall min / median / max "
        "| ratio by CPU min / median / max | chars per prompt (ours / TA) | actions per game (ours / TA) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (side, mode, wp, tp), pairs in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        wall = [a["actions_per_s"] / b["actions_per_s"] for a, b in pairs]
        cpu = [a["actions_per_cpu_s"] / b["actions_per_cpu_s"] for a, b in pairs]
        ours_med = statistics.median(a["actions_per_s"] for a, _ in pairs)
        theirs_med = statistics.median(b["actions_per_s"] for _, b in pairs)
        chars = (
            f"{statistics.median(a['chars_per_action'] for a, _ in pairs):,.0f} / "
            f"{statistics.median(b['chars_per_action'] for _, b in pairs):,.0f}"
            if mode == "llm"
            else ""
        )
        apg = (
            f"{statistics.median(a['actions_per_game'] for a, _ in pairs):.1f} / "
            f"{statistics.median(b['actions_per_game'] for _, b in pairs):.1f}"
        )
        w, c = _spread(wall), _spread(cpu)
        name = "LLM-shaped" if mode == "llm" else "raw engine"
        if side == "before":
            name += f" **before** ({Path(args.before).name})"
        print(
            f"| {name} | {wp} / {tp} | {ours_med:,.0f} | {theirs_med:,.0f} "
            f"| {w[0]:.2f} / **{w[1]:.2f}** / {w[2]:.2f} | {c[0]:.2f} / **{c[1]:.2f}** / {c[2]:.2f} "
            f"| {chars} | {apg} |"
        )
    print(f"goal: LLM-shaped ratio >= {GOAL:.1f}x at 6, 9/10 and 12/10 players")


if __name__ == "__main__":
    main()
