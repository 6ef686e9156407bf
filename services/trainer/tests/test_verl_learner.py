"""The ``verl_fsdp`` learner (verl 0.9.1's FSDP ``TrainingWorker``) on CPU: FSDP2 on gloo, tiny random Qwen2.

The same code runs on a GPU (bench/results/2026-11-26-gpu-trainer.md); here it runs through the CPU
platform the module gives verl. Oracles are independent of verl: a plain transformers forward for the
log-probs, the sign of the advantage for the direction of an update, and the saved weights for resume.
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

B, P, R = 8, 12, 10


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def learner(model_dir: Path) -> Iterator[Any]:
    cfg = LearnerConfig(
        model=str(model_dir), lr=5e-3, mini_batch_size=4, micro_batch_size=4, ppo_epochs=1, device="cpu",
        loss=LossConfig(clip_ratio=0.2, loss_agg_mode="token-mean"), extra={"strategy": "fsdp2"},
    )  # fmt: skip
    yield get_learner("verl_fsdp")(cfg)


def make_batch(vocab: int, seed: int = 0) -> TrainBatch:
    """Left-padded prompts, right-padded responses of random lengths, verl's layout."""
    g = torch.Generator().manual_seed(seed)
    plen = torch.randint(4, P + 1, (B,), generator=g)
    rlen = torch.randint(3, R + 1, (B,), generator=g)
    return random_batch(
        plen,
        rlen,
        (P, R),
        vocab,
        g,
        uids=[f"g{i // 4}" for i in range(B)],
        trajectory_ids=[f"t{i}" for i in range(B)],
    )


def hf_logprobs(model_dir: Path, batch: TrainBatch) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).logits[:, P - 1 : -1].float()  # fmt: skip
    return (
        torch.log_softmax(logits, -1).gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1)
        * batch.response_mask
    )


def test_log_probs_match_a_plain_transformers_forward(learner: Any, tmp_path: Path) -> None:
    vocab = int(learner.engine.module.config.vocab_size)
    batch = make_batch(vocab)
    ours = learner.compute_log_probs(batch)
    # the learner is shared by this module's tests (in random order): compare with its current weights
    ref = hf_logprobs(learner.save_pretrained(tmp_path / "now"), batch)
    assert ours.shape == (B, R)
    assert torch.all(ours[batch.response_mask == 0] == 0)
    # verl computes under bf16 autocast: the gap is bf16 rounding, far below the spread of random tokens
    gap = (ours - ref).abs().max().item()
    assert gap < 0.25, gap
    assert (ref * batch.response_mask).std().item() > 10 * gap / 4


def test_update_moves_logprobs_with_the_advantage_and_resumes_exactly(learner: Any, tmp_path: Path) -> None:
    vocab = int(learner.engine.module.config.vocab_size)
    batch = make_batch(vocab, seed=1)
    sign = torch.tensor([1.0, -1.0] * (B // 2))[:, None]
    batch.advantages = sign.expand(B, R) * batch.response_mask
    batch.old_log_probs = learner.compute_log_probs(batch)
    before = learner.export_weights().tensors
    step0 = learner.step
    metrics = learner.update(batch)
    assert learner.step == step0 + 1
    assert metrics["actor/optimizer_steps"] == B // 4
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/lr"):
        assert key in metrics and torch.isfinite(torch.tensor(metrics[key])), (key, metrics)
    after = learner.export_weights().tensors
    assert set(after) == set(before)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    new = learner.compute_log_probs(batch)
    mask = batch.response_mask
    delta = ((new - batch.old_log_probs) * mask).sum(-1) / mask.sum(-1)
    assert (delta[0::2].mean() > 0) and (delta[1::2].mean() < 0), delta  # up for +A, down for -A

    state = learner.state_dict()
    saved = {k: v.clone() for k, v in after.items()}
    batch.old_log_probs = new
    learner.update(batch)
    assert any(not torch.equal(saved[k], v) for k, v in learner.export_weights().tensors.items())
    learner.load_state_dict(state)
    assert learner.step == step0 + 1
    restored = learner.export_weights().tensors
    assert all(torch.equal(saved[k], restored[k]) for k in saved)


def test_save_pretrained_loads_in_transformers(learner: Any, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    out = learner.save_pretrained(tmp_path / "ckpt")
    model: Any = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    exported = learner.export_weights().tensors
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, exported[name].float()), name


def test_rank0_writes_the_same_weights_file_the_driver_would(learner: Any, tmp_path: Path) -> None:
    """``save_model`` (what a Ray worker group's rank 0 runs for ``save_pretrained`` on its own host) writes the
    tensors the driver's gather-and-write path writes, dropped keys left out; an in-process worker keeps the
    driver's path, and a rank 0 on another host (a cluster) is never asked to write."""
    from safetensors.torch import load_file

    out = learner.save_pretrained(tmp_path / "driver")
    host = learner.workers.call(
        "actor", "save_model", str(tmp_path / "rank0.safetensors"), ["lm_head.weight"]
    )
    assert host  # rank 0 answers with its host name
    driver, rank0 = load_file(str(out / "model.safetensors")), load_file(str(tmp_path / "rank0.safetensors"))
    assert "lm_head.weight" not in rank0 and set(driver) - {"lm_head.weight"} == set(rank0)
    assert all(torch.equal(driver[k], rank0[k]) for k in rank0)
    assert learner._rank0_on_this_host() is False  # in process: the weights are already here

    class Group:  # stand-in for a Ray worker group's call: only the host name matters here
        ray = True

        def __init__(self, host: str) -> None:
            self.host = host

        def call(self, name: str, method: str, *args: Any) -> str:
            assert (name, method) == ("actor", "hostname")
            return self.host

    import socket

    saved = learner.workers, learner._rank0_host
    try:
        for host, local in ((socket.gethostname(), True), ("gpu-node-7", False)):
            learner.workers, learner._rank0_host = Group(host), None
            assert learner._rank0_on_this_host() is local
    finally:
        learner.workers, learner._rank0_host = saved


def test_critic_learns_the_returns_and_resumes(model_dir: Path) -> None:
    """``value_head``: verl's critic (a value model on the same base, trained with verl's value loss). Its
    values move towards the returns over a few updates, and its weights are part of the checkpoint."""
    cfg = LearnerConfig(
        model=str(model_dir), lr=1e-3, mini_batch_size=8, micro_batch_size=8, device="cpu", value_head=True,
        loss=LossConfig(cliprange_value=10.0), extra={"strategy": "fsdp2", "critic_lr": 3e-2},
    )  # fmt: skip
    learner = get_learner("verl_fsdp")(cfg)
    assert "value_head" in learner.capabilities
    batch = make_batch(int(learner.engine.module.config.vocab_size), seed=4)
    mask = batch.response_mask
    target = torch.tensor([1.0, -1.0] * (B // 2))[:, None] * mask
    errors, metrics = [], {}
    for _ in range(4):
        values = learner.compute_values(batch)
        assert values is not None and values.shape == (B, R)
        assert torch.all(values[mask == 0] == 0)
        errors.append((((values - target) ** 2) * mask).sum().item() / mask.sum().item())
        batch.values, batch.returns = values, target
        batch.advantages = (target - values) * mask
        batch.old_log_probs = learner.compute_log_probs(batch)
        metrics = learner.update(batch)
    assert "critic/vf_loss" in metrics, sorted(metrics)
    assert errors[-1] < errors[0] * 0.7, errors
    state = learner.state_dict()
    assert "critic" in state
    before = learner.compute_values(batch)
    batch.values = before
    learner.update(batch)
    assert not torch.equal(learner.compute_values(batch), before)
    learner.load_state_dict(state)
    assert torch.allclose(learner.compute_values(batch), before)


def test_lora_trains_the_adapter_only_with_the_base_as_kl_reference(model_dir: Path, tmp_path: Path) -> None:
    """LoRA through verl's FSDP + peft path: the reference is the base with the adapter disabled (equal to a
    plain forward of the base before and after the update), versions leave as peft adapters that peft loads
    onto the base and that reproduce the learner's log-probs."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = LearnerConfig(
        model=str(model_dir), lr=5e-2, mini_batch_size=8, micro_batch_size=8, device="cpu", lora_rank=4,
        lora_alpha=8, loss=LossConfig(kl_coef=0.1, kl_type="low_var_kl"), extra={"strategy": "fsdp2"},
    )  # fmt: skip
    learner = get_learner("verl_fsdp")(cfg)
    batch = make_batch(int(learner.engine.module.config.vocab_size), seed=3)
    base = hf_logprobs(model_dir, batch)
    ref0 = learner.compute_ref_log_probs(batch)
    assert ref0 is not None and (ref0 - base).abs().max().item() < 0.25
    batch.old_log_probs = learner.compute_log_probs(batch)
    batch.ref_log_prob = ref0
    batch.advantages = torch.ones(B, R) * batch.response_mask
    for _ in range(2):  # lora_B starts at zero: the first step moves only B, the second changes the output
        metrics = learner.update(batch)
    assert "actor/kl_loss" in metrics
    exported = learner.export_weights()
    assert exported.is_adapter and exported.tensors
    # the adapter's own gather (lora_state) is the LoRA part of the full state, tensor for tensor
    full = {k.replace(".default.", "."): v for k, v in learner._full_state().items() if ".lora_" in k}
    assert set(full) == set(exported.tensors)
    assert all(torch.equal(full[k], exported.tensors[k]) for k in full)
    assert all(".lora_A." in k or ".lora_B." in k for k in exported.tensors), list(exported.tensors)[:4]
    assert '"r": 4' in exported.adapter_config_json
    assert torch.equal(learner.compute_ref_log_probs(batch), ref0)  # the base did not move
    new = learner.compute_log_probs(batch)
    assert not torch.equal(new, batch.old_log_probs)
    out = learner.save_pretrained(tmp_path / "adapter")
    model: Any = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), out
    )
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).logits[:, P - 1 : -1].float()  # fmt: skip
    peft_lp = (
        torch.log_softmax(logits, -1).gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1)
        * batch.response_mask
    )
    assert (peft_lp - new).abs().max().item() < 0.25
    assert (peft_lp - base).abs().max().item() > 1e-4  # the adapter is not a no-op


def test_kl_to_a_frozen_reference(model_dir: Path) -> None:
    """With ``kl_coef`` > 0 a forward-only copy of the initial weights gives the reference log-probs: they
    stay put while the actor moves, and the KL term shows up in the metrics."""
    cfg = LearnerConfig(
        model=str(model_dir), lr=5e-3, mini_batch_size=8, micro_batch_size=8, device="cpu",
        loss=LossConfig(kl_coef=0.1, kl_type="low_var_kl"), extra={"strategy": "fsdp2"},
    )  # fmt: skip
    learner = get_learner("verl_fsdp")(cfg)
    batch = make_batch(int(learner.engine.module.config.vocab_size), seed=2)
    ref0 = learner.compute_ref_log_probs(batch)
    assert ref0 is not None
    assert (ref0 - hf_logprobs(model_dir, batch)).abs().max().item() < 0.25
    batch.old_log_probs = learner.compute_log_probs(batch)
    batch.ref_log_prob = ref0
    batch.advantages = torch.ones(B, R) * batch.response_mask
    metrics = learner.update(batch)
    assert "actor/kl_loss" in metrics
    assert torch.equal(learner.compute_ref_log_probs(batch), ref0)
    assert not torch.equal(learner.compute_log_probs(batch), batch.old_log_probs)


def test_any_sample_count_trains_padding_rows_train_nothing(learner: Any) -> None:
    """An update's sample count is whatever the episodes produced: 7 samples with mini-batches of 4 are
    padded to 8 with a row that carries no mask, so the update runs two optimiser steps and the log-probs
    of the real rows come back unpadded."""
    batch = make_batch(int(learner.engine.module.config.vocab_size), seed=5).select(list(range(7)))
    padded = learner._padded(batch, 4)
    assert len(padded) == 8 and padded.response_mask[7].sum() == 0
    assert torch.equal(padded.response_mask[:7], batch.response_mask)
    logp = learner.compute_log_probs(batch)
    assert logp.shape == (7, R)
    batch.old_log_probs = logp
    batch.advantages = torch.ones(7, R) * batch.response_mask
    metrics = learner.update(batch)
    assert metrics["actor/optimizer_steps"] == 2
