"""Turn free model output into a Werewolf :class:`Action`.

Why a hand-written, forgiving parser: policies under RL emit JSON, tags, English or Chinese, often
wrapped in ``<think>`` blocks, and a parse failure costs a re-prompt, so the parser accepts every
common form but never guesses between two *different* explicit actions without a documented rule.

Rules (also in the README):

* ``<think>…</think>`` blocks are removed first (an unclosed ``<think>`` drops the rest; a stray
  ``</think>`` drops everything before it). Input is capped at :data:`MAX_INPUT_CHARS`.
* Speech turns (the only legal kind is ``speak``): the whole remaining text is the speech (a JSON
  object's ``text``/``speech`` field if the text is such an object), capped at ``max_speech_chars``.
* Player numbers in text are **1-based** ("player 3"); ``Action.target`` is the **0-based** seat
  index (player 3 -> seat 2). JSON targets are player numbers too.
* Forms: JSON ``{"action": "vote", "target": 3}``; tags ``<action>vote 3</action>``; ``VOTE: 3``;
  English ("I vote for player 3", "I'll kill seat 5", "inspect 2", "pass"); Chinese ("投票给3号",
  "我投3号", "查验5号", "毒2号", "救", "过"); a bare number ("3", "3号") for the phase's only
  targeted action.
* Several explicit actions in one answer: the **last** one wins ("vote 3 … actually vote 5" -> 5).
  Negations ("don't save", "不救") count as ``pass``.
* A verb of another targeted kind (vote/kill/elect/choose) is read as the phase's only targeted
  action (a wolf writing "I vote for player 3" at night means kill 3) — never for the witch, who
  must say ``save`` or ``poison``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from wolfpack_games.base import Action, LegalAction, ParseResult
from wolfpack_games.werewolf.models import (
    K_BADGE,
    K_ELECT,
    K_INSPECT,
    K_KILL,
    K_PASS,
    K_POISON,
    K_PROTECT,
    K_SAVE,
    K_SHOOT,
    K_SPEAK,
    K_VOTE,
)

MAX_INPUT_CHARS = 20_000

_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_TAG_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)

_EN_NUMBERS = {
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
    "twenty": 20,
}
_ZH_DIGITS = {
    "零": 0,
    "一": 1,
    "二": 2,
    "两": 2,
    "三": 3,
    "四": 4,
    "五": 5,
    "六": 6,
    "七": 7,
    "八": 8,
    "九": 9,
}

GENERIC = "_generic"
# Ordered: the first alternative that matches at a position wins, so longer phrases come first.
_VERBS: tuple[tuple[str, str], ...] = (
    (
        K_BADGE,
        r"(?:pass|give|hand|transfer)\s+(?:the\s+|my\s+)?(?:sheriff\s+)?badge|badge|移交警徽给?|警徽(?:移交)?给|警徽",
    ),
    (K_ELECT, r"\belect\w*|vote\s+(?:for\s+)?sheriff|竞选|选举|选.{0,2}警长"),
    (K_VOTE, r"\bvot(?:e|es|ed|ing)\b|\bexile\b|\beliminate\b|\blynch\b|投票给|投给|投票|放逐|投"),
    (K_KILL, r"\bkill\w*|\bbite\b|\battack\b|\beat\b|\bmurder\b|击杀|袭击|杀|刀"),
    (K_INSPECT, r"\binspect\w*|\bcheck\w*|\binvestigat\w*|\bverif\w*|\bexamine\b|查验|查|验"),
    (K_PROTECT, r"\bprotect\w*|\bguard\w*|\bdefend\w*|\bshield\b|守护|守"),
    (K_SAVE, r"\bsave\w*|\bheal\w*|\brescue\w*|\bantidote\b|解药|救"),
    (K_POISON, r"\bpoison\w*|毒杀|毒死|毒"),
    (K_SHOOT, r"\bshoot\w*|\bshot\b|\btake\s+down\b|开枪带走|开枪打|开枪|带走|枪杀"),
    (GENERIC, r"\bchoos\w*|\bchose\b|\bpick\w*|\bselect\w*|\btarget\w*|选择|选"),
)
_NEG = (
    r"(?:\bdon'?t|\bdo\s+not|\bnot|\bwon'?t|\bwill\s+not|\bno|\bnever)\s+(?:want\s+to\s+|need\s+to\s+|going\s+to\s+)?(?:use\s+)?"
    r"(?:save|heal|use|poison|shoot|vote|kill|protect|guard)\w*|不救|不用药|不使用|不用|不开枪|不投|弃票|弃权|撕警徽|撕掉警徽"
)
_PASS = r"\bpass\b|\bskip\w*|\babstain\w*|\bno\s*one\b|\bnobody\b|\bnone\b|\bnothing\b|跳过|过"
_NUM = (
    r"(?:\d{1,4}|[零一二两三四五六七八九十]{1,3}|"
    + "|".join(r"\b" + w + r"\b" for w in sorted(_EN_NUMBERS, key=len, reverse=True))
    + r")"
)
_FILL = (
    r"[\s:：=#\-\.,]*(?:(?:for|to|on|at|the|player|players|seat|number|no\.|num|p|玩家|给|掉|了)"
    r"[\s:：=#\-\.,]*){0,4}"
)
_ACTION_RE = re.compile(
    r"(?P<neg>"
    + _NEG
    + r")|(?P<verb>"
    + "|".join(f"(?P<k{i}>{pat})" for i, (_, pat) in enumerate(_VERBS))
    + r")(?:"
    + _FILL
    + "(?P<num>"
    + _NUM
    + r")(?![\d])\s*号?)?|(?P<pass>"
    + _PASS
    + ")",
    re.IGNORECASE,
)
_BARE_RE = re.compile(
    r"^\s*(?:player|seat|p|玩家|#|no\.)?\s*(" + _NUM + r")\s*号?(?:玩家)?\s*[.!。！]?\s*$", re.IGNORECASE
)


_CANON_RE = re.compile(r"(kill|protect|inspect|save|poison|shoot|badge|elect|vote)(?: ([0-9]{1,2}))?|(pass)")
"""An answer exactly as the prompt's action list spells it; ``parse_action`` reads it directly."""
_PREDICT_RE = re.compile(r"<predict_next>.*?(?:</predict_next>|$)", re.DOTALL | re.IGNORECASE)


def strip_think(text: str) -> str:
    """Remove reasoning blocks, and ``<predict_next>`` blocks (the author's private guess of its next
    observation, scored by the reward service), so only the answer is parsed (or spoken)."""
    if "<" not in text:
        return text
    text = _PREDICT_RE.sub("", _THINK_RE.sub("", text))
    low = text.lower()
    close = low.rfind("</think>")
    if close >= 0:
        text = text[close + len("</think>") :]
        low = text.lower()
    opening = low.find("<think>")
    if opening >= 0:
        text = text[:opening]
    return text


def _to_int(token: str) -> int | None:
    token = token.strip().lower()
    if token.isdigit():
        return int(token)
    if token in _EN_NUMBERS:
        return _EN_NUMBERS[token]
    if token and all(ch in _ZH_DIGITS or ch == "十" for ch in token):
        if "十" in token:
            head, _, tail = token.partition("十")
            tens = _ZH_DIGITS.get(head, 1) if head else 1
            ones = _ZH_DIGITS.get(tail, 0) if tail else 0
            return tens * 10 + ones
        if len(token) == 1:
            return _ZH_DIGITS[token]
    return None


def _json_target(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        m = re.search(_NUM, value, re.IGNORECASE)
        return _to_int(m.group(0)) if m else None
    return None


_KIND_WORDS: dict[str, str] = {
    "speak": K_SPEAK,
    "speech": K_SPEAK,
    "say": K_SPEAK,
    "talk": K_SPEAK,
    "abstain": K_PASS,
    "skip": K_PASS,
    "none": K_PASS,
    "noop": K_PASS,
}


def _canon_kind(word: str) -> str | None:
    """Map a JSON/tag kind word to a canonical kind (or GENERIC)."""
    w = word.strip().lower()
    if w in _KIND_WORDS:
        return _KIND_WORDS[w]
    m = _ACTION_RE.search(w)
    if m is None:
        return None
    return _kind_of(m)


def _kind_of(m: re.Match[str]) -> str:
    if m.group("neg") is not None or m.group("pass") is not None:
        return K_PASS
    for i, (kind, _) in enumerate(_VERBS):
        if m.group(f"k{i}") is not None:
            return kind
    return GENERIC  # pragma: no cover - the verb group always has one alternative set


def _resolve(
    kind: str, number: int | None, legal: Sequence[LegalAction], n_players: int, text: str = ""
) -> ParseResult:
    """Turn (kind, 1-based number) into an Action, coercing generic verbs to the phase's action."""
    kinds: dict[str, LegalAction] = {}
    targeted: list[LegalAction] = []
    for la in legal:  # one plain loop: this runs for every parsed action (comprehensions add frames)
        kinds[la.kind] = la
        if la.targets:
            targeted.append(la)
    # Never coerce for the witch: reading "choose 3" as poison when she meant to save is too costly.
    if K_SAVE in kinds:
        targeted = []
    if kind not in kinds and kind in (K_VOTE, K_KILL, K_ELECT, GENERIC) and len(targeted) == 1:
        kind = targeted[0].kind
    if kind == GENERIC:
        return ParseResult(None, "could not tell which action you meant; name it explicitly")
    target: int | None = None
    if number is not None:
        if not 1 <= number <= n_players:
            return ParseResult(None, f"there is no player {number} (players are numbered 1..{n_players})")
        target = number - 1
    elif kind in kinds and len(kinds[kind].targets) == 1:
        target = kinds[kind].targets[0]
    if kind == K_SPEAK:
        return ParseResult(Action(K_SPEAK, None, text))
    return ParseResult(Action(kind, target, ""))


def parse_action(
    text: str, legal: Sequence[LegalAction], n_players: int, max_speech_chars: int = 1200
) -> ParseResult:
    """Parse ``text`` against the seat's current ``legal`` actions. Never raises."""
    if not isinstance(text, str):
        return ParseResult(None, "expected text")
    if len(text) > MAX_INPUT_CHARS:
        text = text[:MAX_INPUT_CHARS]
    text = strip_think(text).strip()
    speech_only = bool(legal)
    for la in legal:
        if la.kind != K_SPEAK:
            speech_only = False
            break
    if speech_only:
        speech = text
        if speech.startswith("{") and speech.endswith("}"):
            try:
                data = json.loads(speech)
            except ValueError:
                data = None
            if isinstance(data, dict):
                for key in ("text", "speech", "content", "message"):
                    if isinstance(data.get(key), str):
                        speech = data[key]
                        break
        return ParseResult(Action(K_SPEAK, None, speech[:max_speech_chars].strip()))
    if not text:
        return ParseResult(None, "empty answer; give an action such as 'vote 3' or 'pass'")

    # 0. The exact form the prompt asks for ("vote 3", "pass"): what rules 1-4 would read, without
    # running the general regex over it (most of an LLM turn's parse time).
    canon = _CANON_RE.fullmatch(text)
    if canon is not None:
        kind, num, _ = canon.groups()
        return _resolve(kind or K_PASS, int(num) if num else None, legal, n_players)

    # 1. JSON object anywhere in the answer.
    first, last = text.find("{"), text.rfind("}")
    if 0 <= first < last:
        try:
            data = json.loads(text[first : last + 1])
        except ValueError:
            data = None
        if isinstance(data, dict):
            raw_kind = next(
                (data[k] for k in ("action", "kind", "type", "move") if isinstance(data.get(k), str)), None
            )
            if raw_kind is not None:
                kind = _canon_kind(raw_kind)
                if kind is None:
                    return ParseResult(None, f"unknown action {raw_kind[:40]!r}")
                number = None
                for key in ("target", "player", "seat", "who"):
                    if key in data and data[key] is not None:
                        number = _json_target(data[key])
                        if number is None:
                            return ParseResult(None, f"could not read the target {str(data[key])[:40]!r}")
                        break
                return _resolve(kind, number, legal, n_players)

    # 2. <action>...</action> tag: parse only the (last) tag's content.
    tags = _TAG_RE.findall(text)
    if tags:
        text = tags[-1].strip()
        if not text:
            return ParseResult(None, "empty <action> tag")

    # 3. Natural language / "KIND: N": the last explicit action wins.
    chosen: re.Match[str] | None = None
    for m in _ACTION_RE.finditer(text):
        chosen = m
    if chosen is not None:
        kind = _kind_of(chosen)
        number = None
        if kind != K_PASS:
            num = chosen.group("num")
            if num is not None:
                number = _to_int(num)
        return _resolve(kind, number, legal, n_players)

    # 4. A bare player number.
    bare = _BARE_RE.match(text)
    if bare is not None:
        number = _to_int(bare.group(1))
        return _resolve(GENERIC, number, legal, n_players)
    return ParseResult(None, "could not find an action; answer like 'vote 3', 'inspect 2' or 'pass'")
