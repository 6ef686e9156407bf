"""Pydantic models of verifiable scenarios and verification results.

Why a generic shape (public ``params`` plus per-seat ``private`` dicts) rather than one model per
family: the store, the CLI and the reward service handle every family the same way (hash, split, tags,
JSON round-trip), while each family's rules module checks its own keys in ``families/*.check``.
The id is a content hash so that "distinct scenarios" means "different content", inserts are
idempotent, and the train/eval split can be derived from the id alone (no table to keep in sync).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Difficulty = Literal["easy", "medium", "hard"]
Split = Literal["train", "eval"]
DIFFICULTIES: tuple[Difficulty, ...] = ("easy", "medium", "hard")

#: Share of scenarios (by id hash) that go to the eval split.
EVAL_PERCENT = 10

ParamValue = int | float | str | list[int] | list[str] | dict[str, int] | list[dict[str, int]]


class PlayerInfo(BaseModel):
    """One seat of a scenario: its public name/role and what only this seat knows."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # NaN/inf never verify

    seat: int = Field(ge=0)
    name: str = Field(min_length=1)
    role: str = Field(min_length=1)
    private: dict[str, ParamValue] = Field(default_factory=dict)
    brief: str = ""


class Scenario(BaseModel):
    """A self-contained, verifiable social scenario.

    ``id`` and ``split`` are derived from the content when omitted, and checked when given, so a
    scenario read back from a store or sent by a client cannot silently disagree with its id.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # NaN/inf never verify

    id: str = ""
    family: str
    difficulty: Difficulty
    template: str = Field(description="the named theory/template the scenario instantiates")
    tags: list[str] = Field(default_factory=list)
    split: Split | None = None
    public: str = Field(min_length=1, description="public description shown to every seat")
    params: dict[str, ParamValue] = Field(default_factory=dict)
    players: list[PlayerInfo] = Field(min_length=1)
    max_turns: int = Field(ge=1, le=1000)

    @model_validator(mode="after")
    def _derive_and_check(self) -> Scenario:
        seats = [p.seat for p in self.players]
        if seats != list(range(len(self.players))):
            raise ValueError(f"players must be seats 0..n-1 in order, got {seats}")
        digest = self.content_hash()
        expected_id = f"{self.family}-{digest[:16]}"
        if not self.id:
            self.id = expected_id
        elif self.id != expected_id:
            raise ValueError(f"scenario id {self.id!r} does not match its content hash {expected_id!r}")
        expected_split: Split = "eval" if int(digest[:8], 16) % 100 < EVAL_PERCENT else "train"
        if self.split is None:
            self.split = expected_split
        elif self.split != expected_split:
            raise ValueError(f"split {self.split!r} does not match the id-derived split {expected_split!r}")
        from wolfpack_games.scenarios.families import get_family

        try:
            get_family(self.family).check(self)
        except (KeyError, TypeError) as exc:  # missing/ill-typed keys: report as a validation error
            raise ValueError(f"invalid {self.family} scenario: {exc!s}") from exc
        return self

    def content_hash(self) -> str:
        """SHA-256 of the canonical JSON of everything but ``id`` and ``split``."""
        data = self.model_dump(mode="json", exclude={"id", "split"})
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    @property
    def num_players(self) -> int:
        return len(self.players)

    def name(self, seat: int) -> str:
        return self.players[seat].name

    def seat_of(self, name: str) -> int | None:
        """Seat whose name matches ``name`` (case-insensitive), or None."""
        key = name.strip().lower()
        for p in self.players:
            if p.name.lower() == key:
                return p.seat
        return None

    # Typed accessors: params are a JSON-ish union, families read them through these checks.
    def param_int(self, key: str) -> int:
        return as_int(self.params[key], key)

    def param_num(self, key: str) -> float:
        return as_num(self.params[key], key)

    def param_strs(self, key: str) -> list[str]:
        return as_strs(self.params[key], key)

    def private_int(self, seat: int, key: str) -> int:
        return as_int(self.players[seat].private[key], key)

    def private_value(self, seat: int, key: str) -> ParamValue:
        return self.players[seat].private[key]


def as_int(value: Any, key: str = "value") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an int, got {value!r}")
    return value


def as_num(value: Any, key: str = "value") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number, got {value!r}")
    return float(value)


def as_strs(value: Any, key: str = "value") -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key} must be a list of strings, got {value!r}")
    return list(value)


def as_int_map(value: Any, key: str = "value") -> dict[str, int]:
    if not isinstance(value, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value.values()
    ):
        raise ValueError(f"{key} must be a mapping of ints, got {value!r}")
    return dict(value)


class VerificationResult(BaseModel):
    """What the verifier concluded: +1/-1/0 per seat, a one-line reason, and machine-readable details."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # NaN/inf never verify

    outcomes: dict[int, int]
    reason: str
    details: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> VerificationResult:
        if any(v not in (-1, 0, 1) for v in self.outcomes.values()):
            raise ValueError("outcomes must be -1, 0 or +1")
        return self
