"""The CPU learner really updates a real (tiny) model: logprobs match a fresh forward, an update with
positive advantages raises the sampled tokens' logprobs, and checkpoints round-trip exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from wolfpack_inference.models import tiny_model
from wolfpack_trainer.batch import Sample, collate
from wolfpack_trainer.learners import LearnerConfig, LossConfig, get_learner
from wolfpack_trainer.learners.base import TrainBatch


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model(tmp_path_factory.mktemp("models")))


def _batch() -> TrainBatch:
    samples = [
        Sample(
            prompt=[5, 6, 7, 8][: 2 + i % 3],
            response=[10 + i, 20 + i, 30 + i],
            response_mask=[1, 1, 1],
            logprobs=[-1.0] * 3,
            rewards=[0.0, 0.0, 1.0],
            uid="g",
            trajectory_id=f"t{i}",
            episode_uid="e",
            policy_id="p",
            role="r",
            seat=0,
            policy_version=0,
            turn_index=0,
        )
        for i in range(4)
    ]
    batch = collate(samples)
    batch.advantages = torch.ones_like(batch.response_mask)
    return batch


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_update_raises_logprobs_of_positive_advantage_tokens(model_dir: str, lora_rank: int) -> None:
    cfg = LearnerConfig(model=model_dir, lr=1e-2 if lora_rank else 1e-3, lora_rank=lora_rank, micro_batch_size=2,
                        loss=LossConfig(kl_coef=0.1 if lora_rank else 0.0))  # fmt: skip
    learner = get_learner("cpu")(cfg)
    batch = _batch()
    before = learner.compute_log_probs(batch)
    batch.old_log_probs = before
    if lora_rank:
        batch.ref_log_prob = learner.compute_ref_log_probs(batch)
        assert batch.ref_log_prob is not None and torch.allclose(batch.ref_log_prob, before, atol=1e-5)
    metrics = learner.update(batch)
    after = learner.compute_log_probs(batch)
    assert learner.step == 1
    assert (after - before)[batch.response_mask > 0].mean() > 0
    assert metrics["actor/grad_norm"] > 0 and "actor/entropy" in metrics and "actor/pg_clipfrac" in metrics
    exported = learner.export_weights()
    assert exported.is_adapter == bool(lora_rank)
    if lora_rank:
        assert all("lora_" in k for k in exported.tensors) and '"r": 4' in exported.adapter_config_json


def test_logprobs_do_not_depend_on_padding(model_dir: str) -> None:
    learner = get_learner("cpu")(LearnerConfig(model=model_dir, micro_batch_size=1))
    batch = _batch()
    alone = [learner.compute_log_probs(batch.select([i])) for i in range(len(batch))]
    together = learner.compute_log_probs(batch)
    for i, lp in enumerate(alone):
        n = int(batch.select([i]).response_mask.sum())
        assert torch.allclose(lp[0, :n], together[i, :n], atol=1e-5)


def test_checkpoint_round_trip_is_exact(model_dir: str, tmp_path: Path) -> None:
    cfg = LearnerConfig(model=model_dir, lr=1e-3, value_head=True)
    a = get_learner("cpu")(cfg)
    batch = _batch()
    batch.old_log_probs = a.compute_log_probs(batch)
    a.update(batch)
    a.save(tmp_path / "ckpt")
    b = get_learner("cpu")(cfg)
    b.load(tmp_path / "ckpt")
    assert b.step == 1
    assert torch.equal(a.compute_log_probs(batch), b.compute_log_probs(batch))
    va, vb = a.compute_values(batch), b.compute_values(batch)
    assert va is not None and vb is not None and torch.equal(va, vb)
    # the optimiser state came back too: one more identical update keeps them identical
    for learner in (a, b):
        batch.old_log_probs = learner.compute_log_probs(batch)
        learner.update(batch)
    assert torch.equal(a.compute_log_probs(batch), b.compute_log_probs(batch))


def test_unknown_learner_lists_names() -> None:
    with pytest.raises(KeyError, match="cpu"):
        get_learner("nope")
