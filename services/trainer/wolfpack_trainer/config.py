"""Training run configuration: one YAML file (``configs/*.yaml``) validated by strict pydantic models.

Why strict (``extra="forbid"``): a typo such as ``clip_ratoi: 0.1`` must fail loudly, not train with the
default. Names (game, estimator, learner, policy loss) are checked against their registries at load time,
so a recipe that cannot run fails in ``wolfpack train --check`` and in CI, not an hour into a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from wolfpack_trainer.algos import AlgoConfig
from wolfpack_trainer.batch import BatchConfig
from wolfpack_trainer.learners.base import LearnerConfig, LossConfig

GPU_LEARNERS = ("verl_fsdp",)
"""Learners that register only where verl's GPU stack imports; configs may name them on any machine."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GameSection(_Strict):
    id: str
    variant: str = ""
    bot: str = "heuristic"
    """Scripted bot for every seat no trained policy takes."""
    language: str = "en"
    options: dict[str, Any] = Field(default_factory=dict)


class PolicySection(_Strict):
    """One trained policy. ``seats`` (by index) or ``roles`` say where it plays; IPPO = one learner each."""

    id: str
    seats: list[int] = Field(default_factory=list)
    roles: list[str] = Field(default_factory=list)
    learner: str = "cpu"
    model: str = "tiny"
    lora_rank: int = 0
    lora_alpha: int = 16
    lora_target_modules: list[str] = Field(default_factory=list)
    lr: float = 1e-5
    max_grad_norm: float = 1.0
    ppo_epochs: int = 1
    mini_batch_size: int = 0
    micro_batch_size: int = 16
    value_head: bool = False
    extra: dict[str, Any] = Field(default_factory=dict)


class WarmStartSection(_Strict):
    """Behaviour-clone ``bot`` into the base model before RL (see warmstart.py); ``steps: 0`` skips it."""

    bot: str = "random"
    episodes: int = 100
    steps: int = 40
    lr: float = 3e-3


class OpponentMix(_Strict):
    """Fraction of episodes whose non-trainee seats are played by ``bot`` (or an external model)."""

    bot: str
    fraction: float = Field(gt=0.0, le=1.0)


class RolloutSection(_Strict):
    """``local``: the learner's model plays in process; ``service``: the rollout service's driver plays
    through environment + inference and the trainer pushes weights to inference."""

    mode: Literal["local", "service"] = "local"
    episodes_per_update: int = 32
    group_size: int = 8
    max_tokens: int = 32
    temperature: float = 1.0
    invalid_penalty: float = 0.1
    prompt: Literal["observation", "full_history"] = "observation"
    max_prompt_tokens: int = 0
    """Local mode: keep only the last N prompt tokens (0: all). A cost knob for small CPU runs."""
    opponents: list[OpponentMix] = Field(default_factory=list)
    reward_spec: str = ""


class TrainSection(_Strict):
    updates: int = 10
    push_every: int = 1
    checkpoint_every: int = 1
    max_staleness: int = 2
    """Trajectories more than this many versions behind the learner are dropped (counted)."""
    freeze_every: int = 0
    """Register a frozen snapshot in the curriculum's league every k updates (0: never)."""
    save_versions: bool = True
    """Write each published version as a loadable directory (HF or peft) under <run>/policies/."""
    share_policy: bool = False
    """True: one learner for all policies (role in the prompt); False: IPPO, one learner per policy."""


class EvalSection(_Strict):
    every: int = 5
    episodes: int = 64
    seed_offset: int = 1_000_000
    temperature: float = 1.0
    metric: Literal["win_rate", "reward"] = "win_rate"


class StreamSection(_Strict):
    name: str = "wolfpack:trajectories"
    group: str = "trainer"
    claim_idle_ms: int = 2000


class TrainConfig(_Strict):
    name: str
    description: str = ""
    seed: int = 0
    game: GameSection
    policies: list[PolicySection]
    warmstart: WarmStartSection | None = None
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    algo: dict[str, Any] = Field(default_factory=dict)
    loss: dict[str, Any] = Field(default_factory=dict)
    batch: dict[str, Any] = Field(default_factory=dict)
    train: TrainSection = Field(default_factory=TrainSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    stream: StreamSection = Field(default_factory=StreamSection)
    curriculum: dict[str, Any] = Field(default_factory=dict)
    """Service mode: settings handed to the curriculum service (e.g. AIW reweighting), passed through."""

    @model_validator(mode="after")
    def _check_names(self) -> TrainConfig:
        from wolfpack_games import get_game
        from wolfpack_trainer.algos import get_estimator
        from wolfpack_trainer.learners.base import LEARNERS, get_learner

        spec = get_game(self.game.id)
        if self.game.variant and self.game.variant not in spec.variants:
            raise ValueError(
                f"game {self.game.id} has no variant {self.game.variant!r}: {', '.join(spec.variants)}"
            )
        for bot in [self.game.bot, *(m.bot for m in self.rollout.opponents)]:
            if bot not in spec.bots and not bot.startswith(("external:", "frozen:")):
                raise ValueError(
                    f"game {self.game.id} has no bot {bot!r}; bots: {', '.join(sorted(spec.bots))}"
                )
        if not self.policies:
            raise ValueError("at least one policy must be trained")
        ids = [p.id for p in self.policies]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate policy ids: {ids}")
        for p in self.policies:
            if p.learner not in GPU_LEARNERS:
                get_learner(p.learner)
            elif p.learner in LEARNERS:
                pass
            if not p.seats and not p.roles:
                raise ValueError(f"policy {p.id}: give seats or roles")
        self.algo_config()
        get_estimator(self.algo_config().estimator)
        self.loss_config()
        self.batch_config()
        if sum(m.fraction for m in self.rollout.opponents) > 1.0 + 1e-9:
            raise ValueError("opponent mix fractions sum to more than 1")
        if self.rollout.episodes_per_update % self.rollout.group_size:
            raise ValueError("rollout.episodes_per_update must be a multiple of rollout.group_size")
        return self

    def algo_config(self) -> AlgoConfig:
        out: AlgoConfig = _build(AlgoConfig, self.algo, "algo")
        return out

    def loss_config(self) -> LossConfig:
        out: LossConfig = _build(LossConfig, self.loss, "loss")
        return out

    def batch_config(self, pad_token_id: int = 0) -> BatchConfig:
        kw = dict(self.batch)
        for key in ("group_by", "policies"):
            if key in kw:
                kw[key] = tuple(kw[key])
        out: BatchConfig = _build(BatchConfig, {**kw, "pad_token_id": pad_token_id}, "batch")
        return out

    def learner_config(
        self, policy: PolicySection, cache_dir: str, model: str | None = None
    ) -> LearnerConfig:
        return LearnerConfig(
            model=model or policy.model,
            cache_dir=cache_dir,
            lora_rank=policy.lora_rank,
            lora_alpha=policy.lora_alpha,
            lora_target_modules=tuple(policy.lora_target_modules),
            lr=policy.lr,
            max_grad_norm=policy.max_grad_norm,
            ppo_epochs=policy.ppo_epochs,
            mini_batch_size=policy.mini_batch_size,
            micro_batch_size=policy.micro_batch_size,
            temperature=self.rollout.temperature if self.rollout.temperature > 0 else 1.0,
            value_head=policy.value_head,
            seed=self.seed,
            loss=self.loss_config(),
            extra=policy.extra,
        )


def _build(cls: Any, values: dict[str, Any], section: str) -> Any:
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{section}: unknown keys {unknown}; known: {sorted(known)}")
    return cls(**values)


class ConfigError(Exception):
    pass


def load_config(path: str | Path) -> TrainConfig:
    """Read and validate a YAML config; errors name the file and the field."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{p}: {exc}") from None
    try:
        return TrainConfig.model_validate(data)
    except (ValidationError, ValueError, KeyError) as exc:
        raise ConfigError(f"{p}: {exc}") from None
