"""The prompt token cache gives exactly the ids of tokenizing the whole text: over seeded Werewolf games
(EN and ZH, 6/9/12 players, every seat's prompts interleaved in one cache, with and without compression)
through ``Policy.prepare``, and over random growing chats with awkward text; plus its bounds, its
per-tokenizer scope and the tokenizers it refuses. Compression windows answered from a cached message's ids
without tokenizing (``PrefixTokenCache.known_head``, ``KNOWN_HEADS``): the same ids as whole tokenization over
seeded Werewolf games and a scenario game, the claim itself checked against real window tokenization, and the
part it answers from bounded to one."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from wolfpack_games.base import get_game, make_game
from wolfpack_inference import token_cache
from wolfpack_inference.backends.base import Sampling
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.policies import Policy
from wolfpack_inference.token_cache import PrefixTokenCache, unsupported_reason


class _Backend:
    """Just what ``Policy.prepare`` reads of a backend: a tokenizer and the model's positions."""

    chat_only = False
    version = 0

    def __init__(self, tokenizer: Any, max_positions: int) -> None:
        self.tokenizer = tokenizer
        self.max_positions = max_positions


def _policy(tok: Any, budget: int, cache_tokens: int, entries: int = 4096) -> Policy:
    cfg = PolicyConfig(
        policy_id="p", model="tiny", context_budget=budget, prompt_cache_tokens=cache_tokens,
        prompt_cache_entries=entries,
    )  # fmt: skip
    return Policy(cfg, _Backend(tok, 0))  # type: ignore[arg-type]


def _game_prompts(variant: str, language: str, seed: int, game_id: str = "werewolf_v1") -> list[str]:
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


def _prepared_alike(tok: Any, games: list[list[str]], budget: int) -> Any:
    """Every game's prompts interleaved (as concurrent episodes reach the service), each prepared with the
    cache and without: asserts the same ids and compression; the cache (``PrefixTokenCache``) it used."""
    order = [(g, i) for i in range(max(map(len, games))) for g in range(len(games)) if i < len(games[g])]
    sampling = Sampling(max_tokens=32)
    cached, plain = _policy(tok, budget, 1_000_000), _policy(tok, budget, 0)
    for g, i in order:
        msgs = [{"role": "system", "content": "Play well."}, {"role": "user", "content": games[g][i]}]
        a = cached.prepare(sampling, messages=msgs)
        b = plain.prepare(sampling, messages=msgs)
        assert a.request.prompt_ids == b.request.prompt_ids, (budget, g, i)
        assert a.compressed == b.compressed
    state = cached._token_cache
    assert state is not None and state[1] is not None
    return state[1]


@pytest.mark.parametrize(("variant", "language"), [("6p", "en"), ("9p", "zh"), ("12p", "en"), ("6p", "zh")])
def test_cached_prepare_matches_whole_tokenization_over_games(
    tiny_dir: Path, variant: str, language: str
) -> None:
    """Several games' prompts interleaved (as concurrent episodes reach the service), each prepared
    with the cache and without: the same ids and the same compression, at a budget that compresses
    every long prompt (512, the tiny model's) and at one that never does."""
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    games = [_game_prompts(variant, language, seed) for seed in range(3)]
    for budget in (512, 100_000):
        cache = _prepared_alike(tok, games, budget)
        assert cache.stats.hits > sum(map(len, games)) // 2  # growing prompts did reuse their prefix
        assert cache.stats.reused_tokens > 0


def _random_text(rng: random.Random, n: int) -> str:
    pieces = ["\n", "\n\n", " ", "  ", "\t", "\r\n", "Alice", " votes", " for", " Bob", "'s", "'ll", "123",
              "4.5", "!!", "?", "  \n", "<|im_end|>", "<|im_start|>", "<think>", "</think>", "狼人", "预言家",
              "é", "ü", "e\u0301", "🐺", "\u00a0", "-", "...", "[", "]", "{\"a\": 1}", "\u2028", "ß"]  # fmt: skip
    return "".join(rng.choice(pieces) for _ in range(n))


def test_random_growing_texts_match_whole_tokenization(tiny_dir: Path) -> None:
    """Texts that grow by random suffixes, sometimes with their end rewritten, and unrelated texts mixed
    in: every ``encode`` equals the tokenizer's own ids for the whole text."""
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    cache = PrefixTokenCache(tok, max_entries=64, max_tokens=200_000)
    rng = random.Random(7)
    texts = [_random_text(rng, 20) for _ in range(6)]
    for step in range(600):
        k = rng.randrange(len(texts))
        t = texts[k]
        if rng.random() < 0.3 and len(t) > 10:
            t = t[: rng.randrange(len(t))]  # the end changes (a new instruction replaces the old)
        texts[k] = t + _random_text(rng, rng.randrange(1, 40))
        remember = rng.random() < 0.9
        assert (
            cache.encode(texts[k], remember=remember) == tok(texts[k], add_special_tokens=False)["input_ids"]
        ), step
    assert cache.stats.hits > 100


def test_memory_is_bounded_lru(tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    cache = PrefixTokenCache(tok, max_entries=5, max_tokens=10**9)
    for i in range(20):
        cache.encode(f"line {i}\n" * 50)
    assert len(cache) == 5
    small = PrefixTokenCache(tok, max_entries=1000, max_tokens=500)
    for i in range(20):
        small.encode(f"player {i} speaks\n" * 30)
        assert small.cached_tokens <= 500
    # eviction leaves no index entry pointing at an evicted text
    live = {id(e) for e in small._entries.values()}
    assert all(id(e) in live for e in small._index.values())


def test_new_tokenizer_gets_a_new_cache(tiny_dir: Path) -> None:
    """Ids are never reused across tokenizers: a policy whose backend changes tokenizer starts empty."""
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    policy = _policy(tok, 100_000, 1_000_000)
    msgs = [{"role": "user", "content": "Night falls.\nAlice wakes.\n" * 20}]
    policy.prepare(Sampling(max_tokens=4), messages=msgs)
    first = policy._token_cache
    policy.backend.tokenizer = AutoTokenizer.from_pretrained(tiny_dir)  # type: ignore[misc]
    policy.prepare(Sampling(max_tokens=4), messages=msgs)
    second = policy._token_cache
    assert first is not None and second is not None and first[1] is not second[1]
    assert second[1] is not None and len(second[1]) == 1


def test_tokenizers_outside_the_proven_shape_get_no_cache(tiny_dir: Path) -> None:
    """A SentencePiece-style Metaspace tokenizer (it prepends a space to each piece it starts) and an
    added token that strips whitespace both break restarting at a line: no cache for them."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers  # type: ignore[import-untyped]

    assert unsupported_reason(AutoTokenizer.from_pretrained(tiny_dir)) == ""
    meta = Tokenizer(models.BPE(vocab={"a": 0, "▁": 1}, merges=[]))
    meta.pre_tokenizer = pre_tokenizers.Metaspace()
    fast = PreTrainedTokenizerFast(tokenizer_object=meta)  # type: ignore[no-untyped-call]
    assert "pre-tokenizer" in unsupported_reason(fast)
    stripping = AutoTokenizer.from_pretrained(tiny_dir)
    stripping.add_tokens([AddedToken("<mark>", lstrip=True)])
    assert "strips" in unsupported_reason(stripping)
    assert unsupported_reason(object()) == "not a fast tokenizer"
    policy = _policy(fast, 0, 1000)
    assert policy._encoder(policy.backend.tokenizer) is None


def test_cache_off_at_zero(tiny_dir: Path) -> None:
    policy = _policy(AutoTokenizer.from_pretrained(tiny_dir), 0, 0)
    assert policy._encoder(policy.backend.tokenizer) is None
    assert token_cache.DEFAULT_MAX_TOKENS > 0


def test_parts_and_suffix_windows_match_whole_tokenization(tiny_dir: Path) -> None:
    """A message cached from its chat's render (``remember_part``) and windows at its end
    (``encode_suffix``) give the tokenizer's own ids, over random texts with awkward seams (special
    tokens, CJK, combining marks, CRLF, runs of spaces); a part whose start is no restart point is refused."""
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    cache = PrefixTokenCache(tok, max_entries=256, max_tokens=500_000)
    rng = random.Random(11)
    seeded = 0

    def ids(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    for step in range(300):
        content = "Rules.\n" + _random_text(rng, rng.randrange(20, 120))
        chat = [{"role": "user", "content": content}]
        if step % 2:  # the message is not the chat's last: the text after it holds other messages
            chat += [
                {"role": "assistant", "content": _random_text(rng, 15)},
                {"role": "user", "content": "Go."},
            ]
        text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)

        assert cache.encode(text) == ids(text), step
        at = text.find(content)
        seeded += cache.remember_part(text, at, at + len(content))
        assert not cache.remember_part(text, at + 1, at + len(content))  # "ules.": not a restart point
        for start in sorted(rng.sample(range(len(content)), min(8, len(content)))):
            assert cache.encode_suffix(content, start) == ids(content[start:]), (step, start)
        head = content[: rng.randrange(1, len(content) + 1)]  # a window at its start: a prefix hit
        assert cache.encode(head, remember=False) == ids(head), step
    assert seeded > 250  # most parts were cached from their render (last message or not), not tokenized
    assert cache.stats.reused_tokens > 0


def test_common_suffixes_match_whole_tokenization(tiny_dir: Path) -> None:
    """Texts that share their end with a cached text (the same instruction after a new log, a cut
    render ending with its message's tail) reuse the cached ids after a restart point of that end: every
    ``encode`` still equals the tokenizer's own ids, over random heads, middles and ends with awkward
    seams, with and without a common prefix; and the ids after the reused end are right too (a text
    that grows from a suffix hit is encoded again from its restart points)."""
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    cache = PrefixTokenCache(tok, max_entries=128, max_tokens=500_000)
    rng = random.Random(23)

    def ids(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    heads = ["Rules.\n" + _random_text(rng, 60) + "\n" for _ in range(3)] + [""]
    ends = ["\nNow.\n" + _random_text(rng, rng.randrange(30, 90)) + "\nAnswer.\n" for _ in range(4)]
    suffix_hits_before = 0
    for step in range(500):
        text = rng.choice(heads) + _random_text(rng, rng.randrange(1, 40)) + rng.choice(ends)
        if rng.random() < 0.3:
            text += _random_text(rng, rng.randrange(1, 6))  # an end that is not quite a cached one
        assert cache.encode(text, remember=rng.random() < 0.8) == ids(text), step
        if step % 50 == 49:  # grown from a text whose ids came partly from a suffix hit
            grown = text + "\nMore.\n" + _random_text(rng, 20)
            assert cache.encode(grown) == ids(grown), step
            assert cache.stats.suffix_hits > suffix_hits_before
            suffix_hits_before = cache.stats.suffix_hits
    assert cache.stats.suffix_hits > 100
    assert cache.stats.suffix_mismatches == 0  # only restart points inside the common end are tried
    # every cached restart point is right: the text before it tokenizes to the ids before it
    for entry in cache._entries.values():
        for p, j in entry.lines[:: max(1, len(entry.lines) // 4)]:
            assert ids(entry.text[:p]) == entry.ids[:j].tolist()
    # eviction leaves no suffix index entry pointing at an evicted text
    live = {id(e) for e in cache._entries.values()}
    assert all(id(e) in live for e in cache._rindex.values())


def test_cut_render_reuses_the_message_tail(tiny_dir: Path) -> None:
    """A compressed Werewolf prompt: the cut chat's render ends with the message's tail, so its ids
    after the marker come from the whole render's (a suffix hit), and equal the uncached ids."""
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    prompts = _game_prompts("6p", "en", 1)
    cached, plain = _policy(tok, 512, 1_000_000), _policy(tok, 512, 0)
    sampling = Sampling(max_tokens=32)
    for text in prompts:
        msgs = [{"role": "system", "content": "Play well."}, {"role": "user", "content": text}]
        assert cached.prepare(sampling, messages=msgs).request.prompt_ids == (
            plain.prepare(sampling, messages=msgs).request.prompt_ids
        )
    state = cached._token_cache
    assert state is not None and state[1] is not None
    assert state[1].stats.suffix_hits >= len(prompts)  # at least the cut render of each long prompt
    assert state[1].stats.suffix_mismatches == 0
    assert cached._counts  # the marker chat's count was remembered (the same ids either way, above)


# --- known heads: compression windows answered from a cached message's ids (token_cache.KNOWN_HEADS) ---

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
    games = [_game_prompts(variant, language, seed, game_id) for seed in range(3)]
    assert token_cache.KNOWN_HEADS
    heads = 0
    for budget in (512, 160):
        cache = _prepared_alike(tok, games, budget)
        heads += cache.stats.head_hits
        assert len(cache._parts) <= 1
    if game_id == "werewolf_v1":
        assert heads > sum(map(len, games)) // 2  # most compressed prompts took a window from the cache


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
