"""Client side of GenerateBatch: many prompts in one call, results as they finish.

    from wolfpack_inference.client import generate_batch, generate_batch_ordered
    async for item in generate_batch(stub, requests, timeout=60):   # completion order
        if item.ok:
            use(item.index, item.response)
    items = await generate_batch_ordered(stub, requests, timeout=60)  # request order, all at once

Why a batch call: the service's per-call cost is mostly grpc.aio's own (~450 µs of CPU per unary call on
the dev CPU, see ``bench/results/2026-11-26-cpu-inference-service-path.md``), and a rollout worker that
sends a batch of N decisions as N calls pays it N times, serially, when the batch starts and again when it
ends. One GenerateBatch pays it once. Each request keeps its own policy, prompt and sampling, and one bad
request fails only its own item.

Deadlines: ``rpc.channel`` adds its default deadline to unary calls only, so pass ``timeout`` for the whole
batch. Leaving an iteration early (``break``, an exception) cancels the call, and the server then aborts the
requests still generating.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from wolfpack.errors import code_of
from wolfpack.v1 import inference_service_pb2 as pb

if TYPE_CHECKING:  # the async stub class exists only in the typed stubs
    from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc


@dataclass(frozen=True, slots=True)
class BatchItem:
    """The outcome of request ``index`` of a batch: ``response`` when it succeeded, else the status
    ``code`` (what Generate would have failed with) and ``message``."""

    index: int
    response: pb.GenerateResponse | None
    code: grpc.StatusCode = grpc.StatusCode.OK
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.response is not None


def batch_request(
    requests: pb.GenerateBatchRequest | Iterable[pb.GenerateRequest],
) -> pb.GenerateBatchRequest:
    """The GenerateBatchRequest for ``requests`` (taken as is when it already is one). Building the
    batch's requests in place (``batch.requests.add(...)``) saves copying each one into it."""
    if isinstance(requests, pb.GenerateBatchRequest):
        return requests
    return pb.GenerateBatchRequest(requests=requests)


async def generate_batch(
    stub: pb_grpc.InferenceServiceAsyncStub,
    requests: pb.GenerateBatchRequest | Iterable[pb.GenerateRequest],
    *,
    timeout: float | None = None,
) -> AsyncIterator[BatchItem]:
    """Yield one ``BatchItem`` per request, as each finishes (rejected requests first). Raises
    ``grpc.aio.AioRpcError`` only for what fails the whole call: an empty or oversized batch, the deadline,
    the service going away."""
    call = stub.GenerateBatch(batch_request(requests), timeout=timeout)
    try:
        async for msg in call:
            for r in msg.results:
                if r.HasField("response"):
                    yield BatchItem(r.index, r.response)
                else:
                    # a code this client does not know reads UNKNOWN: still an error, never OK
                    yield BatchItem(r.index, None, code_of(r.error), r.error.message)
    finally:
        call.cancel()  # no-op once the stream ended; stops the server's work when the caller left early


async def generate_batch_ordered(
    stub: pb_grpc.InferenceServiceAsyncStub,
    requests: pb.GenerateBatchRequest | Iterable[pb.GenerateRequest],
    *,
    timeout: float | None = None,
) -> list[BatchItem]:
    """Every request's ``BatchItem``, in request order, once the whole batch finished."""
    batch = batch_request(requests)
    out: list[BatchItem | None] = [None] * len(batch.requests)
    async for item in generate_batch(stub, batch, timeout=timeout):
        out[item.index] = item
    missing = [i for i, item in enumerate(out) if item is None]
    if missing:  # the server's contract is one result per index: say so rather than return holes
        raise RuntimeError(f"GenerateBatch ended without results for indexes {missing[:10]}")
    return [item for item in out if item is not None]
