"""The contract every scenario family implements, and the replay ``Tracker`` the engine and verifier share.

Why one tracker for both: the engine (live play) and the verifier (re-checking a finished transcript)
must never disagree, so both feed messages through the same ``check``/``record`` code and the engine's
final outcome *is* ``verify(scenario, transcript)``.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, ClassVar

from wolfpack_games.scenarios.models import Difficulty, Scenario, VerificationResult
from wolfpack_games.scenarios.parsing import ParsedMessage, StatementSpec, parse_message

#: Text a seat "says" when it is silent or defaulted. Chat, never a formal statement.
PASS_TEXT = "(pass)"


class Tracker(abc.ABC):
    """Replays one game: whose turn it is, which statements are allowed, and the verdict.

    Default turn order is round-robin starting at ``params["first"]`` (0 when absent). The game ends
    when a family rule sets ``ended`` or when ``max_turns`` messages have been recorded (the turn
    limit, whose consequence each family's ``verdict`` documents).
    """

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.n = scenario.num_players
        self.turns = 0
        self.history: list[tuple[int, ParsedMessage]] = []
        self.ended = ""

    @property
    def done(self) -> bool:
        return bool(self.ended) or self.turns >= self.scenario.max_turns

    @property
    def turns_left(self) -> int:
        return self.scenario.max_turns - self.turns

    def acting(self) -> list[int]:
        if self.done:
            return []
        return self._acting()

    def _acting(self) -> list[int]:
        first = self.scenario.params.get("first", 0)
        start = first if isinstance(first, int) else 0
        return [(start + self.turns) % self.n]

    def record(self, seat: int, msg: ParsedMessage) -> list[str]:
        """Apply an already-checked message; returns public notes (e.g. a round's reveal)."""
        self.turns += 1
        self.history.append((seat, msg))
        return self.apply(seat, msg)

    def legal_kinds(self, seat: int) -> tuple[str, ...]:
        return ("say", "final")

    def default_text(self, seat: int) -> str:
        return PASS_TEXT

    def status(self) -> str:
        """One public line about the state (standing offer, round, ...), shown in observations."""
        return ""

    @abc.abstractmethod
    def check(self, seat: int, msg: ParsedMessage) -> str:
        """Why ``msg`` is not allowed for ``seat`` now ("" when it is). Only called for acting seats."""

    @abc.abstractmethod
    def apply(self, seat: int, msg: ParsedMessage) -> list[str]:
        """Update the state with a checked message."""

    @abc.abstractmethod
    def verdict(self) -> VerificationResult:
        """Outcomes once done; a transcript that stops early is judged as if the turn limit was hit."""


class Family(abc.ABC):
    """A scenario family: generator, statement grammar, rules (tracker), solver and bots."""

    name: ClassVar[str]
    game_id: ClassVar[str]
    title: ClassVar[str]
    theory: ClassVar[str]
    specs: ClassVar[tuple[StatementSpec, ...]]
    #: Keywords whose statements other seats must not see until the tracker reveals them.
    sealed: ClassVar[frozenset[str]] = frozenset()
    #: Seats per difficulty; the registry's variants.
    seats: ClassVar[dict[str, int]]

    def parse(self, scenario: Scenario, text: str) -> ParsedMessage:
        def value(keyword: str, rest: str) -> Any:
            return self.parse_value(scenario, keyword, rest)

        return parse_message(text, self.specs, value)

    @abc.abstractmethod
    def generate(self, rng: random.Random, difficulty: Difficulty) -> Scenario:
        """A valid, solvable scenario drawn with ``rng`` only."""

    @abc.abstractmethod
    def check(self, scenario: Scenario) -> None:
        """Raise ``ValueError`` when the scenario is not valid for this family."""

    @abc.abstractmethod
    def parse_value(self, scenario: Scenario, keyword: str, rest: str) -> Any:
        """Parse the value after ``keyword``; raise ``StatementError`` when malformed."""

    @abc.abstractmethod
    def tracker(self, scenario: Scenario) -> Tracker: ...

    @abc.abstractmethod
    def instructions(self, scenario: Scenario, seat: int) -> str:
        """How this seat makes its formal statements (shown in every observation)."""

    @abc.abstractmethod
    def solution(self, scenario: Scenario) -> list[tuple[int, str]]:
        """A transcript (constructive witness) in which no seat loses: the scenario is solvable."""

    @abc.abstractmethod
    def heuristic(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        """A sensible scripted message for ``seat`` (uses only its own private info)."""

    @abc.abstractmethod
    def random_move(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        """A random *legal* message for ``seat``."""


def violation(scenario: Scenario, seat: int, index: int, error: str) -> VerificationResult:
    """A rule violation (malformed/contradictory/out-of-turn statement) loses for its author only."""
    outcomes = {p.seat: 0 for p in scenario.players}
    outcomes[seat] = -1
    return VerificationResult(
        outcomes=outcomes,
        reason=f"violation by {scenario.name(seat)} at message {index}: {error}",
        details={"violation": {"seat": seat, "index": index, "error": error}},
    )


def threshold_outcome(value: float | Fraction, win_at: float, draw_at: float) -> int:
    """+1 at or above the win threshold, 0 at or above the draw threshold (BATNA), else -1."""
    if value >= win_at:
        return 1
    if value >= draw_at:
        return 0
    return -1


def names(scenario: Scenario, seats: Sequence[int]) -> str:
    return ", ".join(scenario.name(s) for s in seats)
