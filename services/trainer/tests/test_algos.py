"""Estimators and losses against hand-computed values (they call verl's core_algos)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from wolfpack_trainer import algos
from wolfpack_trainer.algos import AlgoConfig, compute_advantages
from wolfpack_trainer.batch import BatchConfig, build_samples, collate
from wolfpack_trainer.learners.base import LossConfig


def _group(factory: Callable[..., Any], rewards: list[float], turns: int = 1) -> tuple[Any, Any]:
    trajs = [
        factory(f"t{i}", [(0, [1], [2, 3], (r if k == turns - 1 else 0.0), f"o{k}") for k in range(turns)])
        for i, r in enumerate(rewards)
    ]
    samples = build_samples(trajs, BatchConfig(layout="turn"))
    return samples, collate(samples)


def test_grpo_normalises_within_group_once_per_episode(trajectory_factory: Callable[..., Any]) -> None:
    # episode t0 has 3 turns, t1 and t2 one turn each: per-episode scoring must not weight t0 thrice
    trajs = [
        trajectory_factory("t0", [(0, [1], [2], 0.0, "a"), (0, [1], [2], 0.0, "b"), (0, [1], [2], 1.0, "c")]),
        trajectory_factory("t1", [(0, [1], [2], 0.0, "a")]),
        trajectory_factory("t2", [(0, [1], [2], -1.0, "a")]),
    ]
    samples = build_samples(trajs, BatchConfig(layout="turn"))
    batch = collate(samples)
    adv = compute_advantages(batch, samples, AlgoConfig(estimator="grpo")).advantages[:, 0]
    std = torch.tensor([1.0, 0.0, -1.0]).std()  # unbiased, as verl
    expected = torch.tensor([1.0, 1.0, 1.0, 0.0, -1.0]) / (std + 1e-6)
    assert torch.allclose(adv, expected, atol=1e-5)


def test_grpo_groups_are_separate(trajectory_factory: Callable[..., Any]) -> None:
    trajs = [
        trajectory_factory("a0", [(0, [1], [2], 1.0, "x")], group="A"),
        trajectory_factory("a1", [(0, [1], [2], 0.0, "x")], group="A"),
        trajectory_factory("b0", [(0, [1], [2], 5.0, "x")], group="B"),
        trajectory_factory("b1", [(0, [1], [2], 5.0, "x")], group="B"),
    ]
    samples = build_samples(trajs, BatchConfig())
    adv = compute_advantages(collate(samples), samples, AlgoConfig(estimator="grpo")).advantages[:, 0]
    s = torch.tensor([1.0, 0.0]).std()
    assert torch.allclose(adv, torch.tensor([0.5 / s, -0.5 / s, 0.0, 0.0]), atol=1e-4)


def test_rloo_is_leave_one_out(trajectory_factory: Callable[..., Any]) -> None:
    samples, batch = _group(trajectory_factory, [3.0, 0.0, 0.0])
    adv = compute_advantages(batch, samples, AlgoConfig(estimator="rloo")).advantages[:, 0]
    # n/(n-1) * (r - mean) = r - mean(others)
    assert torch.allclose(adv, torch.tensor([3.0, -1.5, -1.5]), atol=1e-5)


def test_reinforce_pp_whitens_discounted_returns(trajectory_factory: Callable[..., Any]) -> None:
    samples, batch = _group(trajectory_factory, [1.0, -1.0])
    out = compute_advantages(batch, samples, AlgoConfig(estimator="reinforce_pp", gamma=1.0))
    # every valid token's return equals its sample's reward; whitening maps {1, 1, -1, -1} to +-1 (x std)
    assert torch.allclose(out.returns, torch.tensor([[1.0, 1.0], [-1.0, -1.0]]))
    assert out.advantages[0, 0] > 0 > out.advantages[1, 0]
    assert torch.allclose(out.advantages[0], out.advantages[0, 0].expand(2))


def test_gae_matches_hand_computed(trajectory_factory: Callable[..., Any]) -> None:
    samples, batch = _group(trajectory_factory, [1.0])
    batch.values = torch.tensor([[0.5, 0.25]])
    out = compute_advantages(batch, samples, AlgoConfig(estimator="gae", gamma=0.9, lam=0.8))
    # t=1: delta = 1 - 0.25 = 0.75; t=0: delta = 0 + 0.9*0.25 - 0.5 = -0.275, A0 = -0.275 + 0.9*0.8*0.75
    assert torch.allclose(out.returns, torch.tensor([[0.5 - 0.275 + 0.54, 1.0]]), atol=1e-5)
    raw = torch.tensor([-0.275 + 0.54, 0.75])
    whitened = (raw - raw.mean()) / raw.std()  # verl whitens GAE advantages over the batch
    assert torch.allclose(out.advantages[0], whitened, atol=1e-4)


def test_gae_needs_values(trajectory_factory: Callable[..., Any]) -> None:
    samples, batch = _group(trajectory_factory, [1.0])
    with pytest.raises(ValueError, match="value_head"):
        compute_advantages(batch, samples, AlgoConfig(estimator="gae"))


def test_unknown_estimator_lists_names() -> None:
    with pytest.raises(KeyError, match="grpo"):
        algos.get_estimator("nope")


def test_policy_loss_clips_and_reports() -> None:
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[1.5, 0.9]]))
    adv = torch.ones(1, 2)
    mask = torch.ones(1, 2)
    loss, metrics = algos.policy_loss(old, new, adv, mask, LossConfig(clip_ratio=0.2))
    # token 0: ratio 1.5 clipped to 1.2 -> -1.2; token 1: -0.9 -> mean -1.05
    assert loss.item() == pytest.approx(-1.05, abs=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)


def test_truncated_is_weights_and_mismatch() -> None:
    old = torch.log(torch.tensor([[0.5, 0.9, 0.2]]))
    rollout = torch.log(torch.tensor([[0.25, 0.9, 0.2]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    w = algos.truncated_is_weights(old, rollout, mask, cap=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, 1.0, 0.0]]))
    m = algos.logprob_mismatch(old, rollout, mask)
    assert m["mismatch/abs_logprob_diff"] == pytest.approx(torch.log(torch.tensor(2.0)).item() / 2, abs=1e-6)


# --- added for mutation testing (bench/results/2026-11-26-mutation-trainer.md) ------------------------------


def test_sample_count_must_match_the_batch(trajectory_factory: Callable[..., Any]) -> None:
    samples, batch = _group(trajectory_factory, [1.0, 0.0])
    with pytest.raises(ValueError, match="1 samples for a batch of 2"):
        compute_advantages(batch, samples[:1], AlgoConfig())
    with pytest.raises(ValueError, match="3 samples for a batch of 2"):
        compute_advantages(batch, [*samples, samples[0]], AlgoConfig())


def test_an_estimator_name_registers_once() -> None:
    before = dict(algos.ESTIMATORS)
    with pytest.raises(ValueError, match="already registered"):
        algos.register_estimator("grpo")(algos.rloo)
    assert before == dict(algos.ESTIMATORS)


def test_outcome_estimators_return_seat_returns_and_count_groups(
    trajectory_factory: Callable[..., Any],
) -> None:
    trajs = [
        trajectory_factory("a0", [(0, [1], [2, 3], 0.0, "x"), (0, [1], [2], 1.0, "y")], group="A"),
        trajectory_factory("a1", [(0, [1], [2], 0.0, "x")], group="A"),
        trajectory_factory("b0", [(0, [1], [2], 3.0, "x")], group="B"),
    ]
    samples = build_samples(trajs, BatchConfig())
    batch = collate(samples)
    for name in ("grpo", "rloo"):
        out = compute_advantages(batch, samples, AlgoConfig(estimator=name))
        # each sample's return is its seat's episode return on every valid token, 0 on padding
        assert out.returns.tolist() == [[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [3.0, 0.0]]
        counts = {k: v for k, v in out.metrics.items() if k in (f"adv/{name}_groups", "adv/episodes")}
        assert counts == {f"adv/{name}_groups": 2.0, "adv/episodes": 3.0}
        assert torch.all(out.advantages[batch.response_mask == 0] == 0)
    # GRPO by hand: group A returns 1 and 0 (mean 0.5, std 0.707): +-0.707 on its 4 answer tokens; B alone
    # keeps its return (verl: a one-episode group has mean 0, std 1): 3.0 on 1 token; no sample at zero
    out = compute_advantages(batch, samples, AlgoConfig(estimator="grpo"))
    assert out.metrics["adv/zero_fraction"] == 0.0
    assert out.metrics["adv/abs_mean"] == pytest.approx((4 * 0.5 / 0.5**0.5 + 3.0) / 5, rel=1e-5)


def test_zero_fraction_counts_the_samples_of_groups_whose_episodes_all_ended_alike(
    trajectory_factory: Callable[..., Any],
) -> None:
    """A group whose episodes all returned the same gives its samples no gradient: adv/zero_fraction is their
    share of the batch's samples (here group A's three of five), adv/abs_mean the mean over answer tokens."""
    trajs = [
        trajectory_factory("a0", [(0, [1], [2, 3], 0.0, "x"), (0, [1], [2], -1.0, "y")], group="A"),
        trajectory_factory("a1", [(0, [1], [2], -1.0, "x")], group="A"),
        trajectory_factory("b0", [(0, [1], [2], 1.0, "x")], group="B"),
        trajectory_factory("b1", [(0, [1], [2], 0.0, "x")], group="B"),
    ]
    samples = build_samples(trajs, BatchConfig())
    batch = collate(samples)
    out = compute_advantages(batch, samples, AlgoConfig(estimator="grpo"))
    assert out.metrics["adv/zero_fraction"] == pytest.approx(3 / 5)
    # group B: returns 1 and 0 -> +-0.707 on one token each; group A's four answer tokens at 0
    assert out.metrics["adv/abs_mean"] == pytest.approx(2 * 0.5 / 0.5**0.5 / 6, rel=1e-5)


def test_reinforce_pp_discounts_with_gamma(trajectory_factory: Callable[..., Any]) -> None:
    samples, batch = _group(trajectory_factory, [1.0, -2.0])
    out = compute_advantages(batch, samples, AlgoConfig(estimator="reinforce_pp", gamma=0.5))
    # the reward sits on the last of two tokens: returns [0.5 r, r]
    assert torch.allclose(out.returns, torch.tensor([[0.5, 1.0], [-1.0, -2.0]]))
    # whitening is an increasing affine map over the valid tokens: same order, mean 0
    order = out.returns.flatten().argsort()
    assert torch.equal(out.advantages.flatten().argsort(), order)
    assert abs(float(out.advantages.mean())) < 1e-5


def test_gae_with_default_config_is_the_undiscounted_return_minus_value(
    trajectory_factory: Callable[..., Any],
) -> None:
    samples, batch = _group(trajectory_factory, [1.0])
    batch.values = torch.tensor([[0.5, 0.25]])
    out = compute_advantages(batch, samples, AlgoConfig(estimator="gae"))  # gamma = lam = 1
    # rewards [0, 1]: returns [1, 1]; raw advantages return - value = [0.5, 0.75], then whitened
    assert torch.allclose(out.returns, torch.tensor([[1.0, 1.0]]))
    raw = torch.tensor([0.5, 0.75])
    assert torch.allclose(out.advantages[0], (raw - raw.mean()) / raw.std(), atol=1e-4)


def test_policy_loss_scales_each_token_by_its_is_weight() -> None:
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[1.5, 0.9]]))
    ones = torch.ones(1, 2)
    # token 0: -1.2 (clipped) x weight 2; token 1: -0.9 x weight 0 -> token-mean -1.2
    loss, _ = algos.policy_loss(old, new, ones, ones, LossConfig(), is_weights=torch.tensor([[2.0, 0.0]]))
    assert loss.item() == pytest.approx(-1.2, abs=1e-5)
    # "seq-mean-token-sum": the row's token losses summed (-1.2 - 0.9), then the mean over rows
    loss, _ = algos.policy_loss(old, new, ones, ones, LossConfig(loss_agg_mode="seq-mean-token-sum"))
    assert loss.item() == pytest.approx(-2.1, abs=1e-5)


def test_kl_value_and_agg_losses_by_hand() -> None:
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # k1 "kl": logp - ref = [0.5, -1.0] on the valid tokens, token-mean -0.25
    assert algos.kl_loss(logp, ref, mask, LossConfig(kl_type="kl")).item() == pytest.approx(-0.25)
    # k2 "mse": 0.5 * diff^2 = [0.125, 0.5], mean 0.3125
    assert algos.kl_loss(logp, ref, mask, LossConfig(kl_type="mse")).item() == pytest.approx(0.3125)
    assert algos.agg_loss(logp, mask, "token-mean").item() == pytest.approx(-1.5)
    # value loss: old values 0, returns 1, predictions [0.5, 0.1] with clip 0.2:
    # token 0: unclipped (0.5 - 1)^2 = 0.25, clipped (0.2 - 1)^2 = 0.64 -> max 0.64 (clipped)
    # token 1: (0.1 - 1)^2 = 0.81 both ways; loss 0.5 * mean(0.64, 0.81) = 0.3625, clip fraction 1/2
    vf, frac = algos.value_loss(
        torch.tensor([[0.5, 0.1, 9.0]]),
        torch.ones(1, 3),
        torch.zeros(1, 3),
        mask,
        LossConfig(cliprange_value=0.2),
    )
    assert vf.item() == pytest.approx(0.3625) and frac == pytest.approx(0.5)


def test_logprob_mismatch_metrics_by_hand() -> None:
    old = torch.tensor([[-1.0, -2.0, -5.0]])
    rollout = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    m = algos.logprob_mismatch(old, rollout, mask)
    # diff = [0.5, -1.0] on valid tokens; k3 = e^d - 1 - d
    k3 = (math.exp(0.5) - 1.5 + math.exp(-1.0) - 0.0) / 2
    assert m["mismatch/abs_logprob_diff"] == pytest.approx(0.75)
    assert m["mismatch/max_abs_logprob_diff"] == pytest.approx(1.0)
    assert m["mismatch/k3_kl"] == pytest.approx(k3, rel=1e-6)
    # one valid token: the means are over that one token
    one = algos.logprob_mismatch(old, rollout, torch.tensor([[0.0, 1.0, 0.0]]))
    assert one["mismatch/abs_logprob_diff"] == pytest.approx(1.0)
    assert one["mismatch/k3_kl"] == pytest.approx(math.exp(-1.0), rel=1e-6)
    # nothing valid: every metric 0 (no division by zero)
    none = algos.logprob_mismatch(old, rollout, torch.zeros(1, 3))
    assert none == {
        "mismatch/abs_logprob_diff": 0.0,
        "mismatch/max_abs_logprob_diff": 0.0,
        "mismatch/k3_kl": 0.0,
    }


def test_a_batch_larger_than_the_small_int_cache_is_accepted(trajectory_factory: Callable[..., Any]) -> None:
    # 300 samples: the sample/batch count check must compare numbers, not int objects
    samples, batch = _group(trajectory_factory, [float(i % 2) for i in range(300)])
    out = compute_advantages(batch, samples, AlgoConfig(estimator="rloo"))
    # rewards 0, 1, 0, 1, ...: r - mean(others) = 0 - 150/299 for a zero, 1 - 149/299 for a one
    assert out.advantages[0, 1].item() == pytest.approx(-150 / 299, abs=1e-5)
    assert out.advantages[1, 1].item() == pytest.approx(150 / 299, abs=1e-5)


def test_extreme_but_finite_mismatches_follow_the_formulas() -> None:
    # 19.5 nats either way is inside the +-20 numerical guard: the documented formulas hold exactly there
    old = torch.tensor([[-0.5, -20.0]])
    rollout = torch.tensor([[-20.0, -0.5]])
    # k3 of a +19.5 log-ratio: e^19.5 - 1 - 19.5 (not saturated)
    m = algos.logprob_mismatch(old, rollout, torch.tensor([[1.0, 0.0]]))
    assert m["mismatch/k3_kl"] == pytest.approx(math.exp(19.5) - 20.5, rel=1e-5)
    # truncated IS weight of a -19.5 log-ratio: min(e^-19.5, cap) = e^-19.5
    w = algos.truncated_is_weights(old, rollout, torch.ones(1, 2), cap=2.0)
    assert w[0, 1].item() == pytest.approx(math.exp(-19.5), rel=1e-5)
    assert w[0, 0].item() == 2.0
