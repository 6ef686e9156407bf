"""Behaviour cloning of a scripted bot into a model: the optional warm start before RL.

Why: a randomly initialised tiny model (the CPU test model) never emits a formal statement such as
``ACCEPT`` by chance (six byte-level tokens out of ~1000), so RL from it has no signal at all. Cloning a
*weak, diverse* bot (the scenarios' ``random`` bot: random legal statements and chat) gives an initial
policy that sometimes acts well and sometimes badly, which is where RL has something to improve. The
improvement a run reports is always measured against this warm-started policy, never against the bot.

The clone is cached on disk, keyed by the warm-start settings, so it is part of set-up, not training.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from wolfpack_games import get_game, make_game
from wolfpack_trainer.local_rollout import render_prompt


@dataclass(frozen=True)
class WarmStartConfig:
    """``bot`` plays every seat; the messages of ``seats`` become (prompt, response) pairs."""

    game_id: str = "ultimatum_v1"
    variant: str = "easy"
    seats: tuple[int, ...] = (1,)
    bot: str = "random"
    episodes: int = 400
    seed_offset: int = 10_000_000
    """Seeds ``seed_offset + i``: disjoint from training and evaluation seeds."""
    steps: int = 300
    batch_size: int = 16
    lr: float = 3e-3
    max_prompt_tokens: int = 0
    """As ``rollout.max_prompt_tokens``: the clone sees the prompts the policy will see."""


def bot_pairs(cfg: WarmStartConfig, tokenizer: Any) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) for every message the bot sent in ``cfg.seats``."""
    bot = get_game(cfg.game_id).bots[cfg.bot]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pairs = []
    for i in range(cfg.episodes):
        seed = cfg.seed_offset + i
        env = make_game(cfg.game_id, cfg.variant)
        env.reset(seed=seed)
        rng = random.Random(seed)
        for _ in range(100):
            if env.done:
                break
            moves = {}
            for seat in env.acting_seats():
                action = bot(env, seat, rng)
                if seat in cfg.seats:
                    prompt = render_prompt(tokenizer, env.observe(seat).text, cfg.max_prompt_tokens)
                    response = [*tokenizer.encode(action.text, add_special_tokens=False), eos]
                    pairs.append((list(prompt), response))
                moves[seat] = action
            env.step(moves)
    return pairs


def clone_bot(model_dir: str, cfg: WarmStartConfig, cache_dir: Path) -> str:
    """A checkpoint directory of ``model_dir`` fine-tuned on the bot's messages (built once)."""
    key = hashlib.sha256(json.dumps([model_dir, asdict(cfg)], sort_keys=True).encode()).hexdigest()[:12]
    out = cache_dir / f"warm-{Path(model_dir).name}-{key}"
    if (out / "config.json").exists():
        return str(out)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # On a GPU host the clone trains on the card (SmolLM2 on CPU cores takes minutes per few steps).
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    pairs = bot_pairs(cfg, tok)
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    model.train()
    rng = random.Random(0)
    pad = int(tok.pad_token_id or 0)
    for _ in range(cfg.steps):
        chunk = rng.sample(pairs, min(cfg.batch_size, len(pairs)))
        width = max(len(p) + len(r) for p, r in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        labels = torch.full((len(chunk), width), -100, dtype=torch.long)
        att = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, (p, r) in enumerate(chunk):
            seq = p + r
            ids[i, : len(seq)] = torch.tensor(seq)
            att[i, : len(seq)] = 1
            labels[i, len(p) : len(seq)] = torch.tensor(r)
        loss = model(input_ids=ids.to(device), attention_mask=att.to(device), labels=labels.to(device)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    tmp = out.with_name(out.name + f".tmp{random.randrange(1 << 30)}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    with contextlib.suppress(OSError):  # another process built the same clone first: theirs is identical
        tmp.rename(out)
    return str(out)
