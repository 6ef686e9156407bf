"""The one game API every Wolfpack game implements, and the game registry.

Why this shape: games are multi-agent and partly simultaneous (Werewolf votes) and partly sequential
(speeches, bargaining offers), so we follow PettingZoo's *parallel* API — ``reset`` and ``step`` take and
return per-seat dicts — and let a game say which seats must act now (``acting_seats``). A sequential
phase simply has one acting seat. Everything here is plain Python with no I/O so engines are testable
without servers and fast enough for the 100k actions/s target; observation text is rendered lazily
because most steps in a bot-driven game never look at it.

Invalid actions are part of the rules, not exceptions: ``step`` records the reason, re-prompts the seat
up to ``max_reprompts`` times (the seat stays in ``acting_seats`` and its observation carries feedback),
then applies the game's default legal action and flags a penalty in ``infos[seat]``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from wolfpack.registry import Registry


@dataclass(frozen=True, slots=True)
class Action:
    """A structured action. ``target`` is a seat index when the kind takes one."""

    kind: str
    target: int | None = None
    text: str = ""


@dataclass(frozen=True, slots=True)
class LegalAction:
    """A template of what a seat may do now: the kind, allowed targets, and whether text is required."""

    kind: str
    targets: tuple[int, ...] = ()
    needs_text: bool = False


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of the game log.

    ``channel`` says who may see it: ``"public"``, ``"team:<name>"``, ``"seat:<n>"`` or ``"system"``
    (never shown to seats while the game runs). Replaying the *actions* of a log reproduces the state.
    """

    index: int
    kind: str
    channel: str
    actor: int = -1
    target: int = -1
    text: str = ""
    phase: str = ""
    round: int = 0


@dataclass(frozen=True, slots=True)
class ParseResult:
    """The result of parsing free text into an action: exactly one of ``action`` or ``error`` is set."""

    action: Action | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.action is not None


@dataclass(slots=True)
class Observation:
    """What one seat may know now. ``text`` is rendered on first access (lazily) and cached."""

    seat: int
    phase: str
    round: int
    your_turn: bool
    done: bool
    role: str
    legal_actions: tuple[LegalAction, ...]
    turn_id: int
    feedback: str = ""
    _render: Callable[[], str] | None = field(default=None, repr=False)
    _text: str | None = field(default=None, repr=False)

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self._render() if self._render is not None else ""
        return self._text


@dataclass(slots=True)
class StepResult:
    """PettingZoo-parallel step output: per-seat observations, rewards, terminations, truncations, infos."""

    observations: dict[int, Observation]
    rewards: dict[int, float]
    terminations: dict[int, bool]
    truncations: dict[int, bool]
    infos: dict[int, dict[str, Any]]

    def __iter__(self) -> Any:
        return iter((self.observations, self.rewards, self.terminations, self.truncations, self.infos))


class GameEnv(abc.ABC):
    """Base class of every game engine.

    Subclasses keep all state in plain attributes, draw randomness only from ``self.rng`` (seeded in
    ``reset``), and append every state change to ``self.events``.
    """

    game_id: ClassVar[str]
    possible_agents: list[int]

    @abc.abstractmethod
    def reset(
        self, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[int, Observation], dict[int, dict[str, Any]]]:
        """Start a new game; same seed and options give the same game."""

    def close(self) -> None:
        """Release what the engine holds (PettingZoo's ``close``). State stays readable; the game cannot
        go on. Engines that keep continuations as bound methods drop them here, so a finished game is
        freed by reference counting instead of waiting for the cyclic collector (a server finishing
        hundreds of games a second otherwise runs it constantly)."""
        return None

    def start(self, seed: int | None = None, options: Mapping[str, Any] | None = None) -> None:
        """``reset`` without returning the first observations (a session server starting thousands of
        episodes never reads them); engines override it when building them costs something."""
        self.reset(seed=seed, options=options)

    @abc.abstractmethod
    def step(self, actions: Mapping[int, Action | str]) -> StepResult:
        """Apply actions of (a subset of) the acting seats; strings are parsed with ``parse``."""

    def step_seat(self, seat: int, move: Action | str) -> dict[str, Any]:
        """``step({seat: move})`` returning only that seat's info (``invalid_reason``, ``defaulted`` with
        the ``default_action`` applied, ...). Engines override it to skip building the step's
        observations, which a networked session applying one act at a time never reads."""
        return self.step({seat: move}).infos.get(seat, {})

    @abc.abstractmethod
    def acting_seats(self) -> list[int]:
        """Seats that must act now (empty when the game is over)."""

    @abc.abstractmethod
    def legal_actions(self, seat: int) -> tuple[LegalAction, ...]:
        """What ``seat`` may do now; empty when it is not acting."""

    @abc.abstractmethod
    def observe(self, seat: int) -> Observation:
        """The seat's current observation (text rendered lazily, never containing hidden facts)."""

    @abc.abstractmethod
    def parse(self, seat: int, text: str) -> ParseResult:
        """Parse free model/agent output into an action for ``seat`` (``<think>`` blocks stripped)."""

    @abc.abstractmethod
    def default_action(self, seat: int) -> Action:
        """The legal action applied when a seat stays invalid or silent."""

    @property
    @abc.abstractmethod
    def done(self) -> bool:
        """True once the game has ended."""

    @abc.abstractmethod
    def outcome(self) -> dict[int, int]:
        """Per-seat outcome once done: +1 win, -1 loss, 0 draw."""

    @abc.abstractmethod
    def winner(self) -> str:
        """Winning team or side; empty for a draw or an unfinished game."""

    @abc.abstractmethod
    def role(self, seat: int) -> str:
        """The seat's role (hidden information: callers decide who may see it)."""

    @abc.abstractmethod
    def team(self, seat: int) -> str:
        """The seat's team or side (hidden information)."""

    events: list[Event]


@dataclass(frozen=True, slots=True)
class GameSpec:
    """Registry entry: how to build a game and what variants and bots it offers."""

    game_id: str
    description: str
    factory: Callable[..., GameEnv]
    variants: Mapping[str, int]  # variant name -> number of seats
    variant_descriptions: Mapping[str, str]
    default_variant: str
    bots: Mapping[str, Callable[..., Any]]
    default_bot: str


def _load_builtin_games() -> None:
    # Import for side effects: each game package registers itself. Run once, on the registry's first
    # use, so that importing the base API does not pull every engine.
    import importlib

    for module in ("wolfpack_games.werewolf", "wolfpack_games.scenarios"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:  # a game package not present in this build
            if exc.name != module:
                raise


def _load_werewolf() -> None:
    import wolfpack_games.werewolf  # noqa: F401  (registers werewolf_v1)


GAMES: Registry[GameSpec] = Registry(
    "game", loader=_load_builtin_games, key_loaders={"werewolf_v1": _load_werewolf}
)
"""Versioned game id (``werewolf_v1``) -> how to build it; the shared ``wolfpack.registry`` shape."""


def register_game(spec: GameSpec) -> GameSpec:
    """Add a game to the registry; registering another game under a taken id is an error (ids are
    versioned)."""
    return GAMES.add(spec.game_id, spec)


def get_game(game_id: str) -> GameSpec:
    """Look up a game; the error (KeyError) lists the valid ids."""
    return GAMES.get(game_id)


def list_games() -> list[GameSpec]:
    return [GAMES.get(k) for k in sorted(GAMES)]


def make_game(game_id: str, variant: str = "", **options: Any) -> GameEnv:
    """Build an engine for ``game_id``/``variant``; unknown variants list the valid ones."""
    spec = get_game(game_id)
    name = variant or spec.default_variant
    if name not in spec.variants:
        valid = ", ".join(spec.variants)
        raise KeyError(f"unknown variant {name!r} of {game_id}; variants: {valid}")
    return spec.factory(variant=name, **options)
