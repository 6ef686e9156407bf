"""Per-turn shaping: format, length and invalid-action penalties, and the prediction bonus.

All functions are pure functions of turn protos and numbers, so each rule is testable on its own.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence
from difflib import SequenceMatcher

from wolfpack.v1 import trajectory_pb2
from wolfpack_rewards.config import PenaltyConfig, PredictionConfig, SimilarityMetric
from wolfpack_rewards.result import ScoreError

_OPEN = re.compile(r"<predict_next>", re.I)
_CLOSE = re.compile(r"</predict_next>", re.I)
_WORD = re.compile(r"\w+")

MAX_PREDICTION_WORK = 20_000_000
"""Most character pairs the ``char_ratio`` metric may compare in one Score (difflib is quadratic: about
2-5 s of CPU at this bound). A trajectory over it is refused (INVALID_ARGUMENT) before any work, so one
huge trajectory cannot hold a scoring thread for CPU-minutes while every other Score waits."""


# --- penalties -------------------------------------------------------------------------------------------


def is_invalid(turn: trajectory_pb2.Turn) -> bool:
    """A turn the environment did not accept as given: unparseable/illegal, or replaced by a default."""
    return not turn.valid or turn.defaulted


def missing_tags(text: str, tags: Sequence[str]) -> list[str]:
    """Required tags absent from ``text``. A tag counts as present when its closing ``</tag>`` appears:
    models whose opening ``<think>`` sits in the prompt emit only the closing tag, and a block that was
    opened but never closed is not a finished block."""
    low = text.lower()
    return [tag for tag in tags if f"</{tag.lower()}>" not in low]


def is_over_length(turn: trajectory_pb2.Turn, max_tokens: int | None, max_chars: int | None) -> bool:
    """Over either limit: response token count (exact ids from the policy) or decoded characters."""
    if max_tokens is not None and len(turn.response_token_ids) > max_tokens:
        return True
    return max_chars is not None and len(turn.response_text) > max_chars


def penalty_components(turn: trajectory_pb2.Turn, cfg: PenaltyConfig) -> dict[str, float]:
    """``invalid_penalty``, ``format_penalty`` and ``length_penalty`` for one turn (only those that apply)."""
    out: dict[str, float] = {}
    if cfg.invalid and is_invalid(turn):
        out["invalid_penalty"] = -cfg.invalid
    if cfg.missing_tag and cfg.required_tags:
        missing = missing_tags(turn.response_text, cfg.required_tags)
        if missing:
            out["format_penalty"] = -cfg.missing_tag * len(missing)
    if cfg.over_length and is_over_length(turn, cfg.max_tokens, cfg.max_chars):
        out["length_penalty"] = -cfg.over_length
    return out


# --- prediction --------------------------------------------------------------------------------------------


def extract_prediction(turn: trajectory_pb2.Turn) -> str:
    """``turn.prediction`` when set (the rollout already parsed it), else the last ``<predict_next>``
    block of the response; "" when there is none."""
    if turn.prediction.strip():
        return turn.prediction.strip()
    # The last closed block, found in linear time (a lazy ``<tag>(.*?)</tag>`` findall is quadratic on a
    # text full of unclosed tags).
    text = turn.response_text
    close = _last(_CLOSE.finditer(text))
    if close is None:
        return ""
    opened = _last(_OPEN.finditer(text, 0, close.start()))
    return text[opened.end() : close.start()].strip() if opened is not None else ""


def _last(matches: Iterator[re.Match[str]]) -> re.Match[str] | None:
    found = None
    for found in matches:  # noqa: B007 (the loop's only job is to reach the last match)
        pass
    return found


def char_ratio(a: str, b: str) -> float:
    """difflib's ``2*M/T``. ``autojunk=False``: with autojunk on, characters frequent in a long
    observation (spaces, "e") become junk and the ratio of a good prediction collapses."""
    return SequenceMatcher(None, a, b, autojunk=False).ratio()


def tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def token_f1(prediction: str, target: str) -> float:
    """SQuAD-style bag-of-words F1 over lower-cased ``\\w+`` tokens (0 when either side has none)."""
    pred, gold = tokens(prediction), tokens(target)
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def similarity(prediction: str, target: str, metric: SimilarityMetric) -> float:
    return char_ratio(prediction, target) if metric == "char_ratio" else token_f1(prediction, target)


def next_observation(turns: Sequence[trajectory_pb2.Turn], position: int) -> str | None:
    """Observation of the same seat's next decision after ``turns[position]``, or None.

    Re-prompts (``attempt > 0``) are skipped: they re-show the same state plus feedback, so "predicting"
    them is trivial and says nothing about how the game moved on.
    """
    seat = turns[position].seat
    for turn in turns[position + 1 :]:
        if turn.seat == seat and turn.attempt == 0:
            return turn.observation_text
    return None


def prediction_pairs(
    turns: Sequence[trajectory_pb2.Turn], cfg: PredictionConfig
) -> list[tuple[int, str, str]]:
    """``(position, prediction, target)`` for every turn with a prediction and a next observation, each
    side cut to ``max_chars`` when set: one reverse pass (``next_observation`` per turn was quadratic in
    the turn count), linear in the trajectory's size."""
    if not cfg.weight:
        return []
    cap = cfg.max_chars
    pairs: list[tuple[int, str, str]] = []
    upcoming: dict[int, str] = {}  # seat -> observation of its next fresh decision after this position
    for position in range(len(turns) - 1, -1, -1):
        turn = turns[position]
        target = upcoming.get(turn.seat)
        if target is not None:
            prediction = extract_prediction(turn)
            if prediction:
                pairs.append(
                    (position, prediction[:cap], target[-cap:]) if cap else (position, prediction, target)
                )
        if turn.attempt == 0:  # re-prompts re-show the same state: never a target
            upcoming[turn.seat] = turn.observation_text
    pairs.reverse()
    return pairs


def prediction_work(pairs: Sequence[tuple[int, str, str]], cfg: PredictionConfig) -> int:
    """Character pairs the similarity of ``pairs`` compares (``char_ratio`` is quadratic per pair;
    ``token_f1`` linear)."""
    if cfg.metric == "char_ratio":
        return sum(len(p) * len(t) for _, p, t in pairs)
    return sum(len(p) + len(t) for _, p, t in pairs)


def prediction_components(turns: Sequence[trajectory_pb2.Turn], cfg: PredictionConfig) -> dict[int, float]:
    """``{position: weight * similarity}`` for turns with a prediction and a next observation.

    Bounded work: the whole call's comparisons are counted before any runs and refused past
    ``MAX_PREDICTION_WORK`` (``ScoreError``)."""
    pairs = prediction_pairs(turns, cfg)
    work = prediction_work(pairs, cfg)
    if work > MAX_PREDICTION_WORK:
        raise ScoreError(
            f"trajectory.turns: prediction shaping would compare {work} character pairs; the limit "
            f"is {MAX_PREDICTION_WORK} per Score (lower prediction.max_chars or split the trajectory)"
        )
    return {position: cfg.weight * similarity(p, t, cfg.metric) for position, p, t in pairs}
