"""AIW reweighting against hand-computed examples (Jaccard similarity of word sets)."""

from __future__ import annotations

import pytest

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
