"""Cost of one Werewolf prompt against how far the game has gone (one core, no I/O).

Why: an LLM turn renders the acting seat's prompt. If that re-formats the whole visible log, a late turn
costs O(game length) and long games (12 players, several discussion rounds) pay quadratically. This
script plays long games with the random bot, renders every acting seat's prompt, and reports the mean
CPU µs per prompt bucketed by the number of events in the log when the prompt was made, plus the prompt
length: with incremental prompts the cost per prompt stays flat while the text grows.

    .venv/bin/python bench/env/bench_prompt_cost.py --games 40
    PYTHONPATH=<older checkout>/libs .venv/bin/python bench/env/bench_prompt_cost.py   # before
"""

from __future__ import annotations

import argparse
import random
import time

from wolfpack_games.werewolf import WerewolfEnv, random_bot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="12p", help="preset (6p, 9p, 12p)")
    ap.add_argument("--discussion-rounds", type=int, default=3, help="longer games show the trend better")
    ap.add_argument("--language", default="en", choices=["en", "zh"])
    ap.add_argument("--games", type=int, default=40)
    ap.add_argument("--bucket", type=int, default=100, help="events per bucket")
    args = ap.parse_args()

    env = WerewolfEnv(args.variant, language=args.language, discussion_rounds=args.discussion_rounds)
    cost: dict[int, list[float]] = {}
    chars: dict[int, list[int]] = {}
    clock = time.process_time_ns
    for seed in range(args.games):
        obs, _ = env.reset(seed=seed)
        rng = random.Random(seed)
        while not env.done:
            acting = env.acting_seats()
            bucket = env.n_events // args.bucket
            for s in acting:
                o = obs[s]
                t0 = clock()
                text = o.text
                cost.setdefault(bucket, []).append((clock() - t0) / 1000)
                chars.setdefault(bucket, []).append(len(text))
            obs = env.step({s: random_bot(env, s, rng) for s in acting}).observations
    print(
        f"{args.variant}, discussion_rounds={args.discussion_rounds}, {args.language}, {args.games} games: "
        "CPU µs per prompt by events in the log"
    )
    print("| events in log | prompts | mean µs per prompt | mean chars per prompt |")
    print("| --- | --- | --- | --- |")
    for b in sorted(cost):
        xs = cost[b]
        print(
            f"| {b * args.bucket}-{(b + 1) * args.bucket - 1} | {len(xs)} | {sum(xs) / len(xs):.1f} "
            f"| {sum(chars[b]) / len(chars[b]):,.0f} |"
        )


if __name__ == "__main__":
    main()
