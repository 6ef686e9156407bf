"""What the ``verl_fsdp`` learner's ``extra.gradient_checkpointing`` and ``extra.reshard_after_forward`` do on
the padded (no padding removal) path: real updates through verl's FSDP2 engine on the CPU, a tiny random Qwen2
in float32, each compared with the same update without the switch.

Why (bench/results/2026-11-27-learner-microbatch-cpu.md): the GPU recipes run micro-batches of 8 because the
activations of every decoder layer, kept for the backward, and the full-vocabulary logits fill the card beside
vLLM; gradient checkpointing is the switch that lets them run larger ones. And each micro-batch pays a fixed
cost, part of it FSDP2 gathering and freeing every layer's parameters around each forward even on one GPU,
which ``reshard_after_forward: false`` skips. Oracles for "it is on": what autograd keeps for the backward
(``saved_tensors_hooks``), whether the layers' parameters stay gathered after a forward; for "it changes
nothing": the weights after the update.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl.workers.engine_workers", reason="verl (trainer extra) is not installed")

import torch

from wolfpack_inference.models import tiny_model
from wolfpack_trainer.learners.base import LearnerConfig, LossConfig, TrainBatch, get_learner
from wolfpack_trainer.learners.synthetic import random_batch

P, R, N = 48, 8, 4
FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def batch_of(vocab: int) -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    return random_batch(torch.full((N,), P), torch.full((N,), R), (P, R), vocab, g, draw=("advantages",))


def update_keeping(
    model_dir: Path, extra: dict[str, Any], gathered: list[bool] | None = None
) -> tuple[dict[str, torch.Tensor], int, int]:
    """One actor update (2 micro-batches of 2 rows): the weights after it, and the bytes autograd kept
    for the backward in tensors of the vocabulary's width (logits) and in all others (activations).
    ``gathered`` gets, per FSDP2 unit, whether its parameters were still gathered after the log-prob pass."""
    cfg = LearnerConfig(
        model=str(model_dir), lr=1e-3, mini_batch_size=N, micro_batch_size=2, ppo_epochs=1, device="cpu",
        loss=LossConfig(clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=0.01),
        extra={"strategy": "fsdp2", "mixed_precision": FP32, **extra},
    )  # fmt: skip
    learner: Any = get_learner("verl_fsdp")(cfg)
    vocab = int(learner.engine.module.config.vocab_size)
    batch = batch_of(vocab)
    batch.old_log_probs = learner.compute_log_probs(batch)
    if gathered is not None:
        gathered += _gathered(learner)
    seen: set[int] = set()
    held: list[torch.Tensor] = []
    kept = {"vocab": 0, "other": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t.values() if t.is_nested else t
        try:
            storage = base.untyped_storage()
            key, size = storage._cdata, storage.nbytes()  # the storage itself, not its address: FSDP2 frees
            # gathered parameters by resizing their storage, so an address can come back in another tensor
        except RuntimeError:  # tensor subclasses without a plain storage
            key, size = id(base), base.numel() * base.element_size()
        if key not in seen:  # held (below): no storage is freed and its key reused within the update
            seen.add(key)
            held.append(base)
            kept["vocab" if base.dim() and base.shape[-1] == vocab else "other"] += size
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        learner.update(batch)
    after = {k: v.float().clone() for k, v in learner.export_weights().tensors.items()}
    return after, kept["vocab"], kept["other"]


def test_gradient_checkpointing_keeps_less_and_trains_the_same(tmp_path: Path) -> None:
    model_dir = tiny_model(tmp_path, layers=4)
    plain, vocab_plain, other_plain = update_keeping(model_dir, {})
    ckpt, vocab_ckpt, other_ckpt = update_keeping(model_dir, {"gradient_checkpointing": True})
    # the decoder layers' activations are recomputed in the backward instead of kept
    assert other_ckpt < 0.4 * other_plain, (other_ckpt, other_plain)
    assert vocab_ckpt == vocab_plain  # the logits part is not what it changes
    start = _initial(model_dir)
    step = max((plain[k] - start[k].float()).abs().max().item() for k in plain if k in start)
    diff = max((plain[k] - ckpt[k]).abs().max().item() for k in plain)
    assert step > 1e-4 and diff < 1e-3 * step, (diff, step)


def _initial(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def _gathered(learner: Any) -> list[bool]:
    from torch.distributed.fsdp import FSDPModule

    out = []
    for module in learner.engine.module.modules():
        group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
        if group is not None:
            out += [p.sharded_state.name == "UNSHARDED" for p in group.fsdp_params]
    return out


def test_reshard_after_forward_off_keeps_layers_gathered_and_trains_the_same(tmp_path: Path) -> None:
    model_dir = tiny_model(tmp_path, layers=4)
    default: list[bool] = []
    kept: list[bool] = []
    plain, _, _ = update_keeping(model_dir, {}, default)
    off, _, _ = update_keeping(model_dir, {"reshard_after_forward": False}, kept)
    assert default and not any(default)  # verl's default: every layer freed after its forward
    assert kept and all(kept)  # off: still gathered, the next forward (and the backward) skips gathering
    assert max((plain[k] - off[k]).abs().max().item() for k in plain) == 0.0


def test_state_loads_and_reads_while_layers_are_gathered(tmp_path: Path) -> None:
    """With ``reshard_after_forward`` off a forward-only pass leaves the layers gathered; restoring a state
    then (resume, the benches' rounds) must still land in the weights the next forward uses (in float32
    compute the gathered parameters are plain tensors the load cannot copy into)."""
    model_dir = tiny_model(tmp_path, layers=2)
    cfg = LearnerConfig(
        model=str(model_dir), lr=1e-2, mini_batch_size=N, micro_batch_size=2, ppo_epochs=1, device="cpu",
        loss=LossConfig(clip_ratio=0.2, loss_agg_mode="token-mean"),
        extra={"strategy": "fsdp2", "mixed_precision": FP32, "reshard_after_forward": False},
    )  # fmt: skip
    learner: Any = get_learner("verl_fsdp")(cfg)
    batch = batch_of(int(learner.engine.module.config.vocab_size))
    batch.old_log_probs = learner.compute_log_probs(batch)
    start = learner.state_dict()
    learner.update(batch)
    moved = learner.compute_log_probs(batch)
    assert all(_gathered(learner))
    learner.load_state_dict(start)
    again = learner.compute_log_probs(batch)
    assert (moved - batch.old_log_probs).abs().max() > 0.1
    assert torch.equal(again, batch.old_log_probs)
