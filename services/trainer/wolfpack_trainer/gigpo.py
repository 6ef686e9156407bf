"""GiGPO: Group-in-Group Policy Optimization (Feng et al. 2025, arXiv:2505.10978). Not in verl.

Two levels of groups, both critic-free:

1. Episode level: each seat-episode's return, normalised within its group (the episodes played from the
   same task and seed) — exactly GRPO, so it calls ``algos.grpo``.
2. Step level: within one episode group, turns whose observation text is identical are the same *anchor
   state* reached by different episodes (or twice by one). Each such turn's discounted return from that
   step on, ``R_t = sum_k gamma^k r_{t+k}`` over the seat's own later turns, is normalised within its anchor
   group. A state seen only once gets step advantage 0.

The advantage of a turn is ``A_episode + step_weight * A_step``, broadcast over its response tokens.
Needs the per-turn layout (one sample per turn, with its observation text and its own reward).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from wolfpack_trainer.algos import Advantages, AlgoConfig, grpo, register_estimator
from wolfpack_trainer.batch import Sample
from wolfpack_trainer.learners.base import TrainBatch


def step_returns(samples: Sequence[Sample], gamma: float) -> list[float]:
    """Discounted return from each turn on, over the later turns of the same seat in the same episode."""
    by_seat: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        by_seat[(s.trajectory_id, s.seat)].append(i)
    out = [0.0] * len(samples)
    for idxs in by_seat.values():
        idxs.sort(key=lambda i: samples[i].turn_index)
        running = 0.0
        for i in reversed(idxs):
            running = samples[i].step_reward + gamma * running
            out[i] = running
    return out


def step_advantages(
    samples: Sequence[Sample], gamma: float, norm_by_std: bool = True, epsilon: float = 1e-6
) -> tuple[list[float], dict[str, float]]:
    """Per-sample step-level advantage: its return minus the mean (over the std) of its anchor group,
    the samples of the same episode group (``uid``) with the identical observation text."""
    returns = step_returns(samples, gamma)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        groups[(s.uid, s.observation)].append(i)
    adv = [0.0] * len(samples)
    shared = 0
    for idxs in groups.values():
        if len(idxs) < 2:
            continue
        shared += 1
        vals = torch.tensor([returns[i] for i in idxs], dtype=torch.float64)
        centred = vals - vals.mean()
        if norm_by_std:
            centred = centred / (vals.std() + epsilon)
        for i, a in zip(idxs, centred.tolist(), strict=True):
            adv[i] = float(a)
    metrics = {
        "gigpo/anchor_groups": float(shared),
        "gigpo/anchored_fraction": sum(len(v) for v in groups.values() if len(v) > 1) / max(len(samples), 1),
    }
    return adv, metrics


@register_estimator("gigpo")
def gigpo(batch: TrainBatch, samples: Sequence[Sample], config: AlgoConfig) -> Advantages:
    if any(s.turn_index < 0 for s in samples):
        raise ValueError("gigpo needs the per-turn layout (batch.layout: turn)")
    episode = grpo(batch, samples, config)
    step, metrics = step_advantages(samples, config.gigpo_gamma, config.norm_by_std, config.epsilon)
    step_t = torch.tensor(step, dtype=torch.float32).unsqueeze(1) * batch.response_mask
    episode.advantages = episode.advantages + config.gigpo_step_weight * step_t
    episode.metrics.update(metrics)
    return episode
