"""Advantage estimators and the policy loss, one registry over verl's ``core_algos`` (called, not copied).

Every estimator has one signature, ``fn(batch, samples, config) -> Advantages`` (verl's own registry has
several, which forces callers to special-case them; here the adapter does that once):

| name | verl function | groups | needs |
| --- | --- | --- | --- |
| ``grpo`` | ``compute_grpo_outcome_advantage`` | ``uid`` | - |
| ``rloo`` | ``compute_rloo_outcome_advantage`` | ``uid`` | - |
| ``reinforce_pp`` | ``compute_reinforce_plus_plus_outcome_advantage`` | batch whitening | - |
| ``gae`` (PPO) | ``compute_gae_advantage_return`` | - | ``batch.values`` (value head) |
| ``gigpo`` | episode level: GRPO above; step level: ``gigpo.py`` (not in verl) | ``uid`` + anchor states | - |

Outcome estimators score a seat once per episode: with per-turn samples a long episode would otherwise
count once per turn in its group's mean and std. So they run on one row per (trajectory, seat) holding
the seat's return, and the resulting scalar is broadcast to that seat's response tokens (what
verl-agent does with its trajectory index).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import torch

from wolfpack.registry import Registry
from wolfpack_trainer.batch import Sample
from wolfpack_trainer.learners.base import LossConfig, TrainBatch


@dataclass(frozen=True)
class AlgoConfig:
    """``estimator``: a name in ``ESTIMATORS``. ``gamma``/``lam``: GAE and REINFORCE++ discounting.
    ``norm_by_std``: GRPO divides by the group std (Dr. GRPO sets it False).
    ``gigpo_step_weight``: GiGPO's weight of the step-level advantage (``omega`` in the paper);
    ``gigpo_gamma``: discount of step returns within an episode."""

    estimator: str = "grpo"
    gamma: float = 1.0
    lam: float = 1.0
    norm_by_std: bool = True
    gigpo_step_weight: float = 1.0
    gigpo_gamma: float = 0.95
    epsilon: float = 1e-6


@dataclass
class Advantages:
    """``advantages``/``returns`` [B, R], zero where ``response_mask`` is 0; scalar metrics."""

    advantages: torch.Tensor
    returns: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


EstimatorFn = Callable[[TrainBatch, Sequence[Sample], AlgoConfig], Advantages]

BUILTIN_ESTIMATOR_MODULES = ("wolfpack_trainer.gigpo",)
"""Modules that register more estimators (GiGPO builds on ``grpo`` here, so it imports this module): the
registry's loader imports them by name on first lookup, a plugin lookup rather than an import cycle."""


def _load_builtin_estimators() -> None:
    for module in BUILTIN_ESTIMATOR_MODULES:
        importlib.import_module(module)


ESTIMATORS: Registry[EstimatorFn] = Registry("advantage estimator", loader=_load_builtin_estimators)


def register_estimator(name: str) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator registering an estimator under ``name``; a name taken by another one is an error."""
    return ESTIMATORS.register(name)


def get_estimator(name: str) -> EstimatorFn:
    """The estimator registered as ``name``; a miss (``KeyError``) lists the valid names."""
    return ESTIMATORS.get(name)


def compute_advantages(batch: TrainBatch, samples: Sequence[Sample], config: AlgoConfig) -> Advantages:
    if len(samples) != len(batch):
        raise ValueError(f"{len(samples)} samples for a batch of {len(batch)}")
    out = get_estimator(config.estimator)(batch, samples, config)
    out.metrics.update(advantage_spread(out.advantages, batch.response_mask))
    return out


def advantage_spread(advantages: torch.Tensor, response_mask: torch.Tensor) -> dict[str, float]:
    """``adv/zero_fraction``: the share of samples whose advantage is 0 on every answer token; ``adv/abs_mean``:
    the mean |advantage| over answer tokens. Why: a group-relative estimator gives every sample of a group
    whose episodes all returned the same a zero advantage, i.e. no gradient at all (the 6p village from a
    format clone: every game lost; 12p: 0.00 -> 0.00), and a small share of moving samples shows up only as a
    small grad norm and ppo_kl (AIW on an H200: grad norm ~0.035, ppo_kl ~4e-4); these say which it was."""
    mask = response_mask.bool()
    answered = mask.any(dim=1)
    if not bool(answered.any()):
        return {}
    zero = ((advantages.abs() <= 1e-8) | ~mask).all(dim=1) & answered
    return {
        "adv/zero_fraction": float(zero.sum()) / float(answered.sum()),
        "adv/abs_mean": float(advantages.abs()[mask].mean()),
    }


@cache
def _core() -> Any:
    """verl's core_algos, imported on first use (its import pulls in ray and takes seconds)."""
    from verl.trainer.ppo import core_algos

    return core_algos


def _verl_algo_config(config: AlgoConfig) -> Any:
    from verl.trainer.config.algorithm import AlgoConfig as VerlAlgoConfig

    return VerlAlgoConfig(
        gamma=config.gamma,
        lam=config.lam,
        adv_estimator=config.estimator,
        norm_adv_by_std_in_grpo=config.norm_by_std,
    )


def episode_rows(samples: Sequence[Sample]) -> tuple[list[tuple[str, int]], list[int]]:
    """Distinct (trajectory, seat) keys in first-seen order and, per sample, the row of its key."""
    keys: dict[tuple[str, int], int] = {}
    rows = []
    for s in samples:
        rows.append(keys.setdefault((s.trajectory_id, s.seat), len(keys)))
    return list(keys), rows


def outcome_scores(
    samples: Sequence[Sample],
) -> tuple[torch.Tensor, np.ndarray[Any, np.dtype[np.object_]], list[int]]:
    """One row per (trajectory, seat): its return [E, 1], its group uid [E], and each sample's row."""
    keys, rows = episode_rows(samples)
    score = torch.zeros((len(keys), 1), dtype=torch.float32)
    index = np.empty(len(keys), dtype=object)
    for s, row in zip(samples, rows, strict=True):
        score[row, 0] = s.seat_return
        index[row] = s.uid
    return score, index, rows


def _broadcast(per_row: torch.Tensor, rows: list[int], mask: torch.Tensor) -> torch.Tensor:
    """Row scalars [E] → token tensor [B, R] over each sample's response mask."""
    return per_row[torch.as_tensor(rows, dtype=torch.long)].unsqueeze(1) * mask


def _outcome(name: str, batch: TrainBatch, samples: Sequence[Sample], config: AlgoConfig) -> Advantages:
    score, index, rows = outcome_scores(samples)
    ones = torch.ones_like(score)
    if name == "grpo":
        adv, _ = _core().compute_grpo_outcome_advantage(
            score, ones, index, epsilon=config.epsilon, norm_adv_by_std_in_grpo=config.norm_by_std
        )
    else:
        adv, _ = _core().compute_rloo_outcome_advantage(score, ones, index, epsilon=config.epsilon)
    mask = batch.response_mask
    groups = len(set(index.tolist()))
    return Advantages(
        _broadcast(adv[:, 0], rows, mask),
        _broadcast(score[:, 0], rows, mask),
        {f"adv/{name}_groups": float(groups), "adv/episodes": float(len(index))},
    )


@register_estimator("grpo")
def grpo(batch: TrainBatch, samples: Sequence[Sample], config: AlgoConfig) -> Advantages:
    """GRPO (Shao et al. 2024, arXiv:2402.03300): (return - group mean) / group std per seat-episode."""
    return _outcome("grpo", batch, samples, config)


@register_estimator("rloo")
def rloo(batch: TrainBatch, samples: Sequence[Sample], config: AlgoConfig) -> Advantages:
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740): return minus the mean of the group's others."""
    return _outcome("rloo", batch, samples, config)


@register_estimator("reinforce_pp")
def reinforce_pp(batch: TrainBatch, samples: Sequence[Sample], config: AlgoConfig) -> Advantages:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted token returns whitened over the batch."""
    adv, ret = _core().compute_reinforce_plus_plus_outcome_advantage(
        batch.token_level_rewards, batch.response_mask, config=_verl_algo_config(config)
    )
    return Advantages(adv, ret)


@register_estimator("gae")
def gae(batch: TrainBatch, samples: Sequence[Sample], config: AlgoConfig) -> Advantages:
    """PPO's GAE (Schulman et al. 2016, arXiv:1506.02438) from the value head's ``batch.values``."""
    if batch.values is None:
        raise ValueError("the gae estimator needs batch.values: use a learner with value_head: true")
    adv, ret = _core().compute_gae_advantage_return(
        batch.token_level_rewards,
        batch.values,
        batch.response_mask,
        gamma=torch.tensor(config.gamma),
        lam=torch.tensor(config.lam),
    )
    return Advantages(adv, ret)


# --- losses ------------------------------------------------------------------------------------------


def _actor_config(loss: LossConfig) -> Any:
    """The slice of verl's actor config its policy-loss functions read."""
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "clip_ratio": loss.clip_ratio,
            "clip_ratio_low": loss.clip_ratio_low,
            "clip_ratio_high": loss.clip_ratio_high,
            "clip_ratio_c": loss.clip_ratio_c,
            "loss_agg_mode": loss.loss_agg_mode,
            "global_batch_info": {},
            "policy_loss": {"loss_mode": loss.policy_loss},
        }
    )


def policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss: LossConfig,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's registered policy loss ``loss.policy_loss`` (PPO clip by default), aggregated by
    ``loss.loss_agg_mode``; ``is_weights`` scales each token's loss (truncated importance sampling)."""
    fn = _core().get_policy_loss_fn(loss.policy_loss)
    value, metrics = fn(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode=loss.loss_agg_mode,
        config=_actor_config(loss),
        rollout_is_weights=is_weights,
    )
    return value, {k: float(v) for k, v in metrics.items()}


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    return _core().agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=mode)  # type: ignore[no-any-return]


def kl_loss(
    log_prob: torch.Tensor, ref_log_prob: torch.Tensor, mask: torch.Tensor, loss: LossConfig
) -> torch.Tensor:
    """KL to the reference policy (``loss.kl_type``: k1 "kl", k2 "mse", k3 "low_var_kl", ...)."""
    kl = _core().kl_penalty(log_prob, ref_log_prob, kl_penalty=loss.kl_type)
    return agg_loss(kl, mask, loss.loss_agg_mode)


def value_loss(
    vpreds: torch.Tensor, returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, loss: LossConfig
) -> tuple[torch.Tensor, float]:
    """verl's clipped value loss; returns (loss, clip fraction)."""
    vf_loss, vf_clipfrac = _core().compute_value_loss(
        vpreds, returns, values, mask, cliprange_value=loss.cliprange_value, loss_agg_mode=loss.loss_agg_mode
    )
    return vf_loss, float(vf_clipfrac)


def truncated_is_weights(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Token-level truncated importance weights min(pi_old / pi_rollout, cap) (Yao et al. 2025, "Your
    efficient RL framework secretly brings you off-policy RL training"), no gradient, 0 where masked."""
    ratio = torch.exp((old_log_prob - rollout_log_prob).clamp(-20.0, 20.0))
    return (ratio.clamp(max=cap) * mask).detach()


def logprob_mismatch(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """How far the learner's recomputed logprobs are from the sampler's (same tokens, same weights)."""
    n = mask.sum().clamp(min=1.0)
    diff = (old_log_prob - rollout_log_prob) * mask
    ratio = torch.exp(diff.clamp(-20.0, 20.0))
    return {
        "mismatch/abs_logprob_diff": float(diff.abs().sum() / n),
        "mismatch/max_abs_logprob_diff": float(diff.abs().max()),
        "mismatch/k3_kl": float(((ratio - 1 - diff) * mask).sum() / n),
    }
