"""Roles, phases and the game configuration of Werewolf (狼人杀).

Why a plain dataclass and YAML presets: the rule set varies between tables (win rule, witch self-save,
the 同守同救 rule, sheriff), so every rule is a field of one config object that a preset YAML file
fills and per-game option overrides adjust. Nothing here is in the engine's hot path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

# --- roles -------------------------------------------------------------------------------------------

WEREWOLF = "werewolf"
WOLF_KING = "wolf_king"
VILLAGER = "villager"
SEER = "seer"
WITCH = "witch"
HUNTER = "hunter"
GUARD = "guard"

ALL_ROLES: tuple[str, ...] = (WEREWOLF, WOLF_KING, VILLAGER, SEER, WITCH, HUNTER, GUARD)
WOLF_ROLES: frozenset[str] = frozenset({WEREWOLF, WOLF_KING})
#: "Special" (god) roles for the side-kill win rule.
SPECIAL_ROLES: frozenset[str] = frozenset({SEER, WITCH, HUNTER, GUARD})

TEAM_WOLVES = "wolves"
TEAM_VILLAGE = "village"


def team_of(role: str) -> str:
    """The side a role plays for; the wolf king is a wolf."""
    return TEAM_WOLVES if role in WOLF_ROLES else TEAM_VILLAGE


# --- phases ------------------------------------------------------------------------------------------

PH_WOLF_CHAT = "night_wolf_chat"
PH_WOLF_VOTE = "night_wolf_vote"
PH_GUARD = "night_guard"
PH_SEER = "night_seer"
PH_WITCH = "night_witch"
PH_LAST_WORDS = "last_words"
PH_BADGE = "badge_pass"
PH_SHOOT = "shoot"
PH_SHERIFF = "sheriff_vote"
PH_DISCUSSION = "day_discussion"
PH_VOTE = "day_vote"
PH_GAME_OVER = "game_over"

ALL_PHASES: tuple[str, ...] = (
    PH_WOLF_CHAT,
    PH_WOLF_VOTE,
    PH_GUARD,
    PH_SEER,
    PH_WITCH,
    PH_LAST_WORDS,
    PH_BADGE,
    PH_SHOOT,
    PH_SHERIFF,
    PH_DISCUSSION,
    PH_VOTE,
    PH_GAME_OVER,
)
SPEECH_PHASES: frozenset[str] = frozenset({PH_WOLF_CHAT, PH_LAST_WORDS, PH_DISCUSSION})

# --- action kinds ------------------------------------------------------------------------------------

K_SPEAK = "speak"
K_KILL = "kill"
K_PROTECT = "protect"
K_INSPECT = "inspect"
K_SAVE = "save"
K_POISON = "poison"
K_SHOOT = "shoot"
K_BADGE = "badge"
K_ELECT = "elect"
K_VOTE = "vote"
K_PASS = "pass"

ALL_KINDS: tuple[str, ...] = (
    K_SPEAK,
    K_KILL,
    K_PROTECT,
    K_INSPECT,
    K_SAVE,
    K_POISON,
    K_SHOOT,
    K_BADGE,
    K_ELECT,
    K_VOTE,
    K_PASS,
)

# --- config ------------------------------------------------------------------------------------------

_CHOICES: dict[str, tuple[str, ...]] = {
    "win_rule": ("parity", "side_kill"),
    "witch_self_save": ("always", "first_night", "never"),
    "guard_save_rule": ("dies", "lives"),
    "last_words": ("first_night", "always", "never"),
    "speaking_order": ("clockwise", "counterclockwise", "seat_order"),
    "tie_rule": ("no_exile", "revote"),
    "language": ("en", "zh"),
}


MAX_PLAYERS = 20
BOUNDS: dict[str, tuple[float, float]] = {
    "discussion_rounds": (0, 5),
    "wolf_chat_rounds": (0, 5),
    "max_days": (1, 30),
    "max_reprompts": (0, 5),
    "max_speech_chars": (1, 8000),
    "sheriff_vote_weight": (0, 10),
}
"""Inclusive bounds of the numeric options (documented in the werewolf README): a worst-case legal game
(20 players, every bound at its maximum, all seats scripted) plays in well under a second."""


@dataclass(slots=True)
class WerewolfConfig:
    """Every rule of one Werewolf table. Load with :func:`make_config` (preset + overrides).

    * ``roles``: role -> count; seats get a seeded shuffle of this multiset.
    * ``win_rule``: ``parity`` (wolves win when alive wolves >= alive non-wolves) or ``side_kill``
      (wolves win when every special role or every villager is dead). The village always wins
      when every wolf is dead.
    * ``witch_self_save``: may the witch save herself (``always``/``first_night``/``never``).
      She uses at most one potion per night (one action: save, poison or pass).
    * ``guard_save_rule``: a wolf victim both guarded and saved ``dies`` (同守同救) or ``lives``.
    * ``last_words``: last words for night deaths (``first_night``/``always``/``never``);
      ``exile_last_words`` for the exiled.
    * ``speaking_order``: ``clockwise``/``counterclockwise`` from a seeded start seat each day
      (the sheriff, if alive, always speaks last) or ``seat_order`` from seat 0.
    * ``tie_rule``: ``no_exile`` or ``revote`` (once, among the tied; the tied do not vote).
    * ``sheriff``: day-1 sheriff election; the sheriff's exile vote weighs ``sheriff_vote_weight``
      (a multiple of 0.5) and the badge is passed (or torn) when the sheriff dies.
    * ``wolf_king``: replace one werewolf by a wolf king (shoots when exiled by vote).
    * ``max_days``: the game is truncated as a draw after this many day/night cycles.
    * ``seat_roles``: a fixed role per seat (no shuffle; overrides ``roles``) for tests/tutorials.
    """

    roles: dict[str, int] = field(
        default_factory=lambda: {WEREWOLF: 2, VILLAGER: 2, SEER: 1, WITCH: 1},
    )
    win_rule: str = "parity"
    witch_self_save: str = "first_night"
    guard_save_rule: str = "dies"
    last_words: str = "first_night"
    exile_last_words: bool = True
    discussion_rounds: int = 1
    speaking_order: str = "clockwise"
    tie_rule: str = "no_exile"
    sheriff: bool = False
    sheriff_vote_weight: float = 1.5
    wolf_king: bool = False
    wolf_chat_rounds: int = 1
    max_days: int = 20
    max_reprompts: int = 1
    max_speech_chars: int = 1200
    language: str = "en"
    seat_roles: list[str] | None = None

    @property
    def n_players(self) -> int:
        return len(self.seat_roles) if self.seat_roles else sum(self.roles.values())

    def role_list(self) -> list[str]:
        """The canonical (unshuffled) multiset of roles, wolf king substitution applied.

        With ``seat_roles`` set (fixed seating for tests and tutorials) that list is used as is.
        """
        if self.seat_roles:
            return list(self.seat_roles)
        out: list[str] = []
        for role in ALL_ROLES:
            out.extend([role] * int(self.roles.get(role, 0)))
        if self.wolf_king and WOLF_KING not in out and WEREWOLF in out:
            out[out.index(WEREWOLF)] = WOLF_KING
        return out

    def validate(self) -> WerewolfConfig:
        """Raise ``ValueError`` naming the valid values of any bad field; returns self for chaining.

        Every numeric option has a documented upper bound (``BOUNDS``): the environment service plays
        scripted seats on its event loop, so an unbounded ``discussion_rounds`` or role count would let
        one request freeze the service (or exhaust its memory)."""
        for key, (lo, hi) in BOUNDS.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
                raise ValueError(f"{key}={value!r} is out of range; it must be a number in [{lo}, {hi}]")
        if not isinstance(self.roles, dict) or len(self.roles) > len(ALL_ROLES):
            raise ValueError(f"roles must map role names to counts; valid roles: {', '.join(ALL_ROLES)}")
        for role, count in self.roles.items():
            if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_PLAYERS:
                raise ValueError(f"roles.{role}={count!r} is out of range; it must be an integer in [0, {MAX_PLAYERS}]")  # fmt: skip
        if self.seat_roles is not None and (
            not isinstance(self.seat_roles, list) or len(self.seat_roles) > MAX_PLAYERS
        ):
            raise ValueError(f"seat_roles must be a list of at most {MAX_PLAYERS} role names")
        for key, choices in _CHOICES.items():
            value = getattr(self, key)
            if value not in choices:
                raise ValueError(f"{key}={value!r} is invalid; valid values: {', '.join(choices)}")
        for role, count in self.roles.items():
            if role not in ALL_ROLES:
                raise ValueError(f"unknown role {role!r}; valid roles: {', '.join(ALL_ROLES)}")
            if int(count) < 0:
                raise ValueError(f"role count of {role} must be >= 0")
        roles = self.role_list()
        for role in roles:
            if role not in ALL_ROLES:
                raise ValueError(f"unknown role {role!r}; valid roles: {', '.join(ALL_ROLES)}")
        if not 3 <= len(roles) <= 20:
            raise ValueError(f"a game needs 3..20 players, got {len(roles)}")
        wolves = sum(1 for r in roles if r in WOLF_ROLES)
        if wolves == 0 or wolves >= len(roles) - wolves:
            raise ValueError("need at least one wolf and more non-wolves than wolves")
        for role in (SEER, WITCH, HUNTER, GUARD):
            if roles.count(role) > 1:
                raise ValueError(f"at most one {role} per game")
        if self.sheriff_vote_weight * 2 != int(self.sheriff_vote_weight * 2) or self.sheriff_vote_weight < 0:
            raise ValueError("sheriff_vote_weight must be a non-negative multiple of 0.5")
        if self.discussion_rounds < 0 or self.wolf_chat_rounds < 0 or self.max_reprompts < 0:
            raise ValueError("round counts and max_reprompts must be >= 0")
        if self.max_days < 1:
            raise ValueError("max_days must be >= 1")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


CONFIG_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(WerewolfConfig))
PRESET_DIR = Path(__file__).resolve().parent / "presets"
PRESETS: tuple[str, ...] = ("6p", "9p", "12p")


@lru_cache(maxsize=32)
def _load_yaml(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a preset must be a mapping")
    return data


def apply_overrides(config: WerewolfConfig, overrides: Mapping[str, Any] | None) -> WerewolfConfig:
    """A copy of ``config`` with ``overrides`` applied; unknown keys raise listing the valid ones."""
    data = config.to_dict()
    for key, value in (overrides or {}).items():
        if key not in CONFIG_FIELDS:
            raise ValueError(f"unknown werewolf option {key!r}; valid options: {', '.join(CONFIG_FIELDS)}")
        if key == "roles":
            value = dict(value)
        elif key == "seat_roles" and value is not None:
            value = list(value)
        data[key] = value
    return WerewolfConfig(**data).validate()


def config_from_yaml(path: str | Path, overrides: Mapping[str, Any] | None = None) -> WerewolfConfig:
    """Load a config from any YAML file (keys are config field names; ``description`` is ignored)."""
    data = {k: v for k, v in _load_yaml(str(path)).items() if k != "description"}
    merged = dict(data)
    merged.update(overrides or {})
    return apply_overrides(WerewolfConfig(), merged)


def make_config(variant: str = "6p", overrides: Mapping[str, Any] | None = None) -> WerewolfConfig:
    """The preset ``variant`` (``6p``/``9p``/``12p``) with ``overrides`` applied."""
    if variant not in PRESETS:
        raise KeyError(f"unknown werewolf preset {variant!r}; presets: {', '.join(PRESETS)}")
    if overrides:
        return config_from_yaml(PRESET_DIR / f"{variant}.yaml", overrides)
    # A plain preset is built once (validation and the dict round trip cost more than a whole game's
    # setup); each caller gets its own copy with its own roles mapping.
    preset = _preset(variant)
    return dataclasses.replace(preset, roles=dict(preset.roles))


@lru_cache(maxsize=8)
def _preset(variant: str) -> WerewolfConfig:
    return config_from_yaml(PRESET_DIR / f"{variant}.yaml")


def shared_preset(variant: str) -> WerewolfConfig:
    """The validated preset object itself, shared by every engine built without overrides: engines only
    read their config, so a server starting hundreds of games a second skips a copy, a validation and the
    per-config setup in ``start`` (keyed by the config object) for each. Don't mutate it; take
    ``make_config`` for a copy of your own."""
    if variant not in PRESETS:
        raise KeyError(f"unknown werewolf preset {variant!r}; presets: {', '.join(PRESETS)}")
    return _preset(variant)


def preset_description(variant: str) -> str:
    return str(_load_yaml(str(PRESET_DIR / f"{variant}.yaml")).get("description", variant))
