"""Per-turn prompt preparation in the inference service, with the prompt token cache and without: CPU
per prompt of ``Policy.prepare`` (chat template, tokenizing, compression under the budget) over the
prompts of seeded Werewolf games, as concurrent episodes send them, in one run.

    python bench/rollout/bench_prompt_cache.py [--rounds 5] [--games 8] [--variants 6p,9p,12p] [--old]

Each round prepares every prompt once with a fresh cache ("on") and once without ("off"), the order
alternating round by round; both must give the same ids (checked on every prompt). Prompts: every acting
seat's observation of ``--games`` games against the heuristic bots, interleaved game by game (turn ``i``
of every game before turn ``i + 1``), as a system message and the observation, exactly what the rollout
driver sends in ``full`` mode. Tokenizer: the tiny model's (a real fast byte-level BPE with Qwen2's
pre-tokenizer). Budgets: 512 (the tiny model's positions, so every long prompt is compressed, as in the
CPU rollout bench) and none (whole prompts, as on GPU with a large context).

``--old`` compares the cache with and without the latest change instead of with and without the cache:
"off" is then the cache with ``bench_rollout.use_baseline(True)`` (see there: the latest change's switches
off).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for sub in ("libs", "services/inference"):
    if str(ROOT / sub) not in sys.path:
        sys.path.insert(0, str(ROOT / sub))

from transformers import AutoTokenizer  # noqa: E402

from wolfpack_games.base import make_game  # noqa: E402
from wolfpack_games.werewolf.policies import heuristic_bot  # noqa: E402
from wolfpack_inference.backends.base import Sampling  # noqa: E402
from wolfpack_inference.config import PolicyConfig  # noqa: E402
from wolfpack_inference.models import tiny_model  # noqa: E402
from wolfpack_inference.policies import Policy  # noqa: E402


class PromptOnlyBackend:
    """What ``Policy.prepare`` reads of a backend (its tokenizer and positions): the bench measures the
    preparation alone, with no engine beside it."""

    chat_only = False
    version = 0

    def __init__(self, tokenizer: Any, max_positions: int) -> None:
        self.tokenizer = tokenizer
        self.max_positions = max_positions


def game_prompts(variant: str, games: int, language: str) -> list[str]:
    per_game: list[list[str]] = []
    for seed in range(games):
        env = make_game("werewolf_v1", variant, language=language)
        env.reset(seed=seed)
        rng = random.Random(seed)
        seq: list[str] = []
        for _ in range(400):
            if env.done:
                break
            acts = {}
            for seat in env.acting_seats():
                seq.append(env.observe(seat).text)
                acts[seat] = heuristic_bot(env, seat, rng)
            env.step(acts)
        per_game.append(seq)
    return [g[i] for i in range(max(map(len, per_game))) for g in per_game if i < len(g)]


def switch_old(old: bool) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_rollout import use_baseline

    use_baseline(old)


def prepare_all(policy: Policy, texts: list[str]) -> tuple[float, list[list[int]]]:
    """CPU seconds to prepare every prompt, and the ids."""
    sampling = Sampling(max_tokens=32)
    out = []
    start = time.process_time()
    for text in texts:
        msgs = [{"role": "system", "content": "You play Werewolf."}, {"role": "user", "content": text}]
        out.append(policy.prepare(sampling, messages=msgs).request.prompt_ids)
    return time.process_time() - start, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--games", type=int, default=8)
    ap.add_argument("--variants", default="6p,9p,12p")
    ap.add_argument("--language", default="en", choices=["en", "zh"])
    ap.add_argument("--old", action="store_true", help="off = the cache before the latest change")
    args = ap.parse_args()
    if args.old:
        switch_old(False)
    tok = AutoTokenizer.from_pretrained(tiny_model(Path(tempfile.gettempdir()) / "wolfpack-bench-models"))
    print(f"{args.rounds} rounds, {args.games} games per variant, language {args.language}, tiny tokenizer")
    print(
        f"{'variant':>7}  {'budget':>6}  {'prompts':>7}  {'chars/prompt':>12}  {'off µs/prompt':>13}  "
        f"{'on µs/prompt':>12}  {'off/on CPU min / med / max':>26}  {'cache hits':>10}"
    )
    for variant in args.variants.split(","):
        texts = game_prompts(variant, args.games, args.language)
        chars = sum(map(len, texts)) / len(texts)
        for budget in (512, 0):
            times: dict[str, list[float]] = {"on": [], "off": []}
            hits = ""
            for r in range(args.rounds):
                results = {}
                for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                    if args.old:
                        switch_old(mode == "off")
                    cfg = PolicyConfig(policy_id="bench", model="tiny", context_budget=budget,
                                       prompt_cache_tokens=4_000_000 if mode == "on" or args.old else 0)  # fmt: skip
                    policy = Policy(cfg, PromptOnlyBackend(tok, 512 if budget else 0))  # type: ignore[arg-type]
                    cpu, ids = prepare_all(policy, texts)
                    times[mode].append(cpu / len(texts))
                    results[mode] = ids
                    state = policy._token_cache
                    if mode == "on" and state is not None and state[1] is not None:
                        st = state[1].stats
                        hits = f"{st.hits / max(st.hits + st.misses, 1):.0%}"
                if results["on"] != results["off"]:
                    raise SystemExit(f"{variant} budget {budget}: cached ids differ from whole tokenization")
            ratios = [off / on for off, on in zip(times["off"], times["on"], strict=True)]
            print(
                f"{variant:>7}  {budget or '-':>6}  {len(texts):>7}  {chars:>12,.0f}  "
                f"{statistics.median(times['off']) * 1e6:>13,.0f}  {statistics.median(times['on']) * 1e6:>12,.0f}  "
                f"{min(ratios):>8.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f}  {hits:>10}",
                flush=True,
            )


if __name__ == "__main__":
    main()
