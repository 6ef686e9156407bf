"""How faithfully a policy must play the heuristic village to win: the heuristic village's win rate against the
heuristic wolves when its decisions are replaced, with probability eps, by the random bot's (a uniformly
random legal action, a template speech), for every village seat at once and for one village role at a time.

    .venv/bin/python bench/trainer/village_fidelity.py                       # 12p (wolf king), as the 12p recipes
    .venv/bin/python bench/trainer/village_fidelity.py --variant 6p --games 400
    .venv/bin/python bench/trainer/village_fidelity.py --by-kind villager     # one row per decision kind

Why: a warm start clones the heuristic village, so the clone starts as a noisy copy of it. On an H200 (s24) the
12p clone scored 0.00 in 64 held-out games where the heuristic village wins 0.61, while the 6p clone started at
0.13-0.18 of the heuristic's 0.43. This table says how much noise each table size tolerates, and which seats
carry the village (a role played at random takes the win rate down to the row's eps = 1.0 column), which is
how a 12p recipe can give a policy seats whose play moves the result. Pure game code (no model), seeded:
held-out seeds from 1,000,000, the noise drawn from its own RNG per (seed, seat, decision), so a row is the
same games whatever else runs.

``--by-kind ROLE``: the rows are ROLE's decision kinds instead (``vote``, ``elect``, ``speak``, ...), each with
only that kind's decisions noisy. Why: 12p villagers trained with GRPO went down in five runs of five (s25-s27),
and a policy's gradient covers every answer it writes while the game may turn on a few kinds of them: a kind
whose eps = 1.0 column stays at eps 0's has no effect on the result, so its answers' share of the gradient is
noise.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Iterable
from typing import Any

EPS = (0.0, 0.1, 0.2, 0.3, 0.5, 1.0)


def noisy(
    eps: float, seed: int, kinds: frozenset[str] | None = None
) -> Callable[[Any, int, random.Random], Any]:
    """The heuristic bot, each decision replaced by the random bot's with probability ``eps``; with ``kinds``,
    only decisions of those kinds (``decision_kind``)."""
    from wolfpack_games.werewolf.policies import heuristic_bot, random_bot

    def bot(env: Any, seat: int, rng: random.Random) -> Any:
        coin = random.Random(f"{seed}:{seat}:{len(env.events)}").random()
        if kinds is not None and decision_kind(env.legal_actions(seat)) not in kinds:
            coin = 1.0
        return random_bot(env, seat, rng) if coin < eps else heuristic_bot(env, seat, rng)

    return bot


def village_win_rate(
    variant: str,
    eps: float,
    roles: Iterable[str] | None,
    games: int,
    language: str,
    options: dict[str, Any],
    kinds: frozenset[str] | None = None,
) -> float:
    """Village wins over ``games`` held-out seeds; ``roles`` None = every village seat is noisy; ``kinds``
    None = every decision of a noisy seat, else only its decisions of those kinds (``decision_kind``)."""
    from wolfpack_games import make_game
    from wolfpack_games.conformance import play
    from wolfpack_games.werewolf.policies import heuristic_bot

    picked = None if roles is None else set(roles)
    wins = 0
    for seed in range(1_000_000, 1_000_000 + games):
        env = make_game("werewolf_v1", variant, language=language, **options)
        env.reset(seed=seed)
        bots = {}
        for seat in range(env.n):
            k = env.knowledge(seat)
            chosen = k.team == "village" if picked is None else k.role in picked
            bots[seat] = noisy(eps, seed, kinds) if chosen else heuristic_bot
        play(env, bots, seed=seed)
        wins += env.winner() == "village"
    return wins / games


def village_roles(variant: str, options: dict[str, Any]) -> list[str]:
    """The village's roles as dealt in ``variant`` with ``options``, in the preset's order."""
    from wolfpack_games import make_game

    env = make_game("werewolf_v1", variant, **options)
    env.reset(seed=0)
    roles: list[str] = []
    for seat in range(env.n):
        k = env.knowledge(seat)
        if k.team == "village" and k.role not in roles:
            roles.append(k.role)
    return sorted(roles)


def decision_kind(legal: Iterable[Any]) -> str:
    """A decision's kind: its legal actions' kinds but ``pass`` (a vote may abstain: still a vote), joined
    by ``+``; ``pass`` when that is all it offers."""
    return "+".join(sorted({la.kind for la in legal} - {"pass"})) or "pass"


def decision_kinds(variant: str, role: str, games: int, language: str, options: dict[str, Any]) -> list[str]:
    """The kinds of ``role``'s decisions in ``games`` heuristic games, most frequent first."""
    from collections import Counter

    from wolfpack_games import make_game
    from wolfpack_games.conformance import play
    from wolfpack_games.werewolf.policies import heuristic_bot

    seen: Counter[str] = Counter()

    def counting(env: Any, seat: int, rng: random.Random) -> Any:
        if env.knowledge(seat).role == role:
            seen[decision_kind(env.legal_actions(seat))] += 1
        return heuristic_bot(env, seat, rng)

    for seed in range(1_000_000, 1_000_000 + games):
        env = make_game("werewolf_v1", variant, language=language, **options)
        env.reset(seed=seed)
        play(env, {seat: counting for seat in range(env.n)}, seed=seed)
    return [kind for kind, _ in seen.most_common()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", default="12p")
    ap.add_argument("--games", type=int, default=400)
    ap.add_argument("--language", default="zh")
    ap.add_argument(
        "--option",
        action="append",
        default=None,
        help="an engine option, key=true|false|int (default wolf_king=true)",
    )
    ap.add_argument(
        "--by-kind", metavar="ROLE", help="one row per decision kind of ROLE (only that kind noisy)"
    )
    args = ap.parse_args()
    options: dict[str, Any] = {}
    for item in (
        args.option if args.option is not None else (["wolf_king=true"] if args.variant == "12p" else [])
    ):
        key, _, value = item.partition("=")
        options[key] = value == "true" if value in ("true", "false") else int(value)
    rows: list[tuple[str, list[str] | None, frozenset[str] | None]]
    if args.by_kind:
        kinds = decision_kinds(args.variant, args.by_kind, 20, args.language, options)
        rows = [(f"{args.by_kind}, every decision", [args.by_kind], None)]
        rows += [(f"{args.by_kind}, {kind} only", [args.by_kind], frozenset({kind})) for kind in kinds]
    else:
        rows = [("every village seat", None, None)]
        rows += [(role, [role], None) for role in village_roles(args.variant, options)]
    print(
        f"{args.variant} {options or ''}: village win rate vs the heuristic wolves, {args.games} held-out games"
    )
    print("| noisy seats | " + " | ".join(f"eps {e:g}" for e in EPS) + " |")
    print("| --- |" + " --- |" * len(EPS))
    for name, roles, only in rows:
        rates = [
            village_win_rate(args.variant, e, roles, args.games, args.language, options, only) for e in EPS
        ]
        print(f"| {name} | " + " | ".join(f"{r:.2f}" for r in rates) + " |", flush=True)


if __name__ == "__main__":
    main()
