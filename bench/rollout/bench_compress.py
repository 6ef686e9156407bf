"""Prompt compression cost: renders and milliseconds per compression, character search (the old cut, no
codec) beside the token-space cut (``TextCodec``), on the same prompts in one run.

    python bench/rollout/bench_compress.py [--repeats 20] [--budget 480]

Prompts: a system message and one Werewolf-like transcript message at several lengths, on the tiny
model's tokenizer (the slow Python ``Qwen2Tokenizer``, as in the CPU rollout bench).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from transformers import AutoTokenizer

from wolfpack_inference import prompts
from wolfpack_inference.models import tiny_model

LINE = "Day 2. Alice (seat 1) says: I think seat 4 is lying about being the seer, because nobody died. "


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--budget", type=int, default=480)
    args = parser.parse_args()
    tok = AutoTokenizer.from_pretrained(tiny_model(Path(tempfile.mkdtemp())))
    codec = prompts.TextCodec.of(tok)
    print(
        f"budget {args.budget} tokens, {args.repeats} repeats per cell, tiny tokenizer ({type(tok).__name__})"
    )
    print(
        f"{'prompt tok':>10}  {'chars: renders':>14}  {'ms':>6}  {'tokens: renders':>15}  {'ms':>6}  {'speed-up':>8}"
    )
    for lines in (15, 30, 60, 120):
        msgs = [
            {"role": "system", "content": "You play Werewolf."},
            {"role": "user", "content": LINE * lines},
        ]
        row = []
        for use in (None, codec):
            renders = 0

            def count(m: object) -> int:
                nonlocal renders
                renders += 1
                return len(prompts.render_chat(tok, m))  # type: ignore[arg-type]

            started = time.perf_counter()
            for _ in range(args.repeats):
                kept, _ = prompts.compress_messages(msgs, count, args.budget, use)
            ms = (time.perf_counter() - started) / args.repeats * 1000
            assert len(prompts.render_chat(tok, kept)) <= args.budget
            row.append((renders / args.repeats, ms))
        size = len(prompts.render_chat(tok, msgs))
        (r0, m0), (r1, m1) = row
        print(f"{size:>10}  {r0:>14.1f}  {m0:>6.1f}  {r1:>15.1f}  {m1:>6.1f}  {m0 / m1:>7.2f}x")


if __name__ == "__main__":
    main()
