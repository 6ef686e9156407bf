"""GiGPO's step-level groups against hand-computed examples."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from wolfpack_trainer.algos import AlgoConfig, compute_advantages
from wolfpack_trainer.batch import BatchConfig, build_samples, collate
from wolfpack_trainer.gigpo import step_advantages, step_returns


def _episodes(factory: Callable[..., Any]) -> list[Any]:
    # Two episodes of one group. Both start in state "S"; episode 0 then reaches "A", episode 1 "B",
    # and episode 1 comes back to "S" once more. Rewards: per turn.
    e0 = factory("e0", [(0, [1], [2], 0.0, "S"), (0, [1], [3], 1.0, "A")])
    e1 = factory("e1", [(0, [1], [4], 0.0, "S"), (0, [1], [5], 0.0, "B"), (0, [1], [6], 0.0, "S")])
    return [e0, e1]


def test_step_returns_are_discounted_per_seat_episode(trajectory_factory: Callable[..., Any]) -> None:
    samples = build_samples(_episodes(trajectory_factory), BatchConfig(layout="turn"))
    assert step_returns(samples, gamma=0.5) == [0.5, 1.0, 0.0, 0.0, 0.0]


def test_step_advantages_group_identical_anchor_states(trajectory_factory: Callable[..., Any]) -> None:
    samples = build_samples(_episodes(trajectory_factory), BatchConfig(layout="turn"))
    adv, metrics = step_advantages(samples, gamma=0.5, norm_by_std=False)
    # anchor "S": returns [0.5 (e0 t0), 0.0 (e1 t0), 0.0 (e1 t2)], mean 1/6
    assert adv == pytest.approx([0.5 - 1 / 6, 0.0, -1 / 6, 0.0, -1 / 6])
    assert metrics["gigpo/anchor_groups"] == 1.0
    assert metrics["gigpo/anchored_fraction"] == pytest.approx(3 / 5)
    adv_std, _ = step_advantages(samples, gamma=0.5, norm_by_std=True)
    std = torch.tensor([0.5, 0.0, 0.0], dtype=torch.float64).std().item()
    assert adv_std[0] == pytest.approx((0.5 - 1 / 6) / std, rel=1e-5)


def test_anchor_groups_do_not_cross_episode_groups(trajectory_factory: Callable[..., Any]) -> None:
    a = trajectory_factory("a", [(0, [1], [2], 1.0, "S")], group="G1")
    b = trajectory_factory("b", [(0, [1], [2], 0.0, "S")], group="G2")
    samples = build_samples([a, b], BatchConfig(layout="turn"))
    adv, _ = step_advantages(samples, gamma=1.0)
    assert adv == [0.0, 0.0]


def test_gigpo_adds_weighted_step_advantage_to_episode_advantage(
    trajectory_factory: Callable[..., Any],
) -> None:
    samples = build_samples(_episodes(trajectory_factory), BatchConfig(layout="turn"))
    batch = collate(samples)
    cfg = AlgoConfig(estimator="gigpo", gigpo_gamma=0.5, gigpo_step_weight=0.5, norm_by_std=False)
    out = compute_advantages(batch, samples, cfg).advantages
    # episode level (Dr.GRPO, no std): returns e0 = 1, e1 = 0 -> +0.5 / -0.5
    episode = torch.tensor([0.5, 0.5, -0.5, -0.5, -0.5])
    step = torch.tensor([0.5 - 1 / 6, 0.0, -1 / 6, 0.0, -1 / 6])
    assert torch.allclose(out[:, 0], episode + 0.5 * step, atol=1e-5)
    assert torch.all(out[batch.response_mask == 0] == 0)


def test_gigpo_rejects_episode_layout(two_turn_episode: Callable[..., Any]) -> None:
    samples = build_samples([two_turn_episode()], BatchConfig(layout="episode"))
    with pytest.raises(ValueError, match="per-turn"):
        compute_advantages(collate(samples), samples, AlgoConfig(estimator="gigpo"))
