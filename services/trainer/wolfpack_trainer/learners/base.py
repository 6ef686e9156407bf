"""The learner contract: what a batch looks like, what every learner does with it, and the registry.

Why a contract file: the CPU learner (torch + peft, ``cpu.py``) and the GPU learner (verl's FSDP training
engine, ``verl_*.py``) are written by different people against the same trainer loop. The loop builds a
``TrainBatch`` (token-exact tensors plus advantages from ``algos.py``) and calls ``update``; how the
gradient step happens (one process, FSDP on Ray) is the learner's business.

Tensor layout follows verl's ``DataProto`` key names so a GPU learner can wrap a batch without renaming:
``prompts`` are left-padded to P, ``responses`` right-padded to R, ``input_ids = cat(prompts, responses)``.
In the multi-turn layout the "response" holds the whole conversation after the first prompt, with
observation tokens in it masked out by ``response_mask`` (the verl agent-loop recipe).

Change this file only additively: other engineers build on it.
"""

from __future__ import annotations

import abc
import functools
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch

from wolfpack.registry import Registry

TENSOR_KEYS: tuple[str, ...] = (
    "prompts",
    "responses",
    "input_ids",
    "attention_mask",
    "position_ids",
    "response_mask",
    "old_log_probs",
    "rollout_log_probs",
    "token_level_rewards",
    "advantages",
    "returns",
    "values",
    "ref_log_prob",
    "is_weights",
)
"""verl ``DataProto.batch`` key names; ``TrainBatch`` fields of the same name hold the same thing."""


@dataclass
class TrainBatch:
    """B samples, prompts left-padded to P, responses right-padded to R. Shapes in brackets.

    Always set by ``batch.py``: ``prompts`` [B, P] long, ``responses`` [B, R] long, ``input_ids`` [B, P+R],
    ``attention_mask`` [B, P+R] (1 on real tokens), ``position_ids`` [B, P+R], ``response_mask`` [B, R]
    float (1 on tokens the policy sampled and is trained on; 0 on padding and observation tokens),
    ``rollout_log_probs`` [B, R] (the sampler's logprobs, 0 where masked), ``token_level_rewards`` [B, R]
    (each turn's reward on its last response token).

    Filled by the loop before ``update``: ``advantages`` [B, R]; ``old_log_probs`` [B, R] (the behaviour
    policy's logprobs the clipped ratio is taken against: the rollout's, or the learner's recomputation);
    optional ``returns``/``values`` [B, R] (PPO with a value head), ``ref_log_prob`` [B, R] (KL to a
    reference) and ``is_weights`` [B, R] (truncated importance weights for off-policy samples).

    Per-sample metadata (length B): ``uids`` (the advantage group of each sample), ``trajectory_ids``,
    ``policy_ids``, ``roles``, ``policy_versions`` (version that sampled it), ``turn_indices`` (-1 for a
    whole multi-turn sequence).
    """

    prompts: torch.Tensor
    responses: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_mask: torch.Tensor
    rollout_log_probs: torch.Tensor
    token_level_rewards: torch.Tensor
    uids: list[str]
    trajectory_ids: list[str]
    policy_ids: list[str]
    roles: list[str]
    policy_versions: list[int]
    turn_indices: list[int]
    advantages: torch.Tensor | None = None
    old_log_probs: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    values: torch.Tensor | None = None
    ref_log_prob: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.responses.shape[0])

    @property
    def response_length(self) -> int:
        return int(self.responses.shape[1])

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors that are set, by verl key name (what ``DataProto.from_dict`` takes)."""
        out: dict[str, torch.Tensor] = {}
        for key in TENSOR_KEYS:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    def select(self, rows: list[int] | torch.Tensor) -> TrainBatch:
        """A sub-batch of the given rows (mini-batches, one policy's samples)."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        picked = [int(i) for i in idx.tolist()]
        updates: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                updates[f.name] = value.index_select(0, idx)
            elif isinstance(value, list):
                updates[f.name] = [value[i] for i in picked]
        return replace(self, **updates)


@dataclass(frozen=True)
class LossConfig:
    """How the policy loss is formed (verl ``actor`` config keys, same meaning).

    ``policy_loss``: a name in verl's policy-loss registry ("vanilla" = PPO clip, "gspo", "gpg", ...).
    ``loss_agg_mode``: "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm".
    ``kl_coef`` > 0 adds ``kl_type`` KL to the reference policy as a loss term (GRPO style).
    ``tis_cap`` > 0 multiplies each token's loss by min(pi_old/pi_rollout, cap) (truncated importance
    sampling, for rollout/learner logprob mismatch); 0 disables it.
    """

    policy_loss: str = "vanilla"
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    kl_coef: float = 0.0
    kl_type: str = "low_var_kl"
    value_coef: float = 0.5
    cliprange_value: float = 0.2
    tis_cap: float = 0.0


@dataclass(frozen=True)
class LearnerConfig:
    """Everything a learner needs to build and optimise one policy.

    ``model``: a model spec (``tiny``, ``smollm2``, an HF id or a local checkpoint directory).
    ``lora_rank`` 0 means full fine-tuning; otherwise a peft LoRA adapter with ``lora_alpha`` on
    ``lora_target_modules`` (empty: peft's default for the architecture).
    ``value_head``: add a scalar value head (PPO with GAE).
    ``ppo_epochs`` passes over each batch, split into ``mini_batch_size`` samples per optimiser step and
    ``micro_batch_size`` per forward (gradient accumulation).
    ``target_kl`` > 0: an update stops taking optimiser steps once a mini-batch's mean per-token KL from
    the policy the update started with (the k3 estimator, ``exp(r) - 1 - r`` with ``r`` the log-ratio of
    new to old) exceeds it, measured at the weights the step would move (the PPO early stop, as in
    Stable-Baselines3's ``target_kl``); 0 never stops. Why: on the CPU demo a single update at too large a
    learning rate reached a PPO KL of 0.44 and left a policy that no longer spelled its answers.
    ``extra``: learner-specific keys (e.g. FSDP/Ray settings of the GPU learner), passed through unread.
    """

    model: str = "tiny"
    cache_dir: str = ".wolfpack/models"
    lora_rank: int = 0
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_target_modules: tuple[str, ...] = ()
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    ppo_epochs: int = 1
    mini_batch_size: int = 0
    micro_batch_size: int = 8
    target_kl: float = 0.0
    temperature: float = 1.0
    value_head: bool = False
    seed: int = 0
    device: str = "auto"
    """``auto`` (CUDA when present, else CPU), ``cpu`` or ``cuda[:n]``; see ``resolve_device``."""
    dtype: str = "float32"
    loss: LossConfig = field(default_factory=LossConfig)
    extra: Mapping[str, Any] = field(default_factory=dict)


class DeviceUnavailableError(ValueError):
    """A config asked for an accelerator this machine does not have."""


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when CUDA is present, else ``cpu``; an explicit ``cuda[:n]`` without CUDA (or
    with too few devices) is an error, never a silent CPU run: a recipe sized for a GPU would otherwise
    train for hours on the CPU and look like it works."""
    want = (device or "auto").strip().lower()
    if want == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cpu":
        return "cpu"
    if want == "cuda" or want.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(f"device {device!r} requested but this machine has no CUDA device")
        index = int(want.split(":", 1)[1]) if ":" in want else 0
        if index >= torch.cuda.device_count():
            raise DeviceUnavailableError(
                f"device {device!r} requested but only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
        return want
    raise DeviceUnavailableError(f"device {device!r}: expected auto, cpu or cuda[:n]")


@dataclass(frozen=True)
class ExportedWeights:
    """What ``PushWeights`` sends: a full/partial state dict, or a LoRA adapter with its peft config.

    ``tensors`` keys are the names inference expects (HF names for full weights, peft keys for adapters).
    """

    tensors: Mapping[str, torch.Tensor]
    is_adapter: bool
    adapter_config_json: str = ""


class Learner(abc.ABC):
    """Optimises one policy. The loop owns advantages and batching; the learner owns the model.

    Implementations are registered with ``@register_learner("name")`` and built with
    ``get_learner(name)(config)``.
    """

    name: ClassVar[str] = ""
    capabilities: ClassVar[frozenset[str]] = frozenset()
    """What it supports beyond full-weight policy updates: "lora" (``lora_rank`` > 0), "value_head"
    (GAE), "generate" (in-process sampling, ``generation_model``: local rollouts). The trainer's config
    check refuses a setting whose capability the policy's learner lacks (``config.CAPABILITIES``)."""

    def __init__(self, config: LearnerConfig) -> None:
        self.config = config
        self.step = 0
        """Optimiser updates applied so far (``update`` calls), saved with the checkpoint."""

    @abc.abstractmethod
    def compute_log_probs(self, batch: TrainBatch) -> torch.Tensor:
        """Current policy's logprobs of ``batch.responses`` [B, R] at ``config.temperature`` (no grad);
        0 where ``response_mask`` is 0. Used to recompute old logprobs and for the reference policy."""

    def compute_values(self, batch: TrainBatch) -> torch.Tensor | None:
        """Value estimates [B, R] (no grad), or None when the learner has no value head."""
        return None

    def compute_ref_log_probs(self, batch: TrainBatch) -> torch.Tensor | None:
        """Reference (initial) policy's logprobs [B, R], or None when there is no reference."""
        return None

    @abc.abstractmethod
    def update(self, batch: TrainBatch) -> dict[str, float]:
        """One training pass over ``batch`` (``ppo_epochs`` x mini-batches); increments ``self.step`` by one.

        ``batch.advantages`` and ``batch.old_log_probs`` must be set. Returns scalar metrics under verl's
        names where they exist: ``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/entropy``,
        ``actor/grad_norm``, ``actor/kl_loss``, ``critic/vf_loss``, ``actor/lr``.
        """

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly (weights or adapter, optimiser, step, RNG)."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of ``state_dict``."""

    def save(self, directory: Path) -> Path:
        """Write a resumable checkpoint into ``directory`` (created); returns it."""
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), directory / "learner.pt")
        return directory

    def load(self, directory: Path) -> None:
        """Resume from a directory written by ``save``."""
        self.load_state_dict(torch.load(directory / "learner.pt", weights_only=False))

    @abc.abstractmethod
    def export_weights(self) -> ExportedWeights:
        """The current policy weights for inference (an adapter when training LoRA)."""

    def save_pretrained(self, directory: Path) -> Path:
        """A checkpoint inference can load by path (HF or peft directory); default: not supported."""
        raise NotImplementedError(f"learner {self.name!r} cannot write a pretrained directory")


L = TypeVar("L", bound=type[Learner])


@functools.lru_cache(maxsize=8)
def _tokenizer_files(model_path: str) -> tuple[tuple[str, bytes], ...]:
    """The files ``AutoTokenizer.save_pretrained`` writes for ``model_path``'s tokenizer, as bytes (loaded and
    written once per model path; a failure is raised, not cached)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    with tempfile.TemporaryDirectory(prefix="wolfpack-tokenizer-") as tmp:
        tok.save_pretrained(tmp)
        return tuple((f.name, f.read_bytes()) for f in sorted(Path(tmp).iterdir()) if f.is_file())


def write_tokenizer(model_path: str, directory: Path) -> None:
    """``model_path``'s tokenizer files into a version directory, byte for byte what
    ``AutoTokenizer.from_pretrained(model_path).save_pretrained(directory)`` writes. Why cached: a learner
    writes a version directory every update, and loading the tokenizer each time cost 0.3-0.5 s of a
    SmolLM2 publish on this CPU (bench/results/2026-11-28-tokenizer-files-cpu-s21.md). Raises as
    ``from_pretrained`` does for a model without a tokenizer."""
    for name, data in _tokenizer_files(model_path):
        (directory / name).write_bytes(data)


def register_learner(name: str) -> Callable[[L], L]:
    """Class decorator registering a ``Learner`` subclass under ``name`` (e.g. "cpu", "verl_fsdp")."""

    def deco(cls: L) -> L:
        LEARNERS.add(name, cls)  # an empty name or one taken by another class is a ValueError
        cls.name = name
        return cls

    return deco


BUILTIN_LEARNERS = ("wolfpack_trainer.learners.cpu", "wolfpack_trainer.learners.verl.learner")


def load_builtin_learners() -> None:
    """Import the built-in learner modules so they register; one whose optional dependencies are missing
    (the GPU learner on a CPU-only install) registers nothing. Lazy: importing this contract stays cheap."""
    import importlib

    for module in BUILTIN_LEARNERS:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                continue
            if module == BUILTIN_LEARNERS[0]:
                raise


class UnknownLearnerError(KeyError):
    pass


LEARNERS: Registry[type[Learner]] = Registry(
    "learner", loader=load_builtin_learners, error=UnknownLearnerError
)
"""name -> ``Learner`` subclass; the first lookup imports the built-in learner modules (``BUILTIN_LEARNERS``)."""


def get_learner(name: str) -> type[Learner]:
    """The learner class registered as ``name``; a miss (``UnknownLearnerError``) lists the valid names.

    Built-in learners register on the first lookup; the GPU one registers only where verl imports, so a
    CPU machine without verl still gets the CPU learner."""
    return LEARNERS.get(name)
