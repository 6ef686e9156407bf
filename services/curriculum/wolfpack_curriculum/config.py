"""The curriculum's configuration: buckets of tasks, their seat plans and opponent mixes, groups, and the
AIW and league knobs. YAML (``WOLFPACK_CURRICULUM_CONFIG``) or a dict; unknown keys are errors.

    policy_id: learner          # the trainee policy (inference policy id)
    group_size: 4               # episodes per task and seed (GRPO groups)
    replay_ratio: 0.5           # share of groups replaying a past task, drawn by AIW weight
    buckets:
      - game_id: werewolf_v1
        variant: 12p
        seats: {trainee_seats: 1, mix: {self: 0.8, external: 0.2}, mix_per: seat, external_policy: strong}
      - game_id: bargaining_v1
        variant: easy
        seats: {trainee_seats: [0], mix: {scripted: 1.0}, bot: heuristic}

Opponent kinds in ``mix`` (weights are normalised): ``self`` (the trainee policy; those seats are trainee
seats too), ``scripted`` (the environment's ``bot``), ``external`` (``external_policy``, e.g. served by the
OpenAI-compatible backend), ``checkpoint`` (a frozen checkpoint from the league, drawn by PFSP; ``self``
when the league has none) and ``league`` (any registered opponent, drawn by PFSP). ``mix_per: task`` draws
one kind for all non-trainee seats of a group (what league ratings need); ``seat`` draws per seat (the
80/20 strong-opponent recipe).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from wolfpack_curriculum.aiw import AIWConfig
from wolfpack_curriculum.league import LeagueConfig
from wolfpack_games import get_game

MAX_GROUP_SIZE = 1024
"""Largest ``group_size``: one group is built in memory per NextTasks draw (2,000,000 blocked the service
32 s and grew it to 3 GB); GRPO groups are a handful to a few hundred episodes."""

MAX_BUCKETS = 256
MAX_NAME_CHARS = 128

OpponentMixKind = Literal["self", "scripted", "external", "checkpoint", "league"]


def _scripted_only() -> dict[OpponentMixKind, float]:
    return {"scripted": 1.0}


class SeatPlan(BaseModel):
    """Who sits where in a bucket's tasks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trainee_seats: int | list[int] = Field(
        default=1, description="Seats of the trainee: a count drawn at random per group, or fixed seats."
    )
    mix: dict[OpponentMixKind, float] = Field(
        default_factory=_scripted_only, description="Opponent kinds and their ratios."
    )
    mix_per: Literal["task", "seat"] = "task"
    bot: str = Field(default="heuristic", description="Scripted bot for `scripted` seats.")
    external_policy: str = Field(default="", description="Inference policy id of the `external` model.")

    @field_validator("mix")
    @classmethod
    def _positive(cls, v: dict[OpponentMixKind, float]) -> dict[OpponentMixKind, float]:
        if not v or any(w < 0 for w in v.values()) or sum(v.values()) <= 0:
            raise ValueError("mix needs at least one kind with a positive ratio and no negative ratio")
        return v


class Bucket(BaseModel):
    """A family of tasks: one game variant with a seat plan."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    game_id: str
    variant: str = ""
    name: str = Field(
        default="", max_length=MAX_NAME_CHARS, description="Bucket name; default `<game_id>/<variant>`."
    )
    weight: float = Field(default=1.0, gt=0, description="Relative share of groups drawn from this bucket.")
    seats: SeatPlan = Field(default_factory=SeatPlan)
    options: dict[str, str] = Field(default_factory=dict, description="CreateEpisode options.")

    @property
    def key(self) -> str:
        return self.name or f"{self.game_id}/{self.variant}"

    @property
    def num_seats(self) -> int:
        spec = get_game(self.game_id)
        return spec.variants[self.variant or spec.default_variant]

    @model_validator(mode="after")
    def _known_game(self) -> Bucket:
        """Checked at start: an unknown game or variant used to be accepted here and fail every NextTasks."""
        try:
            spec = get_game(self.game_id)
        except KeyError as exc:
            raise ValueError(str(exc).strip("\"'")) from None
        variant = self.variant or spec.default_variant
        if variant not in spec.variants:
            raise ValueError(
                f"unknown variant {self.variant!r} of {self.game_id}; valid: {', '.join(sorted(spec.variants))}"
            )
        if "#" in self.key:  # task keys are `<bucket>#<seed>`: a '#' in the name would split them wrongly
            raise ValueError(f"bucket name {self.key!r} must not contain '#'")
        seats = self.seats.trainee_seats
        n = spec.variants[variant]
        if isinstance(seats, list):
            if not seats or len(set(seats)) != len(seats) or not all(0 <= s < n for s in seats):
                raise ValueError(
                    f"trainee_seats {seats} of {self.key}: distinct seats in 0..{n - 1} ({n} players), at least one"
                )
        elif not 1 <= seats <= n:
            raise ValueError(f"trainee_seats {seats} of {self.key}: a count from 1 to {n} ({n} players)")
        return self


def _default_buckets() -> list[Bucket]:
    return [
        Bucket(game_id="werewolf_v1", variant="6p"),
        Bucket(game_id="bargaining_v1", variant="easy", seats=SeatPlan(trainee_seats=[0])),
    ]


class CurriculumConfig(BaseModel):
    """Everything the curriculum service schedules by."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy_id: str = Field(default="default", description="The trainee policy id (inference policy id).")
    group_size: int = Field(default=1, ge=1, le=MAX_GROUP_SIZE, description="Episodes per task and seed.")
    replay_ratio: float = Field(
        default=0.5, ge=0, le=1, description="Share of groups that replay a past task."
    )
    eval_seed_offset: int = Field(
        default=1_000_000_000, ge=0, description="Eval seeds start here (held out)."
    )
    seed: int = Field(default=0, description="Seed of the scheduler's RNG (mixed with a counter per call).")
    recent_window: int = Field(
        default=100, ge=1, description="Outcomes per bucket in the success-rate window."
    )
    buckets: list[Bucket] = Field(default_factory=_default_buckets, max_length=MAX_BUCKETS)
    aiw: AIWConfig = Field(default_factory=AIWConfig)
    league: LeagueConfig = Field(default_factory=LeagueConfig)
    key_prefix: str = Field(default="wolfpack:curriculum", description="Prefix of every Redis key.")
    stream_group: str = Field(default="curriculum", description="Consumer group on the trajectory stream.")
    recorded_window: int = Field(
        default=200_000, ge=1, le=10_000_000,
        description="Trajectory ids remembered for idempotency (the newest; older ones are trimmed).",
    )  # fmt: skip

    @field_validator("buckets")
    @classmethod
    def _unique(cls, v: list[Bucket]) -> list[Bucket]:
        if not v:
            raise ValueError("at least one bucket is needed")
        names = [b.key for b in v]
        if len(set(names)) != len(names):
            raise ValueError(f"bucket names must be unique: {names}")
        return v

    def bucket(self, name: str) -> Bucket:
        for b in self.buckets:
            if b.key == name:
                return b
        raise KeyError(f"unknown bucket {name!r}; buckets: {[b.key for b in self.buckets]}")

    @classmethod
    def load(cls, path: str | Path | None) -> CurriculumConfig:
        if path is None:
            return cls()
        data = yaml.safe_load(Path(path).read_text()) or {}
        return cls.model_validate(data.get("curriculum", data))
