"""Exact incremental tokenization of prompts that grow: a policy's bounded cache of recent texts and
their token ids, so a seat's next prompt tokenizes only what is new since its last one.

Why: a game prompt is "stable header, growing log, instruction", re-sent whole every turn (and several
times per turn while ``prompts.compress_messages`` searches for a cut). Tokenizing ~2k tokens of it each
time was most of the inference service's per-turn preparation. Consecutive prompts share a long prefix
of *text*, but not of tokens in general (a BPE merge may span the point where they differ), so the cache
reuses tokens only up to a point where tokenization provably restarts from scratch, and checks it.

How (``PrefixTokenCache.encode``):
  1. Find the cached text sharing the longest prefix with the new one: every cached text is indexed by a
     chained hash of each ``CHUNK``-character prefix, so one pass over the new text finds it; a hit is
     confirmed by comparing the characters (hash collisions cannot change the result).
  2. Pick two *restart points* inside that common prefix: token starts right after a ``\\n`` and before
     a character that is not whitespace. With the pre-tokenizers accepted here (byte-level BPE behind a
     GPT-2/Qwen-style regex split, no prefix space, added tokens that neither strip nor contain a newline
     before their end) no pre-token spans such a point, so the tokens after it depend only on the text
     after it.
  3. Tokenize the new text from the earlier point ``p0`` and require the tokens up to the later point
     ``p1`` to equal the cached ones, with a token starting exactly at ``p1``: a check on real text that
     the restart is clean. On any doubt (no restart point, an overlap that differs, truncation or
     padding set on the tokenizer) the whole text is tokenized, as before.
  4. Common ends: cached texts are also indexed by their ``CHUNK``-character suffixes. When a cached
     text ends as the new one does (the same instruction after a longer log; a compressed chat's cut
     render, which ends with its message's tail), the new text is tokenized only up to the second
     restart point ``q2`` inside that common end, the tokens between the first one ``q1`` and ``q2``
     must equal the cached text's (with a token starting exactly at ``q1``), and the ids after ``q1``
     are the cached text's: by the same argument as step 2, read from the other side.
Tokenizers outside that shape (``unsupported_reason``) get no cache at all.

Parts of a rendered chat (``remember_part``, ``encode_suffix``): a prompt compressed under the budget
tokenizes windows at the two ends of one message's content, by itself, right after rendering the whole
chat. The content's own ids are already inside the render's: it starts at a restart point (after the
template's ``user\n``) and ends where an added token (``<|im_end|>``) begins, which splits the text
before any pre-tokenizer runs. ``remember_part`` caches the content under its own text from those ids, so
a window at its start is a prefix hit; ``encode_suffix`` tokenizes a window at its end only up to the
window's first restart point and takes the rest from the cached content. Both check real tokens as step
3 does, and fall back to tokenizing when a check or a precondition fails.

Bounds: at most ``max_entries`` texts and ``max_tokens`` token ids in all, least recently used evicted
first; texts longer than ``MAX_TEXT_CHARS`` are tokenized whole and not kept. One cache per policy
tokenizer (``Policy`` drops it when the backend's tokenizer object changes), so nothing crosses policies.
Thread safe: lookups and inserts hold a lock; tokenizing does not.
"""

from __future__ import annotations

import bisect
import json
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

CHUNK = 64
"""Characters per indexed prefix step: a hit finds the common prefix to within one chunk, and the last
partial chunk is compared character by character."""
REUSE_SUFFIXES = True
"""Step 4 of the module docstring (common ends) on; ``bench/rollout/bench_rollout.py --baseline`` turns it
off in its process to measure the code without it side by side (texts then get no suffix keys at all)."""
KNOWN_HEADS = True
"""``PrefixTokenCache.known_head`` on: a compression's window at a cached message's start takes its first
tokens from the message's cached ids without tokenizing (``bench/rollout/bench_rollout.py --baseline``
turns it off to measure the code without it side by side)."""
MIN_SUFFIX_CHARS = 32
"""A common suffix is reused only when its ids after the second restart point cover at least this many
characters (below that, tokenizing them costs less than the lookup)."""
MAX_TEXT_CHARS = 262_144
"""Texts longer than this are tokenized whole and not cached (their index alone would be large)."""
DEFAULT_MAX_ENTRIES = 4096
DEFAULT_MAX_TOKENS = 4_000_000
"""Default bound on cached token ids: ids (``array('i')``, 16 MB), their texts and the prefix index
(one int key per ``CHUNK`` characters). Measured at the bound with 12-player Werewolf prompts (1,817
prompts, 8 M characters): 64 MB more resident memory."""

_SAFE_PRE_TOKENIZERS = {"ByteLevel", "Split", "Digits", "Sequence"}
_SAFE_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Sequence"}


def unsupported_reason(tokenizer: Any) -> str:
    """Why ``tokenizer`` cannot be tokenized incrementally here ("" when it can). Only fast (Rust)
    byte-level BPE tokenizers without a prefix space, whose added tokens do not strip whitespace, qualify:
    for them step 2 of the module docstring holds."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "encode"):
        return "not a fast tokenizer"
    try:  # the components alone: the whole tokenizer's JSON holds the vocabulary (megabytes)
        model = type(backend.model).__name__
        pre_spec = json.loads(backend.pre_tokenizer.__getstate__()) if backend.pre_tokenizer else None
        norm_spec = json.loads(backend.normalizer.__getstate__()) if backend.normalizer else None
        added_tokens = list(backend.get_added_tokens_decoder().values())
    except Exception as exc:  # a backend that cannot describe itself is not trusted
        return f"tokenizer description unreadable: {type(exc).__name__}"
    if model != "BPE":
        return "not a BPE model"

    def nodes(node: Any, key: str) -> list[dict[str, Any]]:
        if not node:
            return []
        if node.get("type") == "Sequence":
            return [n for sub in node.get(key, []) for n in nodes(sub, key)]
        return [node]

    pre = nodes(pre_spec, "pretokenizers")
    if not pre or any(p.get("type") not in _SAFE_PRE_TOKENIZERS for p in pre):
        return "pre-tokenizer not byte-level/split"
    if any(p.get("type") == "ByteLevel" and p.get("add_prefix_space") for p in pre):
        return "byte-level with a prefix space"
    if any(p.get("type") == "Split" and (p.get("behavior") != "Isolated" or p.get("invert")) for p in pre):
        return "split that does not isolate its matches"
    if not any(
        p.get("type") == "Split" or (p.get("type") == "ByteLevel" and p.get("use_regex")) for p in pre
    ):
        return "no regex split"
    norm = nodes(norm_spec, "normalizers")
    if any(n.get("type") not in _SAFE_NORMALIZERS for n in norm):
        return "normalizer not local"
    for added in added_tokens:
        content = str(added.content)
        if added.lstrip or added.rstrip or added.single_word or "\n" in content[:-1]:
            return f"added token {content!r} strips whitespace or spans a line"
    return ""


@dataclass
class _Entry:
    text: str
    ids: array[int]
    lines: list[tuple[int, int]]
    """Restart points ``(character, token index)`` in order: a token starts at the character, the previous
    one ends there, the character before is a newline and the one at it is not whitespace."""
    keys: list[int] = field(default_factory=list)
    rkeys: list[int] = field(default_factory=list)
    """Chained hashes of its ``CHUNK``-character suffixes (``_suffix_keys``), for suffix lookups."""


@dataclass
class CacheStats:
    """Counters for tests and the bench: how often the cache answered and how much it saved."""

    hits: int = 0
    misses: int = 0
    overlap_mismatches: int = 0
    reused_tokens: int = 0
    encoded_chars: int = 0
    suffix_hits: int = 0
    """Encodes that also took the ids after a restart point from a cached text ending the same way."""
    suffix_mismatches: int = 0
    head_hits: int = 0
    """Windows of the latest cached message (``remember_part``) answered from its ids without tokenizing
    (``known_head``, ``encode_suffix`` of the whole message)."""


class PrefixTokenCache:
    """``encode(text)``: the token ids of ``text`` (no special tokens added), tokenizing only what
    follows the longest cached common prefix. See the module docstring for why that is exact."""

    def __init__(
        self, tokenizer: Any, max_entries: int = DEFAULT_MAX_ENTRIES, max_tokens: int = DEFAULT_MAX_TOKENS
    ) -> None:
        self.tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[int, _Entry] = {}
        self._rindex: dict[int, _Entry] = {}
        """Suffix keys (``_suffix_keys``) -> the latest entry ending with that suffix."""
        self._parts: dict[str, _Entry] = {}
        """The latest part cached by ``remember_part``, by its text (``known_head``)."""
        self._tokens = 0
        self._lock = threading.Lock()
        self.stats = CacheStats()
        self._added = tuple(
            str(t.content) for t in self._backend.get_added_tokens_decoder().values() if str(t.content)
        )
        """Added tokens' texts: the tokenizer splits the text at them before anything else."""

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def cached_tokens(self) -> int:
        return self._tokens

    def encode(self, text: str, remember: bool = True) -> list[int]:
        """Token ids of ``text``; ``remember=False`` uses the cache without adding ``text`` to it (for
        one-off texts such as a window at a prompt's end)."""
        if (
            len(text) > MAX_TEXT_CHARS
            or self._backend.truncation is not None
            or self._backend.padding is not None
        ):
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        keys, rkeys = _chunk_keys(text), _suffix_keys(text) if REUSE_SUFFIXES else []
        with self._lock:
            base = self._longest(text, keys)
            tail = self._longest_suffix(text, rkeys) if rkeys else None
        ids, lines = self._encode_from(text, base, tail)
        if remember:
            with self._lock:
                self._add(_Entry(text, ids, lines, keys, rkeys))
        return ids.tolist()

    def remember_part(self, text: str, start: int, end: int) -> bool:
        """Cache ``text[start:end]`` with ids taken from ``text``'s cached ids (``text`` was just encoded
        with ``remember``), without tokenizing it: when ``start`` is a restart point of ``text`` (or 0),
        ``text[end:]`` is empty or begins with an added token, and the part's first line tokenizes by itself
        to the same ids. Whether it was cached. See the module docstring (parts of a rendered chat)."""
        if self._backend.truncation is not None or self._backend.padding is not None:
            return False
        if not 0 <= start < end <= len(text) or len(text) > MAX_TEXT_CHARS:
            return False
        with self._lock:
            base = self._longest(text, _chunk_keys(text))
        if base is None or base[1] != len(text) or len(base[0].text) != len(text):
            return False
        entry = base[0]
        ids, lines = entry.ids, entry.lines
        k = bisect.bisect_left(lines, (start, -1))
        if start == 0:
            j0 = 0
        elif k < len(lines) and lines[k][0] == start:
            j0 = lines[k][1]
            k += 1
        else:
            return False
        if end == len(text):
            j1 = len(ids)
        else:
            if not text.startswith(self._added, end):
                return False
            # the tokens from ``end`` to the next restart point (or the text's end): few, tokenized alone
            k2 = bisect.bisect_left(lines, (end, -1))
            stop, j_stop = lines[k2] if k2 < len(lines) else (len(text), len(ids))
            after = self._backend.encode(text[end:stop], add_special_tokens=False).ids
            j1 = j_stop - len(after)
            if j1 <= j0 or ids[j1:j_stop].tolist() != after:
                return False
        inner = [(p - start, j - j0) for p, j in lines[k:] if p < end]
        if not inner:
            return False  # no second restart point to check the first line against
        first_end, first_ids = inner[0]
        if (
            self._backend.encode(text[start : start + first_end], add_special_tokens=False).ids
            != ids[j0 : j0 + first_ids].tolist()
        ):
            return False  # the part does not start cleanly: keep to tokenizing
        part = text[start:end]
        rkeys = _suffix_keys(part) if REUSE_SUFFIXES else []
        entry = _Entry(part, ids[j0:j1], inner, _chunk_keys(part), rkeys)
        with self._lock:
            self._add(entry)
            self._parts.clear()  # only the latest: the message a compression is about to cut
            self._parts[part] = entry
        return True

    def known_head(self, text: str, end: int, n: int) -> tuple[list[int], bool] | None:
        """What tokenizing the window ``text[:end]`` would tell a compression about its first ``n``
        tokens, without tokenizing, when ``text`` is the latest part cached whole (``remember_part``):
        ``(the first n ids, whether the window has at most 2n + 1 tokens)``, or ``None`` (the caller
        tokenizes the window). A window short of the text is answered only when a restart point ``p <
        end`` has at least ``n + 2`` tokens before it: those depend only on ``text[:p]`` (step 2 of the
        module docstring; the character at ``p`` lies inside the window, so it splits there too), so the
        window's own tokens start with them; the flag is then False."""
        ids = self._part_ids(text)
        if ids is None or end <= 0:
            return None
        if end >= len(text):
            return ids[:n].tolist(), len(ids) <= 2 * n + 1
        entry = self._parts[text]
        k = bisect.bisect_left(entry.lines, (end, -1)) - 1  # the last restart point below ``end``
        if k < 0 or entry.lines[k][1] < n + 2:
            return None
        self.stats.head_hits += 1
        self.stats.reused_tokens += n
        return ids[:n].tolist(), False

    def _part_ids(self, text: str) -> array[int] | None:
        """The cached ids of ``text`` when it is the latest part cached by ``remember_part`` (and still
        cached), with ``KNOWN_HEADS`` on."""
        if not KNOWN_HEADS or len(text) > MAX_TEXT_CHARS:
            return None
        if self._backend.truncation is not None or self._backend.padding is not None:
            return None
        with self._lock:
            entry = self._parts.get(text)
            if entry is None or self._entries.get(id(entry)) is not entry:
                return None  # not the remembered part, or evicted since
            self._entries.move_to_end(id(entry))
        return entry.ids

    def encode_suffix(self, text: str, start: int) -> list[int]:
        """Token ids of ``text[start:]`` (no special tokens added), tokenizing only up to its second
        restart point when ``text`` itself is cached (``remember_part``): the ids after the first restart
        point are the cached text's, once the tokens between the first two restart points match them."""
        window = text[start:]
        if start == 0:
            known = self._part_ids(text)
            if known is not None:
                self.stats.head_hits += 1
                self.stats.reused_tokens += len(known)
                return known.tolist()
            return self.encode(text, remember=False)
        if self._backend.truncation is None and self._backend.padding is None and len(text) <= MAX_TEXT_CHARS:
            with self._lock:
                base = self._longest(text, _chunk_keys(text))
            if base is not None and base[1] == len(text) and len(base[0].text) == len(text):
                entry = base[0]
                k = bisect.bisect_left(entry.lines, (start + 1, -1))  # the first restart point after start
                if k + 1 < len(entry.lines):
                    (p1, j1), (p2, j2) = entry.lines[k], entry.lines[k + 1]
                    enc = self._backend.encode(text[start:p2], add_special_tokens=False)
                    fresh = enc.ids
                    m = enc.char_to_token(p1 - start)
                    if (
                        m is not None
                        and m > 0
                        and enc.token_to_chars(m)[0] == p1 - start
                        and enc.token_to_chars(m - 1)[1] <= p1 - start
                        and fresh[m:] == entry.ids[j1:j2].tolist()
                    ):
                        self.stats.hits += 1
                        self.stats.reused_tokens += len(entry.ids) - j2
                        self.stats.encoded_chars += p2 - start
                        out: list[int] = fresh[:m] + entry.ids[j1:].tolist()
                        return out
                    self.stats.overlap_mismatches += 1
        self.stats.misses += 1
        self.stats.encoded_chars += len(window)
        return list(self._backend.encode(window, add_special_tokens=False).ids)

    def _longest(self, text: str, keys: list[int]) -> tuple[_Entry, int] | None:
        """The cached entry sharing the longest prefix with ``text``, and that prefix's length."""
        for k in range(len(keys), 0, -1):
            entry = self._index.get(keys[k - 1])
            if entry is None:
                continue
            n = k * CHUNK
            if entry.text[:n] != text[:n]:
                continue  # a hash collision: look for a shorter prefix
            self._entries.move_to_end(id(entry))
            end = min(len(text), len(entry.text), n + CHUNK)
            while n < end and text[n] == entry.text[n]:
                n += 1
            return entry, n
        return None

    def _longest_suffix(self, text: str, rkeys: list[int]) -> tuple[_Entry, int] | None:
        """The cached entry sharing the longest suffix with ``text`` (at least one chunk), and that
        suffix's length."""
        for k in range(len(rkeys), 0, -1):
            entry = self._rindex.get(rkeys[k - 1])
            if entry is None:
                continue
            n = k * CHUNK
            if entry.text[len(entry.text) - n :] != text[len(text) - n :]:
                continue  # a hash collision: look for a shorter suffix
            self._entries.move_to_end(id(entry))
            end = min(len(text), len(entry.text), n + CHUNK)
            while n < end and text[-n - 1] == entry.text[-n - 1]:
                n += 1
            return entry, n
        return None

    def _encode_from(
        self, text: str, base: tuple[_Entry, int] | None, tail: tuple[_Entry, int] | None = None
    ) -> tuple[array[int], list[tuple[int, int]]]:
        """The ids and restart points of ``text``: the ids before a restart point ``p0`` inside the common
        prefix with ``base`` are the cached entry's, and with ``tail`` (an entry ending as ``text`` does)
        so are the ids after a restart point ``q1`` inside the common suffix; only ``text[p0:q2]`` is
        tokenized (``q2`` the next restart point after ``q1``). Its tokens between ``p0`` and the next
        restart point ``p1``, and between ``q1`` and ``q2``, must equal the cached ones, with tokens
        starting exactly at ``p1`` and ``q1`` (see the module docstring)."""
        head: tuple[_Entry, int, int, int, int, int] | None = None  # entry, k, p0, j0, p1, j1
        if base is not None:
            entry, common = base
            k = bisect.bisect_left(entry.lines, (common, -1)) - 1  # the last restart point below common
            if k >= 1:
                (p0, j0), (p1, j1) = entry.lines[k - 1], entry.lines[k]
                head = (entry, k, p0, j0, p1, j1)
        suffix = self._suffix_points(text, head[4] if head is not None else 0, tail)
        if head is None and suffix is None:
            return self._encode_whole(text)
        p0, j0 = (head[2], head[3]) if head is not None else (0, 0)
        enc = self._backend.encode(
            text[p0 : suffix[0] if suffix is not None else len(text)], add_special_tokens=False
        )
        fresh = enc.ids
        span = 0
        if head is not None:
            entry, k, _, _, p1, j1 = head
            span = j1 - j0
            if not (
                len(fresh) > span
                and fresh[:span] == entry.ids[j0:j1].tolist()
                and enc.token_to_chars(span)[0] == p1 - p0
                and enc.token_to_chars(span - 1)[1] <= p1 - p0
            ):
                self.stats.overlap_mismatches += 1
                return self._encode_whole(text)
        if suffix is not None:
            _, q1, tail_entry, t1, t2 = suffix
            m = _token_at(enc, q1 - p0)
            if m > span and fresh[m:] == tail_entry.ids[t1:t2].tolist():
                self.stats.suffix_hits += 1
                tail_ids = tail_entry.ids[t1:]
                self.stats.reused_tokens += j0 + len(tail_ids)
                self.stats.encoded_chars += suffix[0] - p0
                ids = head[0].ids[:j0] if head is not None else array("i")
                ids.extend(fresh[:m])
                ids.extend(tail_ids)
                shift_p, shift_j = len(text) - len(tail_entry.text), j0 + m - t1
                lines = (head[0].lines[: head[1]] if head is not None else []) + _line_starts(
                    text, enc, p0, j0, q1
                )
                lines += [(p + shift_p, j + shift_j) for p, j in tail_entry.lines if p + shift_p >= q1]
                if head is not None:
                    self.stats.hits += 1
                else:
                    self.stats.misses += 1
                return ids, lines
            self.stats.suffix_mismatches += 1
            if head is None:
                return self._encode_whole(text)
            enc = self._backend.encode(text[p0:], add_special_tokens=False)  # the prefix alone, then
            fresh = enc.ids
        assert head is not None
        self.stats.hits += 1
        self.stats.reused_tokens += j0
        self.stats.encoded_chars += len(text) - p0
        ids = head[0].ids[:j0]
        ids.extend(fresh)
        return ids, head[0].lines[: head[1]] + _line_starts(text, enc, p0, j0)

    def _encode_whole(self, text: str) -> tuple[array[int], list[tuple[int, int]]]:
        self.stats.misses += 1
        self.stats.encoded_chars += len(text)
        enc = self._backend.encode(text, add_special_tokens=False)
        return array("i", enc.ids), _line_starts(text, enc, 0, 0)

    def _suffix_points(
        self, text: str, after: int, tail: tuple[_Entry, int] | None
    ) -> tuple[int, int, _Entry, int, int] | None:
        """``(q2, q1, entry, t1, t2)``: two consecutive restart points ``q1 < q2`` of ``text`` inside its
        common suffix with ``tail`` (the newline before ``q1`` included), ``q1`` past ``after``, and the
        entry's token indices at them; ``None`` when there are none or the suffix saves too little
        (``MIN_SUFFIX_CHARS``)."""
        if tail is None:
            return None
        entry, n = tail
        shift = len(text) - len(entry.text)
        lo = len(entry.text) - n + 1  # a restart point's newline must lie inside the common suffix
        lo = max(lo, after - shift + 1)
        i = bisect.bisect_left(entry.lines, (lo, -1))
        if i + 1 >= len(entry.lines):
            return None
        (c1, t1), (c2, t2) = entry.lines[i], entry.lines[i + 1]
        if len(entry.text) - c2 < MIN_SUFFIX_CHARS:
            return None
        return c2 + shift, c1 + shift, entry, t1, t2

    def _add(self, entry: _Entry) -> None:
        old = self._entries.pop(id(entry), None)
        if old is not None:  # cannot happen for a fresh object, kept for safety of the accounting
            self._tokens -= len(old.ids)
        self._entries[id(entry)] = entry
        self._tokens += len(entry.ids)
        for key in entry.keys:
            self._index[key] = entry
        for key in entry.rkeys:
            self._rindex[key] = entry
        while self._entries and (len(self._entries) > self.max_entries or self._tokens > self.max_tokens):
            _, gone = self._entries.popitem(last=False)
            self._tokens -= len(gone.ids)
            for key in gone.keys:
                if self._index.get(key) is gone:
                    del self._index[key]
            for key in gone.rkeys:
                if self._rindex.get(key) is gone:
                    del self._rindex[key]


def _chunk_keys(text: str) -> list[int]:
    """``h_k`` for each whole ``CHUNK``-character prefix ``k``, chaining the chunks' hashes (and so the
    prefix's length): one pass over the text, and two texts share ``h_k`` (barring collisions, which the
    caller's character comparison catches) iff they share their first ``k`` chunks."""
    keys = []
    h = 0
    for k in range(1, len(text) // CHUNK + 1):
        h = hash((h, text[(k - 1) * CHUNK : k * CHUNK]))
        keys.append(h)
    return keys


def _suffix_keys(text: str) -> list[int]:
    """``_chunk_keys`` of the text read from its end: ``r_k`` for each whole ``CHUNK``-character suffix
    ``k``, so two texts share ``r_k`` (barring collisions) iff they end with the same ``k`` chunks."""
    keys = []
    h = 1  # another chain than the prefix keys' (kept in another index anyway)
    n = len(text)
    for k in range(1, n // CHUNK + 1):
        h = hash((h, text[n - k * CHUNK : n - (k - 1) * CHUNK]))
        keys.append(h)
    return keys


def _token_at(enc: Any, pos: int) -> int:
    """The index of the token of ``enc`` that starts exactly at character ``pos`` with the previous one
    ending at or before it (-1 when none does)."""
    j = enc.char_to_token(pos)
    if j is None or j <= 0:
        return -1
    if enc.token_to_chars(j)[0] != pos or enc.token_to_chars(j - 1)[1] > pos:
        return -1
    return int(j)


def _line_starts(text: str, enc: Any, p0: int, j0: int, end: int | None = None) -> list[tuple[int, int]]:
    """The restart points of ``text[p0:end]``, tokenized as ``enc`` (its token ``j`` is token ``j0 + j``
    of the whole), shifted to the whole text: one lookup per line, not per token."""
    out = []
    stop = len(text) if end is None else end
    i = text.find("\n", p0, stop)
    while i >= 0:
        p = i + 1
        if p < stop and not text[p].isspace():
            j = enc.char_to_token(p - p0)
            if j is not None and j > 0:
                start = enc.token_to_chars(j)[0]
                if start == p - p0 and enc.token_to_chars(j - 1)[1] <= start:
                    out.append((p, j + j0))
        i = text.find("\n", p, stop)
    return out
