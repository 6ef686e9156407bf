"""In-process throughput of the werewolf_v1 engine with scripted bots (one core, no I/O).

Why: the trainer's rollout budget assumes >= 100k scripted actions/s for 6 players on one core; this
script measures games/s, actions/s (one action = one seat's action applied in a ``step``) and mean
actions per game for every preset and bot, so a regression is visible before it reaches training.

    .venv/bin/python bench/env/bench_werewolf_inprocess.py --seconds 3
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from wolfpack_games.base import Action, GameEnv
from wolfpack_games.werewolf import WerewolfEnv, heuristic_bot, random_bot

BOTS: dict[str, Callable[[GameEnv, int, random.Random], Action]] = {
    "random": random_bot,
    "heuristic": heuristic_bot,
}
TARGET_ACTIONS_PER_S = 100_000


@dataclass
class Row:
    preset: str
    bot: str
    games: int
    actions: int
    seconds: float
    games_per_s: float
    actions_per_s: float
    mean_actions_per_game: float
    wolf_win_rate: float


def bench(preset: str, bot_name: str, seconds: float, language: str, seed0: int) -> Row:
    """Play whole games until ``seconds`` have passed; bots' own time is included (as in rollouts)."""
    bot = BOTS[bot_name]
    env = WerewolfEnv(preset, language=language)
    games = actions = wolf_wins = 0
    start = time.perf_counter()
    deadline = start + seconds
    seed = seed0
    while True:
        env.reset(seed=seed)
        rng = random.Random(seed)
        step = env.step
        acting_seats = env.acting_seats
        while not env.done:
            acting = acting_seats()
            step({s: bot(env, s, rng) for s in acting})
            actions += len(acting)
        games += 1
        wolf_wins += env.winner() == "wolves"
        seed += 1
        if time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - start
    return Row(
        preset,
        bot_name,
        games,
        actions,
        round(elapsed, 3),
        round(games / elapsed, 1),
        round(actions / elapsed, 1),
        round(actions / games, 1),
        round(wolf_wins / games, 3),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0, help="wall time per (preset, bot) cell")
    ap.add_argument("--presets", default="6p,9p,12p", help="comma-separated presets (6p,9p,12p)")
    ap.add_argument("--bots", default="random,heuristic", help="comma-separated bots (random,heuristic)")
    ap.add_argument("--language", default="en", choices=["en", "zh"], help="prompt pack (no effect on speed)")
    ap.add_argument("--seed", type=int, default=0, help="first game seed")
    ap.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = ap.parse_args()

    rows = [
        bench(p, b, args.seconds, args.language, args.seed)
        for p in args.presets.split(",")
        for b in args.bots.split(",")
    ]
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a base dependency
        for r in rows:
            print(asdict(r))
        return
    table = Table(title=f"werewolf_v1 in-process throughput ({args.seconds:g}s per cell, one core)")
    for col in ("preset", "bot", "games", "games/s", "actions/s", "actions/game", "wolf win rate"):
        table.add_column(col, justify="right" if col not in ("preset", "bot") else "left")
    for r in rows:
        style = "green" if r.actions_per_s >= TARGET_ACTIONS_PER_S else "yellow"
        table.add_row(
            r.preset,
            r.bot,
            str(r.games),
            f"{r.games_per_s:,.0f}",
            f"[{style}]{r.actions_per_s:,.0f}[/{style}]",
            f"{r.mean_actions_per_game:.1f}",
            f"{r.wolf_win_rate:.2f}",
        )
    Console().print(table)
    print(f"target: >= {TARGET_ACTIONS_PER_S:,} actions/s for 6p with the random bot")


if __name__ == "__main__":
    main()
