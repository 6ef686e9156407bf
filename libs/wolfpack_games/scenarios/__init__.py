"""Verifiable social scenarios: rule-verified games (bargaining, allocation, cooperation and classic
social-science games) with a seeded generator, a scenario store, and ``GameEnv`` engines.

Importing this package registers one game per family (``bargaining_v1``, ...) with variants
``easy``/``medium``/``hard`` and bots ``heuristic``/``random``. See README.md.
"""

from __future__ import annotations

from wolfpack_games.base import GameSpec, register_game
from wolfpack_games.scenarios.engine import (
    ScenarioGame,
    game_class,
    render_scenario,
    render_transcript,
)
from wolfpack_games.scenarios.families import FAMILY_NAMES, available_families, get_family
from wolfpack_games.scenarios.generator import generate_scenario, generate_scenarios
from wolfpack_games.scenarios.models import Scenario, VerificationResult
from wolfpack_games.scenarios.policies import BOTS, heuristic_bot, random_bot
from wolfpack_games.scenarios.store import (
    RedisScenarioStore,
    ScenarioStore,
    SQLiteScenarioStore,
    open_store,
)
from wolfpack_games.scenarios.verifiers import verify, verify_transcript

GAME_CLASSES: dict[str, type[ScenarioGame]] = {}


def _register() -> None:
    for name in available_families():
        family = get_family(name)
        cls = game_class(name)
        GAME_CLASSES[family.game_id] = cls
        register_game(
            GameSpec(
                game_id=family.game_id,
                description=f"{family.title}: verifiable scenario grounded in {family.theory}",
                factory=cls,
                variants=dict(family.seats),
                variant_descriptions={
                    d: f"{d} {family.name} scenario, {n} players" for d, n in family.seats.items()
                },
                default_variant="medium",
                bots=dict(BOTS),
                default_bot="heuristic",
            )
        )


_register()

__all__ = [
    "BOTS",
    "FAMILY_NAMES",
    "GAME_CLASSES",
    "RedisScenarioStore",
    "SQLiteScenarioStore",
    "Scenario",
    "ScenarioGame",
    "ScenarioStore",
    "VerificationResult",
    "available_families",
    "generate_scenario",
    "generate_scenarios",
    "get_family",
    "heuristic_bot",
    "open_store",
    "random_bot",
    "render_scenario",
    "render_transcript",
    "verify",
    "verify_transcript",
]
