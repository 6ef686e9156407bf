"""Similarity metrics, prediction extraction and penalty rules on known strings."""

from __future__ import annotations

import pytest

from wolfpack.v1 import trajectory_pb2
from wolfpack_rewards import shaping
from wolfpack_rewards.config import PenaltyConfig, PredictionConfig


@pytest.mark.parametrize(
    ("a", "b", "ratio"),
    [
        ("abcd", "bcde", 0.75),  # "bcd": 2 * 3 / 8
        ("same", "same", 1.0),
        ("abc", "xyz", 0.0),
        ("", "", 1.0),  # difflib's convention for two empty strings
        ("Seat 0 is a werewolf.", "Seat 0 is a wolf.", 34 / 38),
    ],
)
def test_char_ratio(a: str, b: str, ratio: float) -> None:
    assert shaping.char_ratio(a, b) == pytest.approx(ratio)


def test_char_ratio_no_autojunk_on_long_text() -> None:
    target = "the village votes " * 20 + "seat 3 dies"
    # With autojunk, frequent characters of the 371-char target become junk and this drops sharply.
    assert shaping.char_ratio(target, target) == 1.0


@pytest.mark.parametrize(
    ("pred", "gold", "f1"),
    [
        ("the cat sat", "the cat ran away", 4 / 7),  # 2 common, P 2/3, R 1/2
        ("Seat 3 died!", "seat 3 DIED", 1.0),  # case and punctuation do not matter
        ("a a b", "a b b", 2 / 3),  # bag of words: min counts -> 2 common, P = R = 2/3
        ("nothing", "else", 0.0),
        ("", "anything", 0.0),
    ],
)
def test_token_f1(pred: str, gold: str, f1: float) -> None:
    assert shaping.token_f1(pred, gold) == pytest.approx(f1)


def test_extract_prediction() -> None:
    t = trajectory_pb2.Turn(
        response_text="<PREDICT_NEXT> first </PREDICT_NEXT> x <predict_next>last</predict_next>"
    )
    assert shaping.extract_prediction(t) == "last"
    t.prediction = "from the field"
    assert shaping.extract_prediction(t) == "from the field"
    assert shaping.extract_prediction(trajectory_pb2.Turn(response_text="<predict_next>open")) == ""


def test_next_observation_same_seat_skips_reprompts() -> None:
    turns = [
        trajectory_pb2.Turn(seat=0, observation_text="a"),
        trajectory_pb2.Turn(seat=1, observation_text="b"),
        trajectory_pb2.Turn(seat=0, observation_text="retry", attempt=1),
        trajectory_pb2.Turn(seat=0, observation_text="c"),
    ]
    assert shaping.next_observation(turns, 0) == "c"
    assert shaping.next_observation(turns, 1) is None
    assert shaping.next_observation(turns, 3) is None


def test_prediction_components_weight_and_metric() -> None:
    turns = [
        trajectory_pb2.Turn(seat=0, response_text="<predict_next>seat 2 dies</predict_next>"),
        trajectory_pb2.Turn(seat=0, observation_text="seat 2 was killed"),
    ]
    # tokens [seat, 2, dies] vs [seat, 2, was, killed]: 2 common, P 2/3, R 1/2 -> 4/7.
    got = shaping.prediction_components(turns, PredictionConfig(weight=0.5, metric="token_f1"))
    assert got == {0: pytest.approx(0.5 * 4 / 7)}
    assert shaping.prediction_components(turns, PredictionConfig(weight=0.0)) == {}


def test_penalty_rules() -> None:
    assert (
        shaping.missing_tags("<think>a</think><predict_next>b</predict_next>", ["think", "predict_next"])
        == []
    )
    assert shaping.missing_tags("a</think> only closing", ["think"]) == []  # opening tag in the prompt
    assert shaping.missing_tags("<think>never closed", ["think"]) == ["think"]
    turn = trajectory_pb2.Turn(valid=True, response_text="abcdef", response_token_ids=[1, 2, 3])
    assert not shaping.is_over_length(turn, 3, 6)
    assert shaping.is_over_length(turn, 2, None)
    assert shaping.is_over_length(turn, None, 5)
    assert shaping.penalty_components(turn, PenaltyConfig(invalid=1.0)) == {}
    turn.defaulted = True
    assert shaping.penalty_components(turn, PenaltyConfig(invalid=1.0)) == {"invalid_penalty": -1.0}
    assert shaping.is_invalid(trajectory_pb2.Turn(valid=False))


def test_prediction_compares_the_observation_tail() -> None:
    turns = [
        trajectory_pb2.Turn(seat=0, response_text="<predict_next>seat 2 dies</predict_next>"),
        trajectory_pb2.Turn(seat=0, observation_text="x" * 5000 + "seat 2 dies"),
    ]
    tail = shaping.prediction_components(turns, PredictionConfig(weight=1.0, max_chars=11))
    assert tail == {0: 1.0}
    full = shaping.prediction_components(turns, PredictionConfig(weight=1.0, max_chars=None))
    assert full[0] == pytest.approx(2 * 11 / 5022)
