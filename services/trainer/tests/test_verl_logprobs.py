"""The verl engine's log-prob kernel on our hosts: verl falls back to a per-row loop without flash-attn, and
``learners.verl.workers`` routes that fallback to block-wise log-sum-exp (same values, same gradients)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl", reason="verl (trainer extra) is not installed")

import verl.utils.torch_functional as verl_f

from wolfpack_trainer.learners.verl import workers


def reference(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_and_gradients_match_log_softmax(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "LOGPROB_CHUNK_ROWS", 7)  # several blocks and a ragged last one
    torch.manual_seed(0)
    logits = (torch.randn(50, 300) * 3).to(dtype).requires_grad_()
    labels = torch.randint(0, 300, (50,))
    got = workers.chunked_logprobs(logits, labels)
    want = reference(logits, labels)
    assert got.dtype == torch.float32 and got.shape == labels.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    (g_got,) = torch.autograd.grad(got.sum(), logits)
    (g_want,) = torch.autograd.grad(want.sum(), logits)
    torch.testing.assert_close(
        g_got.float(), g_want.float(), atol=1e-2 if dtype == torch.bfloat16 else 1e-6, rtol=0
    )


def test_batched_shape_is_kept() -> None:
    logits = torch.randn(3, 5, 40)
    labels = torch.randint(0, 40, (3, 5))
    torch.testing.assert_close(workers.chunked_logprobs(logits, labels), reference(logits, labels))


def test_the_engines_entry_point_uses_it() -> None:
    """What the FSDP engine calls (``logprobs_from_logits``) ends in the block-wise kernel where flash-attn's
    cross-entropy is missing (our hosts), not in verl's one-kernel-per-row loop."""
    if verl_f.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE:
        pytest.skip("flash-attn is installed: verl uses its fused cross-entropy, not the fallback")
    assert verl_f.logprobs_from_logits_v2 is workers.chunked_logprobs
    logits, labels = torch.randn(64, 100), torch.randint(0, 100, (64,))
    torch.testing.assert_close(verl_f.logprobs_from_logits(logits, labels), reference(logits, labels))


def test_backward_keeps_no_float32_copy_of_the_logits() -> None:
    """What autograd keeps between the forward and the backward: the bf16 logits themselves (one copy of
    ``rows x vocab`` at 2 bytes) and per-row scalars, no float32 block of the logits (4 bytes per entry:
    the largest thing a micro-batch held for its log-probs before)."""
    torch.manual_seed(0)
    rows, vocab = 40, 300
    logits = torch.randn(rows, vocab).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, vocab, (rows,))
    kept: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        got = workers.chunked_logprobs(logits, labels)
    vocab_sized = [t for t in kept if t.dim() and t.shape[-1] == vocab]
    assert vocab_sized and all(t.dtype == torch.bfloat16 for t in vocab_sized), [t.dtype for t in vocab_sized]
    assert sum(t.numel() for t in vocab_sized) == rows * vocab  # the logits, once
    (grad,) = torch.autograd.grad(got.sum(), logits)  # and the backward still runs from what was kept
    assert grad.dtype == torch.bfloat16 and grad.shape == logits.shape
