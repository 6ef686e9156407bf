"""Elo updates and PFSP sampling, against hand-computed numbers."""

from __future__ import annotations

import random

import pytest

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
