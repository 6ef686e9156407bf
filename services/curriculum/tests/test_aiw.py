"""AIW reweighting against hand-computed examples (Jaccard similarity of word sets)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from pydantic import BaseModel, ValidationError

from wolfpack_curriculum.aiw import AIWConfig, Failure, neighbours, on_outcome, remember, similarity

CFG = AIWConfig(
    self_boost=1.0, boost=0.5, top_k=2, threshold=0.3, floor=0.1, success_decay=0.5, max_history=2
)
HISTORY = [
    Failure("A", "red wolf night"),
    Failure("B", "Red wolf, day!"),
    Failure("C", "blue fox swim"),
]


def test_similarity_is_jaccard_of_lowercased_words() -> None:
    assert similarity("red wolf night vote", "red wolf night") == pytest.approx(3 / 4)
    assert similarity("red wolf night vote", "Red wolf, day!") == pytest.approx(2 / 5)
    assert similarity("red wolf night vote", "blue fox swim") == 0.0
    assert similarity("", "") == 0.0


def test_failure_boosts_itself_and_its_similar_past_failures() -> None:
    update = on_outcome("X", False, "red wolf night vote", {"A": 1.2}, HISTORY, CFG)
    # X: unseen (1.0) + self_boost 1.0; A: 1.2 + 0.5 * 3/4; B: 1.0 + 0.5 * 2/5; C below the threshold.
    assert update.weights == pytest.approx({"X": 2.0, "A": 1.575, "B": 1.2})
    assert update.failure == Failure("X", "red wolf night vote")


def test_top_k_and_threshold_limit_the_neighbours() -> None:
    one = CFG.model_copy(update={"top_k": 1})
    [(key, sim)] = neighbours("red wolf night vote", HISTORY, "X", one)
    assert key == "A" and sim == pytest.approx(0.75)
    strict = CFG.model_copy(update={"threshold": 0.5})
    assert [k for k, _ in neighbours("red wolf night vote", HISTORY, "X", strict)] == ["A"]


def test_a_task_is_not_its_own_neighbour() -> None:
    update = on_outcome("A", False, "red wolf night", {"A": 1.0}, HISTORY, CFG)
    # A: 1.0 + 1.0 only; B: sim({red,wolf,night},{red,wolf,day}) = 2/4 -> 1.0 + 0.25.
    assert update.weights == pytest.approx({"A": 2.0, "B": 1.25})


def test_success_decays_down_to_the_floor() -> None:
    assert on_outcome("A", True, "x", {"A": 3.0}, HISTORY, CFG).weights == {"A": 1.5}
    assert on_outcome("A", True, "x", {"A": 0.15}, HISTORY, CFG).weights == {"A": 0.1}
    assert on_outcome("A", True, "x", {}, HISTORY, CFG).failure is None


def test_history_keeps_the_newest_and_fingerprints_are_capped() -> None:
    kept = remember(HISTORY[:2], Failure("D", "d"), CFG)
    assert [f.task_key for f in kept] == ["B", "D"]
    capped = on_outcome("E", False, "abcdef", {}, [], CFG.model_copy(update={"fingerprint_chars": 3}))
    assert capped.failure == Failure("E", "abc")


def test_defaults_and_bounds_are_the_documented_ones(
    check_documented_knobs: Callable[[type[BaseModel], str], None],
) -> None:
    check_documented_knobs(AIWConfig, "aiw")


def test_the_config_is_frozen_and_rejects_unknown_keys() -> None:
    with pytest.raises(ValidationError):
        CFG.top_k = 5  # type: ignore[misc]
    with pytest.raises(ValidationError, match="neighbour_boost"):
        AIWConfig.model_validate({"neighbour_boost": 0.5})


def test_neighbours_come_most_similar_first() -> None:
    # Against {a, b, c, d}: "a b c" -> 3/4, "a b" -> 2/4, "a" -> 1/4 (keys in the opposite order).
    history = [Failure("A", "a"), Failure("B", "a b"), Failure("C", "a b c")]
    wide = CFG.model_copy(update={"top_k": 3, "threshold": 0.2})
    assert neighbours("a b c d", history, "X", wide) == [("C", 0.75), ("B", 0.5), ("A", 0.25)]
    assert neighbours("a b c d", history, "X", wide.model_copy(update={"top_k": 1})) == [("C", 0.75)]


def test_a_task_that_failed_twice_counts_with_its_most_similar_failure() -> None:
    # Against {a, b, c, d}: "a b c" -> 3/4, "a b z" -> |{a, b}| / |{a, b, c, d, z}| = 2/5; both above 0.3.
    for history in (
        [Failure("A", "a b c"), Failure("A", "a b z")],
        [Failure("A", "a b z"), Failure("A", "a b c")],
    ):
        assert neighbours("a b c d", history, "X", CFG) == [("A", 0.75)]


def test_ties_do_not_depend_on_the_order_of_the_history() -> None:
    # "red wolf" against "red wolf night" and "red wolf day": 2/3 each; only one fits in top_k = 1.
    history = [Failure("Q", "red wolf night"), Failure("P", "red wolf day"), Failure("R", "blue")]
    one = CFG.model_copy(update={"top_k": 1})
    picks = {tuple(neighbours("red wolf", order, "X", one)) for order in itertools.permutations(history)}
    assert len(picks) == 1
    [((key, sim),)] = picks
    assert key in {"P", "Q"} and sim == pytest.approx(2 / 3)


def test_the_threshold_is_inclusive() -> None:
    # "a b" against {a, b, c, d}: 2/4 = 0.5 exactly (a binary fraction), at a threshold of exactly 0.5.
    at = CFG.model_copy(update={"threshold": 0.5})
    assert neighbours("a b c d", [Failure("B", "a b")], "X", at) == [("B", 0.5)]
    # threshold 0: every past failure of another task is a neighbour, even with nothing in common; it
    # gains boost x 0, so its weight is written back unchanged.
    zero = CFG.model_copy(update={"threshold": 0.0})
    assert neighbours("a b", [Failure("C", "x y")], "X", zero) == [("C", 0.0)]
    update = on_outcome("X", False, "a b", {"C": 0.7}, [Failure("C", "x y")], zero)
    assert update.weights == {"X": 2.0, "C": 0.7}


def test_tasks_are_compared_by_key_value_not_identity() -> None:
    """Task keys are built at run time (``f"{bucket}#{seed}"``): two equal keys are different objects."""
    mine, same = "".join(["ww#", "7"]), "".join(["ww", "#7"])
    assert mine == same and mine is not same
    assert neighbours("red wolf night", [Failure(same, "red wolf night")], mine, CFG) == []


def test_top_k_zero_boosts_only_the_failed_task_and_a_history_of_one_keeps_the_newest() -> None:
    none = CFG.model_copy(update={"top_k": 0})
    assert on_outcome("X", False, "red wolf night", {}, HISTORY, none).weights == {"X": 2.0}
    single = CFG.model_copy(update={"max_history": 1})
    assert remember(HISTORY, Failure("D", "d"), single) == [Failure("D", "d")]


def test_zero_boosts_leave_weights_where_they_were() -> None:
    # self_boost 0 and boost 0 are allowed: a failure then only records its fingerprint.
    flat = CFG.model_copy(update={"self_boost": 0.0, "boost": 0.0})
    update = on_outcome("X", False, "red wolf night vote", {"X": 1.3, "A": 0.4}, HISTORY, flat)
    # neighbours A (3/4) and B (2/5) get + 0 x sim: A stays 0.4, B (unseen) stays 1.0.
    assert update.weights == {"X": 1.3, "A": 0.4, "B": 1.0}
    assert update.failure == Failure("X", "red wolf night vote")
