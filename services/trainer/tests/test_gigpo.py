"""GiGPO's step-level groups against hand-computed examples."""

from __future__ import annotations

import statistics
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


# --- added for mutation testing (bench/results/2026-11-26-mutation-trainer.md) ------------------------------


def _z(values: list[float], epsilon: float = 1e-6) -> list[float]:
    """A second implementation of "normalise within the group": (x - mean) / (sample std + epsilon)."""
    mean, std = statistics.fmean(values), statistics.stdev(values)
    return [(v - mean) / (std + epsilon) for v in values]


def test_a_pair_is_an_anchor_group_and_singletons_get_zero(trajectory_factory: Callable[..., Any]) -> None:
    # "S" is reached once by each episode (a group of two); "A" and "B" once each (advantage 0)
    a = trajectory_factory("a", [(0, [1], [2], 0.0, "S"), (0, [1], [2], 2.0, "A")])
    b = trajectory_factory("b", [(0, [1], [2], 0.0, "S"), (0, [1], [2], 0.0, "B")])
    samples = build_samples([a, b], BatchConfig(layout="turn"))
    adv, metrics = step_advantages(samples, gamma=0.5, norm_by_std=False)
    # returns at "S": a = 0 + 0.5 * 2 = 1, b = 0; mean 0.5
    assert adv == [0.5, 0.0, -0.5, 0.0]
    assert metrics == {"gigpo/anchor_groups": 1.0, "gigpo/anchored_fraction": 0.5}


def test_step_advantages_divide_by_std_plus_epsilon_by_default(
    trajectory_factory: Callable[..., Any],
) -> None:
    samples = build_samples(_episodes(trajectory_factory), BatchConfig(layout="turn"))
    adv, _ = step_advantages(samples, gamma=0.5)  # defaults: norm_by_std, epsilon 1e-6
    s = _z([0.5, 0.0, 0.0])  # the "S" anchor group: e0 t0, e1 t0, e1 t2
    assert adv == pytest.approx([s[0], 0.0, s[1], 0.0, s[2]], rel=1e-12, abs=1e-12)
    adv_eps, _ = step_advantages(samples, gamma=0.5, epsilon=0.1)
    assert adv_eps[0] == pytest.approx(_z([0.5, 0.0, 0.0], 0.1)[0], rel=1e-12)


def test_step_returns_follow_turn_order_not_sample_order(trajectory_factory: Callable[..., Any]) -> None:
    samples = build_samples(_episodes(trajectory_factory), BatchConfig(layout="turn"))
    shuffled = [samples[i] for i in (4, 1, 3, 0, 2)]
    # the same returns as in turn order ([0.5, 1.0, 0.0, 0.0, 0.0]), permuted alike
    assert step_returns(shuffled, gamma=0.5) == [0.0, 1.0, 0.0, 0.5, 0.0]


def test_no_samples_no_anchor_groups() -> None:
    assert step_advantages([], gamma=0.9) == (
        [],
        {"gigpo/anchor_groups": 0.0, "gigpo/anchored_fraction": 0.0},
    )


def test_gigpo_with_default_config_matches_a_second_implementation(
    trajectory_factory: Callable[..., Any],
) -> None:
    # Three episodes of one group; each starts in "S". Defaults: GRPO with std at the episode level,
    # step weight 1, step gamma 0.95, epsilon 1e-6.
    trajs = [
        trajectory_factory("e0", [(0, [1], [2], 0.0, "S"), (0, [1], [3], 1.0, "A")]),
        trajectory_factory("e1", [(0, [1], [4], 0.0, "S"), (0, [1], [5], 0.0, "B")]),
        trajectory_factory("e2", [(0, [1], [6], 1.0, "S")]),
    ]
    samples = build_samples(trajs, BatchConfig(layout="turn"))
    batch = collate(samples)
    out = compute_advantages(batch, samples, AlgoConfig(estimator="gigpo"))
    episode = _z([1.0, 0.0, 1.0])  # seat returns of e0, e1, e2
    step = _z([0.95 * 1.0, 0.0, 1.0])  # returns at "S": e0 = 0 + 0.95 * 1, e1 = 0, e2 = 1
    want = [episode[0] + step[0], episode[0], episode[1] + step[1], episode[1], episode[2] + step[2]]
    assert out.advantages.shape == batch.response_mask.shape
    assert out.advantages[:, 0].tolist() == pytest.approx(want, abs=1e-5)
    assert out.metrics["gigpo/anchor_groups"] == 1.0
    assert out.metrics["gigpo/anchored_fraction"] == pytest.approx(3 / 5)


def test_an_unshared_state_seen_first_does_not_stop_the_grouping(
    trajectory_factory: Callable[..., Any],
) -> None:
    # the first sample's state "X" is seen once; the shared state "S" comes after it
    a = trajectory_factory("a", [(0, [1], [2], 0.0, "X"), (0, [1], [2], 1.0, "S")])
    b = trajectory_factory("b", [(0, [1], [2], 0.0, "S")])
    samples = build_samples([a, b], BatchConfig(layout="turn"))
    adv, metrics = step_advantages(samples, gamma=1.0, norm_by_std=False)
    # "S": returns a = 1, b = 0, mean 0.5
    assert adv == [0.0, 0.5, -0.5]
    assert metrics["gigpo/anchor_groups"] == 1.0
