"""Elo updates and PFSP sampling, against hand-computed numbers."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest
from pydantic import BaseModel

from wolfpack_curriculum.league import Entry, LeagueConfig, expected, pfsp_weights, rate, sample_opponent

CFG = LeagueConfig(k_factor=32, initial_rating=1000, pfsp_power=2)


def test_elo_update_by_hand() -> None:
    t, o = rate(Entry("trainee", 1000), Entry("bot", 1000), 1.0, CFG)
    assert (t.rating, o.rating) == (1016.0, 984.0)
    assert (t.wins, t.games, o.losses, o.games) == (1, 1, 1, 1)
    # 1200 vs 1000: E = 1 / (1 + 10**(-0.5)) = 0.75975..., a draw moves 32 * (0.5 - E) = -8.312...
    t, o = rate(Entry("trainee", 1200), Entry("bot", 1000), 0.5, CFG)
    assert t.rating == pytest.approx(1200 - 8.3120, abs=1e-3)
    assert o.rating == pytest.approx(1000 + 8.3120, abs=1e-3)
    assert (t.draws, o.draws) == (1, 1)


def test_pfsp_prefers_opponents_the_trainee_loses_to() -> None:
    trainee = Entry("trainee", 1000)
    strong, weak = Entry("strong", 1400), Entry("weak", 600)
    p_strong = expected(1000, 1400)  # 1 / (1 + 10) = 0.0909...
    assert p_strong == pytest.approx(1 / 11)
    assert pfsp_weights(trainee, [strong, weak], CFG) == pytest.approx([(10 / 11) ** 2, (1 / 11) ** 2])
    rng = random.Random(0)
    draws = [sample_opponent(trainee, [strong, weak], CFG, rng).opponent_id for _ in range(1000)]
    assert draws.count("strong") > 900  # 0.826 / (0.826 + 0.008) = 99% expected
    uniform = LeagueConfig(pfsp_power=0)
    assert pfsp_weights(trainee, [strong, weak], uniform) == [1.0, 1.0]
    with pytest.raises(ValueError, match="no opponents"):
        sample_opponent(trainee, [], CFG, rng)


def test_ratings_move_the_right_way_on_a_strong_vs_weak_matchup() -> None:
    """The trainee always loses to `strong` and always beats `weak`: strong ends above weak, and the
    trainee between them."""
    trainee, strong, weak = Entry("trainee", 1000), Entry("strong", 1000), Entry("weak", 1000)
    for _ in range(20):
        trainee, strong = rate(trainee, strong, 0.0, CFG)
        trainee, weak = rate(trainee, weak, 1.0, CFG)
    assert strong.rating > trainee.rating > weak.rating
    assert strong.wins == 20 and weak.losses == 20


def test_defaults_and_bounds_are_the_documented_ones(
    check_documented_knobs: Callable[[type[BaseModel], str], None],
) -> None:
    check_documented_knobs(LeagueConfig, "league")


@pytest.mark.parametrize(
    ("score", "trainee_wld", "opponent_wld", "trainee_rating"),
    [
        # equal ratings: E = 1 / (1 + 10**0) = 1/2, so the trainee moves by 32 * (score - 1/2)
        (1.0, (1, 0, 0), (0, 1, 0), 1000 + 16),
        (0.5, (0, 0, 1), (0, 0, 1), 1000),
        (0.0, (0, 1, 0), (1, 0, 0), 1000 - 16),
    ],
)
def test_a_game_counts_once_as_win_draw_or_loss_on_each_side(
    score: float, trainee_wld: tuple[int, int, int], opponent_wld: tuple[int, int, int], trainee_rating: float
) -> None:
    t, o = rate(Entry("trainee", 1000), Entry("bot", 1000), score, CFG)
    assert (t.wins, t.losses, t.draws) == trainee_wld
    assert (o.wins, o.losses, o.draws) == opponent_wld
    assert (t.games, o.games) == (1, 1)
    assert t.rating == trainee_rating and o.rating == 2000 - trainee_rating  # zero-sum


def test_an_expected_loss_barely_moves_ratings_and_an_upset_moves_them_a_lot() -> None:
    # 1000 vs 1400: E = 1 / (1 + 10**(400/400)) = 1/11. A loss moves 32 * (0 - 1/11) = -2.909...,
    # a win 32 * (1 - 1/11) = 29.09...
    loss, _ = rate(Entry("trainee", 1000), Entry("strong", 1400), 0.0, CFG)
    win, strong = rate(Entry("trainee", 1000), Entry("strong", 1400), 1.0, CFG)
    assert loss.rating == pytest.approx(1000 - 32 / 11)
    assert win.rating == pytest.approx(1000 + 32 * 10 / 11)
    assert strong.rating == pytest.approx(1400 - 32 * 10 / 11)


def test_pfsp_falls_back_to_uniform_when_every_weight_is_zero() -> None:
    """Opponents so weak that the trainee's expected score is exactly 1.0 (10 ** -2502.5 underflows to 0):
    every PFSP weight is (1 - 1) ** 2 = 0, and the draw is uniform instead of an error."""
    trainee = Entry("trainee", 1000)
    hopeless = [Entry("a", -1_000_000), Entry("b", -1_000_000)]
    assert pfsp_weights(trainee, hopeless, CFG) == [0.0, 0.0]
    rng = random.Random(5)
    draws = Counter(sample_opponent(trainee, hopeless, CFG, rng).opponent_id for _ in range(400))
    assert set(draws) == {"a", "b"} and 140 < draws["a"] < 260  # Binomial(400, 1/2): sd 10


def test_extreme_finite_ratings_do_not_overflow() -> None:
    """A finite but huge rating (a registered opponent's, or long drift) gives a 0/1 expectation instead of
    an OverflowError inside NextTasks (found by the curriculum fuzz test)."""
    from wolfpack_curriculum.league import expected

    assert expected(0.0, 1e300) < 1e-299
    assert expected(1e300, 0.0) == 1.0
    assert expected(-1e308, 1e308) < 1e-299
    assert expected(1500.0, 1500.0) == 0.5
