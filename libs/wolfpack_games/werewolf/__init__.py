"""Werewolf (狼人杀), game id ``werewolf_v1``: a pure, seeded engine with parser, bots and prompt packs.

Quick start::

    from wolfpack_games import make_game
    env = make_game("werewolf_v1", "9p", language="zh", tie_rule="no_exile")
    obs, infos = env.reset(seed=1)

See ``README.md`` in this folder for roles, phases, actions, rewards and the version history.
"""

from __future__ import annotations

from typing import Any

from wolfpack_games.base import GameSpec, register_game
from wolfpack_games.werewolf.engine import Knowledge, WerewolfEnv, replay
from wolfpack_games.werewolf.models import (
    PRESETS,
    WerewolfConfig,
    config_from_yaml,
    make_config,
    preset_description,
)
from wolfpack_games.werewolf.parser import parse_action, strip_think
from wolfpack_games.werewolf.policies import heuristic_bot, random_bot
from wolfpack_games.werewolf.render import load_pack, render_events, render_transcript

GAME_ID = "werewolf_v1"


def make_werewolf(variant: str = "6p", **options: Any) -> WerewolfEnv:
    """Registry factory: a preset (``6p``/``9p``/``12p``) plus config overrides."""
    return WerewolfEnv(variant=variant, **options)


SPEC = register_game(
    GameSpec(
        game_id=GAME_ID,
        description="Werewolf (狼人杀): hidden roles, night powers, day discussion and exile votes.",
        factory=make_werewolf,
        variants={"6p": 6, "9p": 9, "12p": 12},
        variant_descriptions={v: preset_description(v) for v in PRESETS},
        default_variant="6p",
        bots={"heuristic": heuristic_bot, "random": random_bot},
        default_bot="heuristic",
    )
)

__all__ = [
    "GAME_ID",
    "SPEC",
    "Knowledge",
    "WerewolfConfig",
    "WerewolfEnv",
    "config_from_yaml",
    "heuristic_bot",
    "load_pack",
    "make_config",
    "make_werewolf",
    "parse_action",
    "random_bot",
    "render_events",
    "render_transcript",
    "replay",
    "strip_think",
]
