"""The ``verl_fsdp`` learner with ``extra.fused_kernels`` (verl's fused-kernel forward, torch backend) on CPU:
FSDP2 on gloo, tiny random Qwen2, float32 compute.

Why it matters: on an H100 the 12-player recipe ran out of memory at micro-batch 16 (the full-vocabulary
logits of every prompt token are kept for the backward), and the learner is bound by its fixed cost per
micro-batch, so fewer, larger micro-batches are the lever. The fused forward computes log-probs and entropy
from the last hidden states in blocks and keeps no logits. These tests hold it to the plain path's numbers.

Oracles: a plain transformers forward for the log-probs; the same learner without fused kernels, from the same
weights, for the update (weights, losses, entropy, KL); the class's own forward for every other model of the
class in the process (verl installs its forward on the class; ``workers._per_model_fused_forward``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl.workers.engine_workers", reason="verl (trainer extra) is not installed")

import torch

from wolfpack_inference.models import tiny_model
from wolfpack_trainer.learners.base import LearnerConfig, LossConfig, TrainBatch, get_learner
from wolfpack_trainer.learners.synthetic import random_batch

P, R = 24, 8
FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("models"))


def make(model_dir: Path, fused: bool) -> Any:
    """Policy with a KL reference (a second engine, full fine-tuning), entropy bonus, micro-batches of 2."""
    cfg = LearnerConfig(
        model=str(model_dir), lr=1e-3, mini_batch_size=8, micro_batch_size=2, ppo_epochs=1, device="cpu",
        loss=LossConfig(clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=0.01, kl_coef=0.05),
        extra={"strategy": "fsdp2", "mixed_precision": FP32, "infer_micro_batch_size": 4, "fused_kernels": fused},
    )  # fmt: skip
    return get_learner("verl_fsdp")(cfg)


@pytest.fixture(scope="module")
def pair(model_dir: Path) -> Iterator[tuple[Any, Any]]:
    yield make(model_dir, True), make(model_dir, False)


def batch_for(learner: Any, n: int = 8, seed: int = 0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    vocab = int(learner.engine.module.config.vocab_size)
    return random_batch(
        torch.randint(2, P + 1, (n,), generator=g), torch.randint(1, R + 1, (n,), generator=g), (P, R), vocab, g,
        uids=[f"g{i % 2}" for i in range(n)], draw=("advantages",),
    )  # fmt: skip


def hf_logprobs(model_dir: Path, batch: TrainBatch) -> tuple[torch.Tensor, Any]:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        )
    logits = out.logits[:, P - 1 : -1].float()
    picked = torch.log_softmax(logits, -1).gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1)
    return picked * batch.response_mask, out


def actor_weights(learner: Any) -> dict[str, torch.Tensor]:
    return {k: v.float().clone() for k, v in learner.export_weights().tensors.items()}


def test_the_fused_forward_is_bound_to_the_learners_model_only(
    pair: tuple[Any, Any], model_dir: Path, tmp_path: Path
) -> None:
    """The policy's model runs verl's fused forward; a model of the same class loaded afterwards in the same
    process (the reference of another learner, the transformers inference backend) still returns logits.
    The policy's log-probs are those of its weights as they are now (another test may have trained it), the
    reference's those of the initial model."""
    fused, plain = pair
    module = fused.engine.module
    assert getattr(module, "forward").__func__.__name__ == "forward_with_torch_backend"  # noqa: B009
    assert "forward" not in vars(plain.engine.module)
    batch = batch_for(fused)
    now, out = hf_logprobs(fused.save_pretrained(tmp_path / "now"), batch)
    assert out.logits is not None and out.logits.shape[-1] == module.config.vocab_size
    assert (fused.compute_log_probs(batch) - now).abs().max().item() < 1e-4
    initial, _ = hf_logprobs(model_dir, batch)
    assert (fused.compute_ref_log_probs(batch) - initial).abs().max().item() < 1e-4


def prepared(learner: Any, seed: int) -> TrainBatch:
    batch = batch_for(learner, seed=seed)
    batch.old_log_probs = (
        learner.compute_log_probs(batch) - 0.05 * batch.response_mask
    )  # ratios off 1: clipping
    batch.ref_log_prob = learner.compute_ref_log_probs(batch)
    return batch


def test_an_update_with_fused_kernels_is_the_plain_update(pair: tuple[Any, Any]) -> None:
    """From the same weights and Adam moments, a PPO step (clipped loss, entropy bonus, low-variance KL to the
    reference) lands on the same weights with and without fused kernels, up to float rounding; a step on
    other advantages lands far away (the bound bites). The moments come from one update first: Adam's first
    step moves every weight by ~lr whatever the sign of a gradient of 1e-9, which turns rounding into lr-sized
    gaps. (The snapshot is taken before any update too: it must not change the update that follows.)"""
    fused, plain = pair
    fused.state_dict()
    fused.update(prepared(fused, seed=1))
    state = fused.state_dict()
    plain.load_state_dict(state)
    start = actor_weights(fused)
    assert all(torch.equal(start[k], v) for k, v in actor_weights(plain).items())

    batch, twin = prepared(fused, seed=2), prepared(plain, seed=2)
    assert torch.allclose(batch.old_log_probs, twin.old_log_probs, atol=1e-5)
    assert torch.allclose(batch.ref_log_prob, twin.ref_log_prob, atol=1e-5)
    on, off = fused.update(batch), plain.update(batch)
    after_on, after_off = actor_weights(fused), actor_weights(plain)

    fused.load_state_dict(state)
    batch.advantages = -batch.advantages
    fused.update(batch)
    after_other = actor_weights(fused)

    def gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
        return max((a[k] - b[k]).abs().max().item() for k in a)

    moved = gap(after_on, start)
    assert moved > 1e-4, moved
    # Adam divides by the root of the second moment, which lifts rounding in tiny gradient components to
    # ~1e-3 of the step; a real difference (the other advantages) is of the step's own size
    assert gap(after_on, after_off) < 5e-3 * moved, (gap(after_on, after_off), moved)
    assert gap(after_on, after_other) > 0.5 * moved, (gap(after_on, after_other), moved)
    assert on["actor/kl_loss"] > 0  # the reference is the initial policy, one update behind
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm"):
        assert on[key] == pytest.approx(off[key], rel=1e-4, abs=1e-6), key


def test_a_snapshot_before_the_first_update_leaves_the_update_alone(model_dir: Path) -> None:
    """``state_dict`` on a learner that has not stepped yet: torch's optimizer-state gather steps an empty
    optimizer once with zero gradients, after which the first real update came out at ~0.74x its size."""
    a, b = make(model_dir, False), make(model_dir, False)
    batch = prepared(a, seed=3)
    snapshot = a.state_dict()
    assert snapshot["optimizer"] is None
    a.update(batch)
    b.update(batch)
    wa, wb = actor_weights(a), actor_weights(b)
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-6


def test_lora_runs_the_fused_forward_through_peft(model_dir: Path) -> None:
    """The recipes that need it train LoRA: peft wraps the model after verl bound the fused forward, and the
    adapter-off pass (the KL reference) goes through it as well. A fresh adapter is zero, so both equal the
    base's log-probs; after an update the policy moves and the reference does not."""
    cfg = LearnerConfig(
        model=str(model_dir), lr=1e-2, mini_batch_size=8, micro_batch_size=4, device="cpu", lora_rank=8,
        lora_alpha=16, loss=LossConfig(clip_ratio=0.2, loss_agg_mode="token-mean", kl_coef=0.05),
        extra={"strategy": "fsdp2", "fused_kernels": True},
    )  # fmt: skip
    learner = get_learner("verl_fsdp")(cfg)
    batch = batch_for(learner, seed=4)
    ref, _ = hf_logprobs(model_dir, batch)
    assert (learner.compute_log_probs(batch) - ref).abs().max().item() < 1e-4
    batch.old_log_probs = learner.compute_log_probs(batch)
    batch.ref_log_prob = learner.compute_ref_log_probs(batch)
    assert (batch.ref_log_prob - ref).abs().max().item() < 1e-4
    metrics = learner.update(batch)
    assert metrics["actor/grad_norm"] > 0
    assert (learner.compute_log_probs(batch) - ref).abs().max().item() > 1e-3
    assert (learner.compute_ref_log_probs(batch) - ref).abs().max().item() < 1e-4
