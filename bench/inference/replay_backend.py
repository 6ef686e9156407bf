"""BENCH ONLY, not a product backend: answers every request at once with precomputed token ids and logprobs.

Why it exists: on a GPU the gRPC path's cost per call (request parsing, interceptors, ``Policy.prepare``,
building and serialising the response, the client) hides inside the engine's time, and is paid serially
when a synchronized batch starts and ends together. Replacing the engine with one that costs almost
nothing leaves only that per-call CPU, measured the same way on any machine: ``bench_inference.py
--backend replay`` runs the same batch in process (``backend.generate`` directly) and over gRPC, and the
difference per call is the service's own CPU.

What it keeps honest: responses have the real sizes (``max_tokens`` ids per completion, one logprob per
id when asked, ``n`` completions, the prompt echoed back), every call gets fresh lists like an engine's
result, and each call yields to the event loop once, as a real request waits for its batch.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

from wolfpack_inference.backends.base import (
    Backend,
    Completion,
    ErrorCode,
    Finish,
    InferenceError,
    Request,
    Result,
    StreamChunk,
    check_prompt_length,
)


class ReplayBackend(Backend):
    """Instant completions of ``max_tokens`` pseudo-random ids (EOS never hit), like ``ignore_eos``."""

    name = "replay"

    def __init__(self, vocab_size: int = 32000, max_positions: int = 32768, seed: int = 0) -> None:
        self.model = "replay (bench only)"
        self.max_positions = max_positions
        self.vocab_size = vocab_size
        rng = random.Random(seed)
        self._ids = [rng.randrange(3, vocab_size) for _ in range(max_positions)]
        self._logprobs = [-rng.random() * 4 for _ in range(max_positions)]

    async def generate(self, request: Request) -> Result:
        s = request.sampling
        check_prompt_length(len(request.prompt_ids), s.max_tokens, self.max_positions)
        await asyncio.sleep(0)
        completions = [
            Completion(
                token_ids=self._ids[: s.max_tokens],
                logprobs=self._logprobs[: s.max_tokens] if s.logprobs else [],
                text="",
                finish=Finish.LENGTH,
            )
            for _ in range(s.n)
        ]
        return Result(completions, self.version, list(request.prompt_ids), len(request.prompt_ids))

    async def stream(self, request: Request) -> AsyncIterator[StreamChunk]:
        if request.sampling.n != 1:
            raise InferenceError(ErrorCode.INVALID_ARGUMENT, "streaming supports n == 1 only")
        result = await self.generate(request)
        c = result.completions[0]
        yield StreamChunk(c.token_ids, c.logprobs, c.text, self.version, c.finish)
