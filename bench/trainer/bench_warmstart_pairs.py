"""What building a warm start's (prompt, answer) pairs costs: one ``apply_chat_template(tokenize=True)`` and
one ``encode`` per decision (how ``warmstart.bot_pairs`` built them until s22) against every prompt rendered
to text and then tokenised in one call, every answer in another (``warmstart.policy_prompts``, what it does
now), on a recipe's own bot games, interleaved rounds, the same pairs either way.

    .venv/bin/python bench/trainer/bench_warmstart_pairs.py                  # the AIW recipe, SmolLM2's tokenizer
    .venv/bin/python bench/trainer/bench_warmstart_pairs.py --config configs/gpu-werewolf-6p-ppo-heuristic-clone-smollm2.yaml --episodes 60
    .venv/bin/python bench/trainer/bench_warmstart_pairs.py --model tiny     # the test model's tokenizer

The bot's play (``bot_turns``) is done once, outside the timing: it is the same either way. On a shared CPU
only the ratio means anything; a GPU host's many cores widen it (the batch call tokenises in parallel).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from typing import Any


def one_at_a_time(tokenizer: Any, turns: list[Any], cfg: Any) -> list[tuple[list[int], list[int]]]:
    """The pairs as bot_pairs built them before: the chat template tokenised per prompt, each answer alone."""
    from wolfpack_rollout.client import render_messages
    from wolfpack_trainer.local_rollout import chat_ids

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = []
    for t in turns:
        messages = render_messages(
            t.observation,
            [],
            list(t.past),
            mode=cfg.prompt_mode,
            k=cfg.memory_steps,
            system_prompt=cfg.system_prompt,
        )
        prompt = chat_ids(tokenizer, [{"role": m.role, "content": m.content} for m in messages])
        prompt = prompt[-cfg.max_prompt_tokens :] if cfg.max_prompt_tokens > 0 else prompt
        out.append((prompt, [*tokenizer.encode(t.text, add_special_tokens=False), eos]))
    return out


def batched(tokenizer: Any, turns: list[Any], cfg: Any) -> list[tuple[list[int], list[int]]]:
    """The pairs as bot_pairs builds them now."""
    from wolfpack_trainer.warmstart import tokenised_pairs

    return tokenised_pairs(tokenizer, [(t.observation, t.past) for t in turns], [t.text for t in turns], cfg)


def main(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from wolfpack_games import get_game
    from wolfpack_trainer.config import load_config
    from wolfpack_trainer.learners.cpu import resolve_model_path
    from wolfpack_trainer.warmstart import bot_turns, warmstart_config

    cfg = warmstart_config(load_config(args.config))
    if cfg is None:
        raise SystemExit(f"{args.config} has no warm start")
    cfg = dataclasses.replace(cfg, episodes=args.episodes)
    if cfg.prompt_mode == "conversation":
        raise SystemExit(
            "conversation prompts grow turn by turn and are tokenised as they grow: nothing to batch"
        )
    with tempfile.TemporaryDirectory(prefix="wolfpack-bench-pairs-") as tmp:
        model = resolve_model_path(args.model, args.cache or tmp)
        tokenizer = AutoTokenizer.from_pretrained(model)
    bot = get_game(cfg.game_id).bots[cfg.bot]
    turns = [t for i in range(cfg.episodes) for t in bot_turns(cfg, cfg.seed_offset + i, bot)]
    ways = {"one at a time (before)": one_at_a_time, "one batch call (now)": batched}
    times: dict[str, list[float]] = {w: [] for w in ways}
    results = {}
    for r in range(args.rounds):
        for way in list(ways) if r % 2 == 0 else list(reversed(ways)):
            t0 = time.perf_counter()
            results[way] = ways[way](tokenizer, turns, cfg)
            times[way].append(time.perf_counter() - t0)
    same = results["one at a time (before)"] == results["one batch call (now)"]
    print(f"\n{args.config}: {cfg.episodes} {cfg.bot}-bot games, {len(turns)} pairs, tokenizer of {args.model}, "
          f"{args.rounds} rounds; the same pairs either way: {same}")  # fmt: skip
    print(
        "| way | s for all pairs (min / median / max) | ms a pair (median) | ratio to one at a time (medians) |"
    )
    print("| --- | --- | --- | --- |")
    base = statistics.median(times["one at a time (before)"])
    for way, values in times.items():
        med = statistics.median(values)
        cell = f"{min(values):.3f} / {med:.3f} / {max(values):.3f}"
        print(f"| {way} | {cell} | {1000 * med / len(turns):.2f} | {base / med:.2f}x faster |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/gpu-werewolf-gigpo-aiw-smollm2.yaml")
    ap.add_argument("--episodes", type=int, default=40, help="bot games (the recipe's own number is larger)")
    ap.add_argument("--model", default="smollm2", help="smollm2, tiny, or a model directory")
    ap.add_argument("--cache", default=None, help="model cache directory (default: a temporary one)")
    ap.add_argument("--rounds", type=int, default=6)
    main(ap.parse_args())
