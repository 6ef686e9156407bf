"""Prediction shaping's work bound and ``char_ratio``'s junk heuristic, with hand-computed numbers."""

from __future__ import annotations

import pytest

from wolfpack.v1 import trajectory_pb2
from wolfpack_rewards import shaping
from wolfpack_rewards.config import PredictionConfig
from wolfpack_rewards.result import ScoreError

PAIRS = [(0, "abc", "defgh"), (3, "x" * 10, "y" * 7)]  # lengths (3, 5) and (10, 7)


def test_prediction_work_per_metric() -> None:
    # char_ratio is quadratic per pair: 3*5 + 10*7 = 85; token_f1 is linear: 3+5 + 10+7 = 25.
    assert shaping.prediction_work(PAIRS, PredictionConfig(metric="char_ratio")) == 85
    assert shaping.prediction_work(PAIRS, PredictionConfig(metric="token_f1")) == 25
    assert shaping.prediction_work([], PredictionConfig(metric="char_ratio")) == 0


def _turns(prediction: str, observation: str) -> list[trajectory_pb2.Turn]:
    return [
        trajectory_pb2.Turn(seat=0, prediction=prediction),
        trajectory_pb2.Turn(seat=0, observation_text=observation),
    ]


@pytest.mark.parametrize("metric", ["char_ratio", "token_f1"])
def test_work_bound_is_inclusive(monkeypatch: pytest.MonkeyPatch, metric: str) -> None:
    # Prediction 3 chars, target 4 chars: char_ratio work 12, token_f1 work 7. A bound equal to the work
    # is allowed; one less is refused before any comparison.
    work = 12 if metric == "char_ratio" else 7
    cfg = PredictionConfig(weight=1.0, metric=metric, max_chars=None)  # type: ignore[arg-type]
    turns = _turns("a b", "a bc")
    monkeypatch.setattr(shaping, "MAX_PREDICTION_WORK", work)
    assert set(shaping.prediction_components(turns, cfg)) == {0}
    monkeypatch.setattr(shaping, "MAX_PREDICTION_WORK", work - 1)
    with pytest.raises(ScoreError, match=f"compare {work} character pairs"):
        shaping.prediction_components(turns, cfg)


def test_large_texts_refused_for_char_ratio_only() -> None:
    # 5000 x 5000 = 25M character pairs for difflib (over the 20M bound); token_f1 reads 10k characters.
    turns = _turns("a" * 5000, "b" * 5000)
    with pytest.raises(ScoreError, match="25000000"):
        shaping.prediction_components(
            turns, PredictionConfig(weight=1.0, metric="char_ratio", max_chars=None)
        )
    got = shaping.prediction_components(
        turns, PredictionConfig(weight=1.0, metric="token_f1", max_chars=None)
    )
    assert got == {0: 0.0}  # no common token


def test_char_ratio_does_not_treat_frequent_characters_as_junk() -> None:
    # 300 characters each: the longest common block is the 299 "a"s; the "x"s sit on opposite ends, so
    # nothing else matches: ratio 2 * 299 / 600. (With difflib's autojunk, "a" -- over 1 % of a text of
    # 200+ characters -- would be junk and only the "x" could anchor a match.)
    assert shaping.char_ratio("a" * 299 + "x", "x" + "a" * 299) == pytest.approx(2 * 299 / 600)
