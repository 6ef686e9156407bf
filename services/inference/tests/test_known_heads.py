"""Compression windows answered from a cached message's ids without tokenizing
(``token_cache.PrefixTokenCache.known_head``, ``KNOWN_HEADS``): the same ids as whole tokenization over
seeded Werewolf games (6/9/12 players, EN and ZH) and a scenario game, the claim itself checked against
real window tokenization, and the part it answers from bounded to one."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from wolfpack_games.base import get_game, make_game
from wolfpack_inference import token_cache
from wolfpack_inference.backends.base import Sampling
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.policies import Policy
from wolfpack_inference.token_cache import PrefixTokenCache


class _Backend:
    """Just what ``Policy.prepare`` reads of a backend: a tokenizer and the model's positions."""

    chat_only = False
    version = 0

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.max_positions = 0


def _policy(tok: Any, budget: int, cache_tokens: int) -> Policy:
    cfg = PolicyConfig(policy_id="p", model="tiny", context_budget=budget, prompt_cache_tokens=cache_tokens)
    return Policy(cfg, _Backend(tok))  # type: ignore[arg-type]


def _prompts(game_id: str, variant: str, language: str, seed: int) -> list[str]:
    """Every acting seat's prompt of one seeded game against its heuristic bots, in the order asked."""
    env = (
        make_game(game_id, variant, language=language)
        if game_id == "werewolf_v1"
        else make_game(game_id, variant)
    )
    bot = get_game(game_id).bots["heuristic"]
    env.reset(seed=seed)
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(400):
        if env.done:
            break
        acts = {}
        for seat in env.acting_seats():
            out.append(env.observe(seat).text)
            acts[seat] = bot(env, seat, rng)
        env.step(acts)
    return out


GAMES = [
    ("werewolf_v1", "6p", "en"), ("werewolf_v1", "9p", "en"), ("werewolf_v1", "12p", "en"),
    ("werewolf_v1", "6p", "zh"), ("werewolf_v1", "9p", "zh"), ("werewolf_v1", "12p", "zh"),
    ("bargaining_v1", "hard", "en"),
]  # fmt: skip


@pytest.mark.parametrize(("game_id", "variant", "language"), GAMES)
def test_known_heads_match_whole_tokenization_over_games(
    tiny_dir: Path, game_id: str, variant: str, language: str
) -> None:
    """Three seeded games' prompts interleaved (as concurrent episodes send them), prepared with the
    cache and without it: the same ids and compression at the tiny model's budget and at a tight one
    (whose windows cover the whole message, the other branch), with windows answered from the cache."""
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    games = [_prompts(game_id, variant, language, seed) for seed in range(3)]
    order = [(g, i) for i in range(max(map(len, games))) for g in range(len(games)) if i < len(games[g])]
    assert token_cache.KNOWN_HEADS
    sampling = Sampling(max_tokens=32)
    heads = 0
    for budget in (512, 160):
        cached, plain = _policy(tok, budget, 1_000_000), _policy(tok, budget, 0)
        for g, i in order:
            msgs = [{"role": "system", "content": "Play well."}, {"role": "user", "content": games[g][i]}]
            a = cached.prepare(sampling, messages=msgs)
            b = plain.prepare(sampling, messages=msgs)
            assert a.request.prompt_ids == b.request.prompt_ids, (budget, g, i)
            assert a.compressed == b.compressed
        state = cached._token_cache
        assert state is not None and state[1] is not None
        heads += state[1].stats.head_hits
        assert len(state[1]._parts) <= 1
    if game_id == "werewolf_v1":
        assert heads > len(order) // 2  # most compressed prompts took a window from the cache


def test_known_head_is_what_the_window_tokenizes_to(tiny_dir: Path) -> None:
    """The claim itself, on random texts of many short lines (awkward seams: spaces, digits, CJK,
    punctuation at line starts) and every few window ends: ``known_head``'s answer equals the first
    ``n`` tokens of the window tokenized alone, and its flag whether that window has at most 2n + 1."""
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    rng = random.Random(7)
    pieces = [
        "Player 3",
        " votes",
        "  ",
        "\n",
        "\n\n",
        "12",
        "狼人",
        "。",
        "'s",
        "--- Now ---",
        "x",
        "\t",
        "!!",
    ]
    answered = 0
    for _ in range(60):
        body = "".join(rng.choice(pieces) for _ in range(rng.randint(40, 400)))
        chat = [{"role": "system", "content": "sys"}, {"role": "user", "content": body}]
        text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        cache = PrefixTokenCache(tok)
        cache.encode(text)
        at = text.find(body)
        if not cache.remember_part(text, at, at + len(body)):
            continue
        for end in range(1, len(body) + 40, 7):
            for n in (1, 5, 20, 60):
                known = cache.known_head(body, end, n)
                if known is None:
                    continue
                answered += 1
                window = tok(body[:end], add_special_tokens=False)["input_ids"]
                assert known == (window[:n], len(window) <= 2 * n + 1 if end >= len(body) else False)
                if end < len(body):
                    assert len(window) > n + 1
        assert cache.known_head(body + "x", 10, 1) is None  # not the remembered part
        assert cache.encode_suffix(body, 0) == tok(body, add_special_tokens=False)["input_ids"]
    assert answered > 500


def test_known_heads_off_and_evicted(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No answer with the switch off, nor once the part was evicted from the cache (it keeps one part)."""
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    body = "".join(f"Player {i} says hello to everyone.\n" for i in range(60))
    text = tok.apply_chat_template([{"role": "user", "content": body}], tokenize=False)
    cache = PrefixTokenCache(tok, max_entries=2)
    cache.encode(text)
    at = text.find(body)
    assert cache.remember_part(text, at, at + len(body))
    assert cache.known_head(body, 400, 10) is not None
    monkeypatch.setattr(token_cache, "KNOWN_HEADS", False)
    assert cache.known_head(body, 400, 10) is None
    monkeypatch.setattr(token_cache, "KNOWN_HEADS", True)
    cache.encode("another text\n" * 20)
    cache.encode("and a third\n" * 20)
    assert cache.known_head(body, 400, 10) is None  # evicted: the cache holds two entries
    assert len(cache._parts) == 1
