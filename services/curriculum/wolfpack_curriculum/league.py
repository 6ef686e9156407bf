"""The opponent league: Elo ratings from outcomes and prioritised fictitious self-play (PFSP) sampling.

Why Elo: one number per opponent, updated incrementally from each game, readable in a table, and the
expected score it implies is exactly what PFSP needs. The trainee has its own rating in the same scale.

* ``expected(r_a, r_b) = 1 / (1 + 10 ** ((r_b - r_a) / 400))`` — a's expected score against b.
* After a game with trainee score ``s`` (1 win, 0.5 draw, 0 loss):
  ``trainee += k * (s - E)``, ``opponent -= k * (s - E)`` with ``E = expected(trainee, opponent)``.
* PFSP ("hard" weighting, AlphaStar): opponent ``i`` is drawn with probability proportional to
  ``(1 - p_i) ** power`` where ``p_i = expected(trainee, i)`` is the trainee's chance to beat it, so
  opponents the trainee still loses to are played most; ``power = 0`` is uniform.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pydantic import BaseModel, ConfigDict, Field


class LeagueConfig(BaseModel):
    """Knobs of the league (the ``league`` section of the curriculum config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    k_factor: float = Field(default=32.0, gt=0, description="Elo K: rating change per unit of surprise.")
    initial_rating: float = Field(default=1000.0, description="Rating of a new opponent and of the trainee.")
    pfsp_power: float = Field(default=2.0, ge=0, description="PFSP hardness; 0 samples uniformly.")
    max_opponents: int = Field(
        default=1000, ge=1, le=100_000,
        description="Most opponents in the league (NextTasks reads them all: its cost follows this bound).",
    )  # fmt: skip


@dataclass(frozen=True)
class Entry:
    """One rated player: an opponent of the league, or the trainee (id ``trainee``)."""

    opponent_id: str
    rating: float
    games: int = 0
    wins: int = 0  # games this entry won against the other side
    losses: int = 0
    draws: int = 0


def expected(r_a: float, r_b: float) -> float:
    # Clamped: finite but extreme ratings (a registered opponent's, or drift over a long league) must not
    # overflow the power; past a 10**300 odds ratio the answer is 0 or 1 to double precision anyway.
    x = min(max((r_b - r_a) / 400.0, -300.0), 300.0)
    return 1.0 / (1.0 + float(10.0**x))


def rate(trainee: Entry, opponent: Entry, score: float, cfg: LeagueConfig) -> tuple[Entry, Entry]:
    """Both entries after one game where the trainee scored ``score`` against ``opponent``."""
    delta = cfg.k_factor * (score - expected(trainee.rating, opponent.rating))
    won, lost, drew = score > 0.5, score < 0.5, score == 0.5
    t = replace(
        trainee, rating=trainee.rating + delta, games=trainee.games + 1,
        wins=trainee.wins + won, losses=trainee.losses + lost, draws=trainee.draws + drew,
    )  # fmt: skip
    o = replace(
        opponent, rating=opponent.rating - delta, games=opponent.games + 1,
        wins=opponent.wins + lost, losses=opponent.losses + won, draws=opponent.draws + drew,
    )  # fmt: skip
    return t, o


def pfsp_weights(trainee: Entry, opponents: Sequence[Entry], cfg: LeagueConfig) -> list[float]:
    return [(1.0 - expected(trainee.rating, o.rating)) ** cfg.pfsp_power for o in opponents]


def sample_opponent(
    trainee: Entry, opponents: Sequence[Entry], cfg: LeagueConfig, rng: random.Random
) -> Entry:
    """An opponent drawn by PFSP; raises ``ValueError`` on an empty league."""
    if not opponents:
        raise ValueError("the league has no opponents; register one (RegisterOpponent) first")
    weights = pfsp_weights(trainee, opponents, cfg)
    if sum(weights) <= 0:
        return rng.choice(list(opponents))
    return rng.choices(list(opponents), weights=weights, k=1)[0]
