"""Scripted bots with the conformance signature ``bot(env, seat, rng) -> Action``.

``heuristic`` plays each family's sensible strategy using only its own seat's private information
(e.g. bargaining: anchor beyond the target, split the difference, accept a bid that meets the target,
relax to the reservation price near the turn limit). ``random`` plays uniformly random *legal* messages.
"""

from __future__ import annotations

import random

from wolfpack_games.base import Action, GameEnv
from wolfpack_games.scenarios.engine import ScenarioGame


def _as_action(env: ScenarioGame, seat: int, text: str) -> Action:
    parsed = env.parse(seat, text)
    if parsed.action is None:  # a bot bug: fall back to the always-legal default
        return env.default_action(seat)
    return parsed.action


def heuristic_bot(env: GameEnv, seat: int, rng: random.Random) -> Action:
    """The family's scripted strategy."""
    if not isinstance(env, ScenarioGame):
        raise TypeError("scenario bots play ScenarioGame engines")
    return _as_action(env, seat, env.family.heuristic(env.tracker, seat, rng))


def random_bot(env: GameEnv, seat: int, rng: random.Random) -> Action:
    """A random legal message."""
    if not isinstance(env, ScenarioGame):
        raise TypeError("scenario bots play ScenarioGame engines")
    return _as_action(env, seat, env.family.random_move(env.tracker, seat, rng))


BOTS = {"heuristic": heuristic_bot, "random": random_bot}
