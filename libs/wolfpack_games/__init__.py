"""Pure, deterministic game engines (no I/O, seeded RNG) behind one PettingZoo-parallel-shaped API."""

from wolfpack_games.base import (
    Action,
    Event,
    GameEnv,
    GameSpec,
    LegalAction,
    Observation,
    ParseResult,
    StepResult,
    get_game,
    list_games,
    make_game,
    register_game,
)

__all__ = [
    "Action",
    "Event",
    "GameEnv",
    "GameSpec",
    "LegalAction",
    "Observation",
    "ParseResult",
    "StepResult",
    "get_game",
    "list_games",
    "make_game",
    "register_game",
]
