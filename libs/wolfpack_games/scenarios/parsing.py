"""Tolerant-but-strict parsing of formal statements (``FINAL_BID: 50``, ``ACCEPT``, ``ALLOCATION: {...}``).

Rules (documented in README.md, shared by every family so models learn one convention):

1. ``<think>…</think>`` blocks are removed first (an unclosed ``<think>`` drops the rest of the text; a
   stray ``</think>`` drops everything before it, as emitted by models whose opening tag is in the prompt).
2. The text is NFKC-normalised, so full-width colons/digits (``FINAL_BID：５０``) read as ASCII, and
   markdown emphasis/code marks (``**``, ``__``, backticks) are dropped.
3. A statement counts only where its author *makes* it: at the start of a line (after optional bullets or
   a heading mark), or right after sentence punctuation (``. ! ? ; ,`` and their CJK forms) or a CJK
   character. A keyword inside a quoted span (``"…"``, ``'…'``, ``“…”``, ``‘…’``, ``「…」``, ``『…』``) or on a
   ``>`` block-quote line is a quotation and is ignored; so is a keyword in the middle of an English
   sentence ("he said FINAL_BID: 50").
4. Value keywords (``FINAL_BID``) are case-insensitive but need a ``:`` or ``=``; flag keywords
   (``ACCEPT``) must be upper case and a whole word, so ordinary prose ("I accept that…") is chat.
5. Within one message the *last valid* statement of a keyword counts (self-corrections). A keyword that
   appears only in malformed form (bad number, out of range, inconsistent mapping) makes the message
   malformed; two *different* keywords in one message (``ACCEPT`` and ``REJECT``, or a bid and an
   ``ACCEPT``) are contradictory and also malformed. A malformed message is rejected by the engine (the
   seat is re-prompted) and, in a transcript given to the verifier, loses for its author.
6. A message must contain something meaningful (a Latin letter, a digit or a CJK ideograph) after the
   think blocks are removed; empty or symbol-only text is invalid.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.S | re.I)
# A <predict_next> block is the author's private guess of what comes next (scored by the reward
# service); statements inside it must not count, and other seats must not read it.
_PREDICT_BLOCK = re.compile(r"<predict_next>.*?(?:</predict_next>|$)", re.S | re.I)
_MEANINGFUL = re.compile(r"[A-Za-z0-9\u4e00-\u9fff]")
_QUOTES = (
    re.compile(r'"[^"\n]*"'),
    re.compile(r"“[^”\n]*”"),
    re.compile(r"‘[^’\n]*’"),
    re.compile(r"「[^」\n]*」"),
    re.compile(r"『[^』\n]*』"),
    re.compile(r"(?<!\w)'[^'\n]*'(?!\w)"),
)
_BULLET_PREFIX = re.compile(r"\s*(?:[-*•+]|\d{1,2}[.)]|#{1,6})?\s*")
_SENTENCE_PUNCT = frozenset(".!?;,。！？；，、")


class StatementError(ValueError):
    """A statement whose keyword was found but whose value is not acceptable."""


def strip_think(text: str) -> str:
    """Remove reasoning and prediction blocks so that statements inside them never count."""
    text = _PREDICT_BLOCK.sub("", _THINK_BLOCK.sub("", text))
    low = text.lower()
    opened = low.find("<think>")
    if opened >= 0:
        text = text[:opened]
    closed = text.lower().rfind("</think>")
    if closed >= 0:
        text = text[closed + len("</think>") :]
    return text


def normalize(text: str) -> str:
    """NFKC (full-width to ASCII) and drop markdown emphasis marks."""
    text = unicodedata.normalize("NFKC", text).replace("\r\n", "\n").replace("\r", "\n")
    return text.replace("**", "").replace("__", "").replace("`", "")


def visible_text(text: str) -> str:
    """What other seats see of a message: think blocks removed, whitespace trimmed."""
    return strip_think(text).strip()


def _is_cjk(ch: str) -> bool:
    return "\u4e00" <= ch <= "\u9fff" or "\u3400" <= ch <= "\u4dbf"


def _quoted_spans(text: str) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for pattern in _QUOTES:
        spans.extend((m.start(), m.end()) for m in pattern.finditer(text))
    return spans


def _context_ok(text: str, start: int, spans: Sequence[tuple[int, int]]) -> bool:
    if any(a <= start < b for a, b in spans):
        return False
    line_start = text.rfind("\n", 0, start) + 1
    prefix = text[line_start:start]
    if prefix.lstrip().startswith(">"):
        return False
    if _BULLET_PREFIX.fullmatch(prefix):
        return True
    stripped = prefix.rstrip()
    last = stripped[-1]
    if last in _SENTENCE_PUNCT or _is_cjk(last):
        return True
    return last == ":" and len(stripped) >= 2 and _is_cjk(stripped[-2])


@dataclass(frozen=True, slots=True)
class StatementSpec:
    """A formal statement keyword. ``pattern`` matches the keyword itself."""

    keyword: str
    pattern: re.Pattern[str]
    takes_value: bool

    @staticmethod
    def value(keyword: str) -> StatementSpec:
        """``KEYWORD: value`` — case-insensitive, ``_``/space/``-`` interchangeable, colon required."""
        parts = [re.escape(p) for p in keyword.split("_")]
        body = r"[ _-]?".join(parts)
        return StatementSpec(keyword, re.compile(rf"(?<![A-Za-z0-9_]){body}\s*[:=]\s*", re.I), True)

    @staticmethod
    def flag(keyword: str) -> StatementSpec:
        """``KEYWORD`` — upper case, whole word."""
        return StatementSpec(
            keyword, re.compile(rf"(?<![A-Za-z0-9_]){re.escape(keyword)}(?![A-Za-z0-9_])"), False
        )


ValueParser = Callable[[str, str], Any]
"""``parse_value(keyword, rest_of_text) -> value``; raises ``StatementError``."""


@dataclass(frozen=True, slots=True)
class ParsedMessage:
    """One message after parsing: its visible text, the statement it makes (if any), or an error."""

    visible: str
    keyword: str | None = None
    value: Any = None
    error: str = ""
    all_found: tuple[tuple[str, str], ...] = field(default=())  # (keyword, "ok"|error) in order

    @property
    def ok(self) -> bool:
        return not self.error


def parse_message(text: str, specs: Sequence[StatementSpec], parse_value: ValueParser) -> ParsedMessage:
    """Apply the module rules to one message."""
    visible = visible_text(text)
    if not _MEANINGFUL.search(unicodedata.normalize("NFKC", visible)):
        return ParsedMessage(visible, error="empty message: write something (words or a formal statement)")
    norm = normalize(visible)
    spans = _quoted_spans(norm)
    found: list[tuple[int, str, Any, str]] = []  # (pos, keyword, value, error)
    for spec in specs:
        for m in spec.pattern.finditer(norm):
            if not _context_ok(norm, m.start(), spans):
                continue
            if not spec.takes_value:
                found.append((m.start(), spec.keyword, None, ""))
                continue
            try:
                value = parse_value(spec.keyword, norm[m.end() :])
            except StatementError as exc:
                found.append((m.start(), spec.keyword, None, str(exc)))
            else:
                found.append((m.start(), spec.keyword, value, ""))
    found.sort(key=lambda f: f[0])
    trace = tuple((kw, err or "ok") for _, kw, _, err in found)
    if not found:
        return ParsedMessage(visible, all_found=trace)
    keywords = list(dict.fromkeys(kw for _, kw, _, _ in found))
    last_valid: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for _, kw, value, err in found:
        if err:
            errors.setdefault(kw, err)
        else:
            last_valid[kw] = value
    for kw in keywords:
        if kw not in last_valid:
            return ParsedMessage(visible, error=f"malformed {kw}: {errors[kw]}", all_found=trace)
    if len(keywords) > 1:
        return ParsedMessage(
            visible,
            error=f"contradictory statements in one message: {' and '.join(keywords)}",
            all_found=trace,
        )
    kw = keywords[0]
    return ParsedMessage(visible, keyword=kw, value=last_valid[kw], all_found=trace)


# ---------------------------------------------------------------------------------------------- values

_NUMBER = re.compile(
    r"(?:[$¥€£]|USD|RMB|CNY)?\s*(?P<num>[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?"
    r"|[-+]?(?:nan|inf(?:inity)?)(?![A-Za-z]))",
    re.I,
)
_RANGE_AFTER = re.compile(r"\s*(?:[-~–—]|to\s|or\s|至|到|或)\s*\d", re.I)


def parse_amount(rest: str, low: float, high: float, *, integer: bool = False, what: str = "amount") -> float:
    """The number right after a keyword, within ``[low, high]``; NaN/inf/exponents/ranges are malformed."""
    m = _NUMBER.match(rest)
    if m is None:
        raise StatementError(f"{what} must be a number")
    raw = m.group("num")
    if re.search(r"[eE]", raw) and not re.fullmatch(r"[-+]?(?:nan|inf(?:inity)?)", raw, re.I):
        raise StatementError(f"{what} {raw!r} uses exponent notation; write the plain number")
    value = float(raw.replace(",", ""))
    if not math.isfinite(value):
        raise StatementError(f"{what} {raw!r} is not a finite number")
    if _RANGE_AFTER.match(rest, m.end()):
        raise StatementError(f"{what} must be one number, not a range")
    if integer and value != int(value):
        raise StatementError(f"{what} must be a whole number")
    if not low <= value <= high:
        raise StatementError(f"{what} {raw} is out of range [{low:g}, {high:g}]")
    return value


def parse_choice(rest: str, choices: dict[str, str], what: str = "choice") -> str:
    """The first word after a keyword mapped through ``choices`` (lower-cased keys)."""
    m = re.match(r"[A-Za-z]+|[\u4e00-\u9fff]{1,4}", rest.strip())
    word = m.group(0).lower() if m else ""
    for key in sorted(choices, key=len, reverse=True):
        if word == key or (word.startswith(key) and not key.isascii()):
            return choices[key]
    valid = ", ".join(sorted({v for v in choices.values()}))
    raise StatementError(f"{what} must be one of {valid}")


def _balanced_braces(rest: str) -> str:
    rest = rest.lstrip()
    if not rest.startswith("{"):
        raise StatementError("expected a mapping in braces, e.g. {item: name, ...}")
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    raise StatementError("unclosed '{' in mapping")


def parse_mapping(rest: str) -> list[tuple[str, str]]:
    """``{a: x, "b": "y"}`` → ``[("a","x"), ("b","y")]`` (order kept, duplicates kept for the caller)."""
    body = _balanced_braces(rest)
    if "{" in body:
        raise StatementError("nested mappings are not allowed")
    pairs: list[tuple[str, str]] = []
    for chunk in re.split(r"[,;\n]", body):
        if not chunk.strip():
            continue
        if ":" not in chunk and "=" not in chunk:
            raise StatementError(f"entry {chunk.strip()!r} is not 'key: value'")
        key, _, value = chunk.replace("=", ":", 1).partition(":")
        key = key.strip().strip("\"'“”‘’「」").strip()
        value = value.strip().strip("\"'“”‘’「」").strip()
        if not key or not value:
            raise StatementError(f"entry {chunk.strip()!r} has an empty key or value")
        pairs.append((key, value))
    if not pairs:
        raise StatementError("empty mapping")
    return pairs


def number_of(text: str, what: str, low: float, high: float, integer: bool = True) -> float:
    """Parse a whole mapping value as a number (used by coalition splits)."""
    m = _NUMBER.fullmatch(text.strip())
    if m is None:
        raise StatementError(f"{what} {text!r} must be a number")
    return parse_amount(text.strip(), low, high, integer=integer, what=what)
