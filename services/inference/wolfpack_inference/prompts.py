"""Prompt rendering and text post-processing, independent of any backend.

- Chat prompts are rendered with the tokenizer's own chat template (``apply_chat_template``), so the
  policy sees exactly the format it was trained with.
- Context budget: a chat prompt that does not fit is *compressed* instead of rejected, because game
  transcripts grow every round and a seat must still be able to act. The documented rule
  (``compress_messages``): drop the oldest non-system messages first, always keeping every system message
  and the latest user message; if that is still too long, cut the middle out of the longest remaining
  message, replacing it with ``TRUNCATION_MARKER``. Token prompts are never compressed (the caller chose
  those exact ids).
- ``<think>`` handling: ``strip_think`` removes reasoning blocks from the *text* only; token ids and
  logprobs stay exactly as sampled, since RL needs the whole trajectory.
- ``TextTracker`` turns a growing list of token ids into visible text, stop-string matches and
  stream-safe text deltas.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

TRUNCATION_MARKER = "\n[... truncated ...]\n"
MAX_RENDERS = 64
"""Most renders one compression may do. Dropping is a binary search over how many of the oldest messages
go (about log2(n) renders, not one per message: an 800-message chat took 30-44 s the old way), and each
truncation a binary search over kept characters; past this many renders the prompt is refused as too long
rather than holding a CPU (and, off the event loop or not, other callers) for seconds."""

Message = dict[str, str]


class PromptTooLong(ValueError):
    """The prompt cannot fit even after compression (or compression is disabled)."""


def render_text(tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
    """The chat template's text of ``messages`` (what ``render_chat`` tokenizes when given ``encode``)."""
    return str(
        tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=add_generation_prompt, tokenize=False
        )
    )


def render_chat(
    tokenizer: Any,
    messages: Sequence[Message],
    add_generation_prompt: bool = True,
    encode: Callable[[str], list[int]] | None = None,
) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template. With ``encode`` (a policy's
    ``token_cache.PrefixTokenCache.encode``) the template renders to text and ``encode`` tokenizes it,
    as ``apply_chat_template`` itself does (no special tokens added), but reusing a cached prefix."""
    if encode is not None:
        return encode(render_text(tokenizer, messages, add_generation_prompt))
    out = tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
    )
    if isinstance(out, dict) or hasattr(out, "keys"):  # some tokenizers return a BatchEncoding anyway
        out = out["input_ids"]
    return [int(t) for t in out]


@dataclass(frozen=True)
class TextCodec:
    """Plain-text tokenization of one message's content (no template, no special tokens added), so
    ``compress_messages`` can cut a message in token space after a single tokenization."""

    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    encode_tail: Callable[[str], list[int]] | None = None
    """Tokenizes a window at a message's end (``None``: ``encode``); such windows start anywhere in the
    text and are seldom seen twice, so a caching codec keeps them out of its cache."""
    encode_from: Callable[[str, int], list[int]] | None = None
    """``encode_from(text, start)``: the ids of ``text[start:]`` (``None``: ``encode_tail`` of that
    window); a caching codec takes those after the window's first line from ``text``'s cached ids
    (``PrefixTokenCache.encode_suffix``)."""
    known_head: Callable[[str, int, int], tuple[list[int], bool] | None] | None = None
    """``known_head(text, k, n)``: what tokenizing the window ``text[:k]`` would give ``_end_tokens``
    (its first ``n`` ids, and whether it has at most ``2n + 1``), when a cache knows without tokenizing,
    else ``None`` (``PrefixTokenCache.known_head``)."""

    @classmethod
    def of(
        cls,
        tokenizer: Any,
        encode: Callable[..., list[int]] | None = None,
        encode_from: Callable[[str, int], list[int]] | None = None,
        known_head: Callable[[str, int, int], tuple[list[int], bool] | None] | None = None,
    ) -> TextCodec:
        """The codec of ``tokenizer``; with ``encode`` (``PrefixTokenCache.encode``, which gives the same
        ids) windows at a message's start reuse cached prefixes, with ``encode_from``
        (``PrefixTokenCache.encode_suffix``) windows at its end reuse the cached message, and with
        ``known_head`` (``PrefixTokenCache.known_head``) a window at its start may take no tokenizing."""
        if encode is not None:
            cached = encode
            return cls(
                encode=lambda text: cached(text),
                decode=_plain_decoder(tokenizer),
                encode_tail=lambda text: cached(text, remember=False),
                encode_from=encode_from,
                known_head=known_head,
            )
        return cls(
            encode=lambda text: list(tokenizer.encode(text, add_special_tokens=False)),
            decode=lambda ids: str(tokenizer.decode(ids, skip_special_tokens=False)),
        )

    def metered(self, spend: Callable[[int], None]) -> TextCodec:
        """The same codec, calling ``spend(len(text))`` before each tokenization (an inline caller's bound
        on the work one compression may do; ``spend`` raises to stop it)."""
        encode, tail, suffix = self.encode, self.encode_tail or self.encode, self.encode_from

        def metered_encode(text: str) -> list[int]:
            spend(len(text))
            return encode(text)

        def metered_tail(text: str) -> list[int]:
            spend(len(text))
            return tail(text)

        def metered_from(text: str, start: int) -> list[int]:
            assert suffix is not None
            spend(len(text) - start)
            return suffix(text, start)

        return TextCodec(
            metered_encode, self.decode, metered_tail, metered_from if suffix else None, self.known_head
        )


def _plain_decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """``tokenizer.decode(ids, skip_special_tokens=False)``, straight from the Rust tokenizer when that
    is all the wrapper does (a fast tokenizer's own ``_decode``, no space clean-up): the wrapper first
    checks every id in Python (~0.2 ms for a 240-token window, twice per compressed prompt)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    impl = getattr(type(tokenizer), "_decode", None)
    if (
        backend is not None
        and not getattr(tokenizer, "clean_up_tokenization_spaces", True)
        and getattr(impl, "__qualname__", "")
        in ("TokenizersBackend._decode", "PreTrainedTokenizerFast._decode")
    ):
        return lambda ids: str(backend.decode(ids, skip_special_tokens=False))
    return lambda ids: str(tokenizer.decode(ids, skip_special_tokens=False))


TOKEN_CUT_TRIES = 3
"""Renders a token-space cut may take to settle: the kept head and tail re-tokenize to about the same
count inside the template, and each miss shrinks the cut by what it overshot. Past this the character
search takes over for that message, so the budget holds whatever the tokenizer does at the seams."""


def compress_messages(
    messages: Sequence[Message],
    count: Callable[[Sequence[Message]], int],
    budget: int,
    codec: TextCodec | None = None,
) -> tuple[list[Message], bool]:
    """Messages that render to at most ``budget`` tokens (as measured by ``count``), and whether they
    changed. Raises ``PromptTooLong`` when even the system and latest user messages, truncated, do not fit.

    Order of cuts (documented contract, tested):
      1. drop the oldest messages that are neither a system message nor the latest user message, as few
         as make it fit (found by binary search: fewer renders, same result as dropping one at a time
         while the count shrinks with each drop);
      2. then cut the middle of the longest remaining message, marking the cut with ``TRUNCATION_MARKER``;
         repeat on the next longest if needed. With a ``codec`` the message is tokenized once and cut in
         token space: one render with the message reduced to the marker gives the room left, the middle
         tokens beyond it go, and a render checks the result (at most ``TOKEN_CUT_TRIES``). Without one,
         or if those checks miss, a binary search on kept characters (one render per step: the
         slow path, about log2(characters) renders).
    At most ``MAX_RENDERS`` calls of ``count``; past that the prompt is refused (``PromptTooLong``).
    """
    renders = 0

    def counted(ms: Sequence[Message]) -> int:
        nonlocal renders
        renders += 1
        if renders > MAX_RENDERS:
            raise PromptTooLong(
                f"prompt does not fit the context budget of {budget} tokens within {MAX_RENDERS} "
                "compression steps; send fewer or shorter messages"
            )
        return count(ms)

    msgs = [dict(m) for m in messages]
    if counted(msgs) <= budget:
        return msgs, False
    last_user = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=len(msgs) - 1)
    keep = {i for i, m in enumerate(msgs) if m.get("role") == "system"} | {last_user}
    droppable = [i for i in range(len(msgs)) if i not in keep]

    def without(k: int) -> list[Message]:  # the chat minus the k oldest droppable messages
        gone = set(droppable[:k])
        return [m for j, m in enumerate(msgs) if j not in gone]

    if droppable:
        lo, hi = 1, len(droppable)  # smallest k that fits, if any does
        if counted(without(hi)) <= budget:
            while lo < hi:
                mid = (lo + hi) // 2
                if counted(without(mid)) <= budget:
                    hi = mid
                else:
                    lo = mid + 1
            return without(lo), True
    kept = without(len(droppable))
    tried: set[int] = set()
    while counted(kept) > budget:
        candidates = [i for i in range(len(kept)) if i not in tried and len(kept[i]["content"]) > 0]
        if not candidates:
            raise PromptTooLong(f"prompt does not fit the context budget of {budget} tokens")
        i = max(candidates, key=lambda k: len(kept[k]["content"]))
        tried.add(i)
        text = kept[i]["content"]
        if codec is not None:
            cut = _token_cut(kept, i, codec, counted, budget)
            if cut is not None:
                kept[i] = {**kept[i], "content": cut[0]}
                if cut[1]:
                    return kept, True  # that render already showed the chat fits
                continue
        lo, hi = 0, len(text)  # characters kept
        while lo < hi:
            mid = (lo + hi + 1) // 2
            trial = [*kept[:i], {**kept[i], "content": _cut_middle(text, mid)}, *kept[i + 1 :]]
            if counted(trial) <= budget:
                lo = mid
            else:
                hi = mid - 1
        kept[i] = {**kept[i], "content": _cut_middle(text, lo)}
    return kept, True


def _token_cut(
    kept: list[Message], i: int, codec: TextCodec, counted: Callable[[Sequence[Message]], int], budget: int
) -> tuple[str, bool] | None:
    """Message ``i``'s content with its middle tokens replaced by the marker, and whether a render showed
    the chat now fits ``budget`` (False: only the marker is left and other messages must be cut too);
    ``None`` when ``TOKEN_CUT_TRIES`` renders did not settle on a cut that fits."""
    text = kept[i]["content"]

    def with_content(content: str) -> list[Message]:
        return [*kept[:i], {**kept[i], "content": content}, *kept[i + 1 :]]

    room = budget - counted(with_content(TRUNCATION_MARKER))  # tokens the content's ends may take
    for _ in range(TOKEN_CUT_TRIES):
        if room <= 0:
            return TRUNCATION_MARKER, False  # not even one token fits: the next longest message is cut too
        head = (room + 1) // 2
        tail = room - head
        head_ids, whole = _end_tokens(text, head, codec, from_start=True)
        if whole:
            return None  # the message is hardly longer than the room: the character search cuts it exactly
        tail_ids = _end_tokens(text, tail, codec, from_start=False)[0] if tail else []
        # a cut inside a multi-byte character decodes to U+FFFD: drop that partial character
        content = (
            codec.decode(head_ids).rstrip("\ufffd")
            + TRUNCATION_MARKER
            + (codec.decode(tail_ids).lstrip("\ufffd") if tail_ids else "")
        )
        over = counted(with_content(content)) - budget
        if over <= 0:
            return content, True
        room -= over
    return None


def _end_tokens(text: str, n: int, codec: TextCodec, *, from_start: bool) -> tuple[list[int], bool]:
    """The first (or last) ``n`` tokens of ``text``, tokenizing only a window at that end (a slow
    tokenizer's cost grows with the text, and a Werewolf transcript is several times the room left), and
    whether the window had to take the whole text. The window's token at the cut may be a word split in
    two, so it is dropped; what a window yields otherwise matches the whole text's tokens up to the seam,
    and the caller's render checks the result either way."""
    k = min(len(text), 8 * (n + 8))
    if from_start and codec.known_head is not None:
        known = codec.known_head(text, k, n)  # what the first window below would give, if cached
        if known is not None:
            return known
    encode = codec.encode if from_start or codec.encode_tail is None else codec.encode_tail
    while True:
        window = text[:k] if from_start else text[len(text) - k :]
        if from_start or codec.encode_from is None:
            ids = encode(window)
        else:
            ids = codec.encode_from(text, len(text) - k)  # the same ids, mostly from the cached message
        if k >= len(text):
            return (ids[:n] if from_start else ids[max(len(ids) - n, 0) :]), len(ids) <= 2 * n + 1
        if len(ids) > n + 1:
            return (ids[:n] if from_start else ids[len(ids) - n :]), False
        k = min(len(text), 2 * k)


def _cut_middle(text: str, keep: int) -> str:
    if keep >= len(text):
        return text
    head = (keep + 1) // 2
    tail = keep - head
    return text[:head] + TRUNCATION_MARKER + (text[len(text) - tail :] if tail else "")


_THINK_BLOCK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


def strip_think(text: str) -> str:
    """Text without reasoning: ``<think>…</think>`` blocks (and an unclosed trailing ``<think>…``) are
    removed, as is everything up to a leading ``</think>`` when the template opened the block in the
    prompt (Qwen3-style)."""
    close = text.find("</think>")
    if close >= 0 and "<think>" not in text[:close]:
        text = text[close + len("</think>") :]
    return _THINK_BLOCK.sub("", text).lstrip()


@dataclass
class TextTracker:
    """Incremental detokenizer for one completion: visible text, stop-string detection, stream deltas.

    ``decode`` maps token ids to text (``skip_special_tokens=True``). The visible text is the decoded text
    cut at the first stop string, then passed through ``strip_think`` when asked. Stream deltas hold back
    the last few characters that could still grow into a stop string or a ``<think>`` tag, and any
    incomplete UTF-8 sequence (decoded as U+FFFD), so streamed text never has to be retracted.
    """

    decode: Callable[[list[int]], str]
    stop: Sequence[str] = ()
    think: bool = False
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    stopped: bool = False
    emitted: int = 0

    def add(self, token_id: int) -> bool:
        """Append one token; return True when a stop string now matches (the text is cut before it)."""
        self.token_ids.append(token_id)
        raw = self.decode(self.token_ids)
        cut = min((k for k in (raw.find(s) for s in self.stop if s) if k >= 0), default=-1)
        if cut >= 0:
            raw, self.stopped = raw[:cut], True
        self.text = raw
        return self.stopped

    @property
    def visible(self) -> str:
        return strip_think(self.text) if self.think else self.text

    def delta(self, final: bool = False) -> str:
        """Visible text not yet streamed; unless ``final``, minus a hold-back tail."""
        vis = self.visible
        end = len(vis)
        if not final:
            hold = max([len(s) - 1 for s in self.stop if s] + [len("</think>") if self.think else 0, 0])
            end = max(self.emitted, end - hold)
            while end > self.emitted and vis[end - 1] == "\ufffd":
                end -= 1
        out = vis[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return out
