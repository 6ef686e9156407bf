"""The inference service's published client side: GenerateBatch (many prompts in one call, results as they
finish) and PushWeights (new weights or a LoRA adapter for a running policy). Other services may import
this module, and no other of this service (``.importlinter``).

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

PushWeights: a trainer streams new weights, or a LoRA adapter, to a running inference service in one call,
with no shared filesystem and no files written on its side.

    from wolfpack_inference.client import push_adapter, push_weights
    await push_adapter(stub, "wolf", version=step, model=peft_model)            # LoRA: tensors + config
    await push_weights(stub, "wolf", version=step, tensors=model.state_dict())  # full or partial weights

Tensors travel as raw little-endian bytes in chunks of at most ``chunk_bytes`` (below gRPC's message limit),
with their dtype and shape; the server reassembles them, checks them, and answers with the new version
only once the policy serves it. torch and peft are imported lazily, inside the functions that need them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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


class BatchStream:
    """``generate_batch`` over one long-lived GenerateBatchStream call: each batch is a message of the
    stream, not a call of its own, so a caller that sends a batch per decision step (a rollout worker)
    pays gRPC's per-call work (the call's setup, headers, status and interceptors, on both ends) once
    instead of once per batch.

        stream = BatchStream(stub)
        async for item in stream.generate_batch(requests, timeout=60):   # as generate_batch
            ...
        await stream.aclose()

    ``generate_batch`` keeps the function's contract: one ``BatchItem`` per request (index within the
    batch) as each finishes, ``grpc.aio.AioRpcError`` for what fails the whole batch (the deadline as
    DEADLINE_EXCEEDED, the stream failing with its status). Leaving it early, or its deadline passing,
    aborts the batch's unfinished requests on the server. The call is opened at the first batch and again
    after it failed; batches in flight when it fails all raise its error."""

    def __init__(self, stub: pb_grpc.InferenceServiceAsyncStub) -> None:
        self.stub = stub
        self._call: _StreamCall | None = None

    def _open(self, size: int) -> _StreamCall:
        call = self._call
        if call is None or call.failed or call.next_index + size > _MAX_STREAM_INDEX:
            if call is not None:
                call.finish()  # a full stream ends once its batches are answered
            call = self._call = _StreamCall(self.stub)
        return call

    async def generate_batch(
        self,
        requests: pb.GenerateBatchRequest | Iterable[pb.GenerateRequest],
        *,
        timeout: float | None = None,
    ) -> AsyncIterator[BatchItem]:
        message = pb.GenerateBatchStreamRequest(batch=batch_request(requests))
        size = len(message.batch.requests)
        if not size:
            raise _rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "GenerateBatch takes at least one request")
        call = self._open(size)
        base = call.next_index
        call.next_index += size
        box: asyncio.Queue[BatchItem | BaseException] = asyncio.Queue()
        for i in range(base, base + size):
            call.owners[i] = box
        call.send(message)
        timer = None
        if timeout is not None:
            expired = _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            timer = asyncio.get_running_loop().call_later(timeout, box.put_nowait, expired)
        left = size
        try:
            while left:
                got = await box.get()
                if isinstance(got, BaseException):
                    raise got
                left -= 1
                yield BatchItem(got.index - base, got.response, got.code, got.message)
        finally:
            if timer is not None:
                timer.cancel()
            if left:
                owners = call.owners
                for i in range(base, base + size):
                    if owners.get(i) is box:
                        del owners[i]
                if not call.failed:
                    call.send(pb.GenerateBatchStreamRequest(cancel=[base]))

    async def aclose(self) -> None:
        """End the call (the batches still waiting raise CANCELLED)."""
        call, self._call = self._call, None
        if call is not None:
            await call.cancel()


_MAX_STREAM_INDEX = 2**31 - 1
"""Requests one GenerateBatchStream numbers at most (``GenerateBatchResult.index`` is an int32)."""


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class _StreamCall:
    """One GenerateBatchStream call: its request queue, the reader that hands each result to the batch
    that owns its number (``owners``), and the numbering."""

    def __init__(self, stub: pb_grpc.InferenceServiceAsyncStub) -> None:
        self.queue: asyncio.Queue[pb.GenerateBatchStreamRequest | None] = asyncio.Queue()
        self.owners: dict[int, asyncio.Queue[BatchItem | BaseException]] = {}
        self.next_index = 0
        self.failed = False
        self.call = stub.GenerateBatchStream(self._requests())
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _requests(self) -> AsyncIterator[pb.GenerateBatchStreamRequest]:
        while (message := await self.queue.get()) is not None:
            yield message

    def send(self, message: pb.GenerateBatchStreamRequest) -> None:
        self.queue.put_nowait(message)

    def finish(self) -> None:
        """Close the request side: the call ends once every batch sent is answered."""
        self.queue.put_nowait(None)

    async def _read(self) -> None:
        error: BaseException | None = None
        try:
            async for msg in self.call:
                owners = self.owners
                for r in msg.results:
                    box = owners.pop(r.index, None)
                    if box is None:  # a batch that stopped waiting
                        continue
                    if r.HasField("response"):
                        box.put_nowait(BatchItem(r.index, r.response))
                    else:
                        box.put_nowait(BatchItem(r.index, None, code_of(r.error), r.error.message))
        except grpc.aio.AioRpcError as exc:
            error = exc
        except asyncio.CancelledError:
            error = _rpc_error(grpc.StatusCode.CANCELLED, "the batch stream was closed")
            raise
        finally:
            self.failed = True
            if self.owners:  # the call ended with batches still waiting: each raises why
                why = error or _rpc_error(grpc.StatusCode.UNAVAILABLE, "the batch stream ended early")
                for box in set(self.owners.values()):
                    box.put_nowait(why)
                self.owners.clear()

    async def cancel(self) -> None:
        self.call.cancel()
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.reader


# --- PushWeights ---------------------------------------------------------------------------------------


CHUNK_BYTES = 1 << 20
"""1 MiB per message: far below gRPC's default 4 MiB limit, large enough that framing costs nothing."""


def tensor_chunks(
    policy_id: str,
    version: int,
    tensors: Mapping[str, Any],
    *,
    is_adapter: bool = False,
    adapter_config_json: str = "",
    chunk_bytes: int = CHUNK_BYTES,
) -> Iterator[pb.PushWeightsRequest]:
    """PushWeights messages for ``tensors`` (name → torch tensor, any device and dtype). The first message
    carries the policy, version, ``is_adapter`` and the adapter config; every message names its tensor."""
    import torch

    if sys.byteorder != "little":  # the wire format is little-endian raw bytes
        raise RuntimeError("PushWeights needs a little-endian host")
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be > 0")
    first = True
    for name, t in tensors.items():
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        raw = memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")
        dtype = str(t.dtype).removeprefix("torch.")
        for offset in range(0, max(len(raw), 1), chunk_bytes):
            msg = pb.PushWeightsRequest(
                name=name, dtype=dtype, shape=list(t.shape), data=bytes(raw[offset : offset + chunk_bytes]),
                offset=offset,
            )  # fmt: skip
            if first:
                msg.policy_id, msg.version, msg.is_adapter = policy_id, version, is_adapter
                msg.adapter_config_json = adapter_config_json
                first = False
            yield msg


def peft_adapter(model: Any, adapter_name: str = "default") -> tuple[dict[str, Any], str]:
    """The adapter state dict (PEFT keys, adapter name removed) and config JSON of a peft ``PeftModel``:
    exactly what ``save_pretrained`` would write as ``adapter_model.safetensors`` and ``adapter_config.json``."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model, adapter_name=adapter_name, save_embedding_layers=False)
    cfg = model.peft_config[adapter_name].to_dict()
    text = json.dumps(cfg, sort_keys=True, default=lambda o: sorted(o) if isinstance(o, set) else str(o))
    return dict(state), text


async def push_weights(
    stub: pb_grpc.InferenceServiceAsyncStub,
    policy_id: str,
    version: int,
    tensors: Mapping[str, Any],
    *,
    chunk_bytes: int = CHUNK_BYTES,
    timeout: float | None = None,
) -> pb.PushWeightsResponse:
    """Push a full or partial state dict; ``version`` must exceed the policy's current one."""
    chunks = tensor_chunks(policy_id, version, tensors, chunk_bytes=chunk_bytes)
    return await stub.PushWeights(chunks, timeout=timeout)


async def push_adapter(
    stub: pb_grpc.InferenceServiceAsyncStub,
    policy_id: str,
    version: int,
    model: Any,
    *,
    adapter_name: str = "default",
    chunk_bytes: int = CHUNK_BYTES,
    timeout: float | None = None,
) -> pb.PushWeightsResponse:
    """Push the LoRA ``adapter_name`` of peft ``model`` (tensors and config) as ``version`` of ``policy_id``;
    the server applies it to the policy's base weights."""
    state, config_json = peft_adapter(model, adapter_name)
    chunks = tensor_chunks(
        policy_id, version, state, is_adapter=True, adapter_config_json=config_json, chunk_bytes=chunk_bytes
    )
    return await stub.PushWeights(chunks, timeout=timeout)
