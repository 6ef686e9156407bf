"""The logprob convention of ``Turn.response_logprobs`` (trajectory.proto), honoured by the transformers
backend: ``log_softmax(logits / T)`` at each sampled token, T = 1 for greedy, before top-k/top-p, equal to
a teacher-forced forward pass over prompt + completion at the same temperature. Rows with different
temperatures and filters share one batch, so each row's own temperature must be the one applied."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from wolfpack_inference.backends.base import Request, Result, Sampling
from wolfpack_inference.backends.transformers_backend import TransformersBackend

PROMPT = [11, 42, 97, 310, 5, 77, 123]


def recomputed(model: torch.nn.Module, result: Result, temperature: float) -> list[torch.Tensor]:
    """Per completion: log_softmax(logits / T) of one forward pass, at the completion's tokens."""
    out = []
    for c in result.completions:
        with torch.no_grad():
            logits = model(torch.tensor([result.prompt_ids + c.token_ids])).logits.float()[0]
        logp = (logits / temperature).log_softmax(-1)
        start = len(result.prompt_ids) - 1
        out.append(torch.stack([logp[start + j, t] for j, t in enumerate(c.token_ids)]))
    return out


async def test_logprobs_are_log_softmax_at_the_request_temperature_before_truncation(tiny_dir: Path) -> None:
    backend = TransformersBackend(
        str(tiny_dir), device="cpu", dtype="float32", ignore_eos=True, batch_wait_ms=5
    )
    cases = {  # sampling -> the temperature of the convention
        Sampling(max_tokens=12, temperature=0.7, seed=1, logprobs=True): 0.7,
        Sampling(max_tokens=12, temperature=0.7, top_k=5, top_p=0.8, seed=2, n=2, logprobs=True): 0.7,
        Sampling(max_tokens=12, temperature=1.6, seed=3, logprobs=True): 1.6,
        Sampling(max_tokens=12, temperature=0.0, logprobs=True): 1.0,  # greedy: T = 1
    }
    try:
        # submitted together: one batch with four temperatures
        results = await asyncio.gather(*(backend.generate(Request(s, prompt_ids=PROMPT)) for s in cases))
        model = backend.torch_model
        for result, temperature in zip(results, cases.values(), strict=True):
            for c, ref in zip(result.completions, recomputed(model, result, temperature), strict=True):
                assert len(c.logprobs) == len(c.token_ids) == 12
                assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4), (
                    temperature,
                    c.logprobs,
                    ref,
                )
        # the check discriminates: at T = 0.7 the T = 1 quantity is a different number
        t1 = recomputed(model, results[0], 1.0)[0]
        assert (torch.tensor(results[0].completions[0].logprobs) - t1).abs().max() > 1e-2
    finally:
        await backend.close()
