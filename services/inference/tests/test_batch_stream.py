"""GenerateBatchStream over real gRPC on the tiny Qwen2: every batch of one call answered as GenerateBatch
answers it, numbered over the stream; batch-level errors, the stream's cap, cancellation and deadlines
reaching the backend; ``BatchStream`` (the client) keeping ``generate_batch``'s contract."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest

from wolfpack import rpc
from wolfpack.errors import code_of
from wolfpack.settings import load_settings
from wolfpack.v1 import inference_service_pb2 as pb
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc
from wolfpack_inference import server as server_module
from wolfpack_inference.client import BatchItem, BatchStream, generate_batch_ordered
from wolfpack_inference.policies import Policy, PolicyRegistry, build_backend
from wolfpack_inference.server import InferenceServicer, register

from .conftest import tiny_config  # type: ignore[import-not-found]
from .test_batch import (  # type: ignore[import-not-found]
    StepGate,
    Watched,
    assert_same,
    long_batch,
    wait_for,
)
from .test_errors import tokens  # type: ignore[import-not-found]
from .test_generate import PROMPTS, chat  # type: ignore[import-not-found]


@pytest.fixture
def held(registry: PolicyRegistry, tiny_dir: Path, tmp_path: Path) -> Watched:
    """A policy whose decode steps ``StepGate`` can hold (test_batch's ``watched``)."""
    cfg = tiny_config("watched", tiny_dir, compress=False, ignore_eos=True)
    backend = Watched(build_backend(cfg, tmp_path))
    registry.add(Policy(cfg, backend))
    return backend


async def _requests(
    messages: Sequence[pb.GenerateBatchStreamRequest],
) -> AsyncIterator[pb.GenerateBatchStreamRequest]:
    for m in messages:
        yield m


def _batch(reqs: Sequence[pb.GenerateRequest]) -> pb.GenerateBatchStreamRequest:
    return pb.GenerateBatchStreamRequest(batch=pb.GenerateBatchRequest(requests=reqs))


async def _collect(stream: BatchStream, reqs: Sequence[pb.GenerateRequest]) -> list[BatchItem]:
    items = [item async for item in stream.generate_batch(reqs, timeout=60)]
    assert sorted(i.index for i in items) == list(range(len(reqs))), "one item per request, batch indexes"
    return sorted(items, key=lambda i: i.index)


async def test_concurrent_batches_on_one_stream_equal_generate_batch(
    stub: pb_grpc.InferenceServiceStub,
) -> None:
    """Three batches in flight together on one stream (good, bad and token items) each get exactly what
    a GenerateBatch call of their own gets: the same responses, the same per-item errors."""
    batches = [
        [
            chat(p, max_tokens=m, temperature=0, logprobs=True)
            for p, m in zip(PROMPTS[:3], [6, 3, 5], strict=True)
        ],
        [chat("hi", "nope", max_tokens=4), tokens([5] * 600, max_tokens=4), chat("hi", max_tokens=-3)],
        [
            tokens([5, 6, 7, 8], "strict", max_tokens=6, logprobs=True),
            chat(PROMPTS[3], "strict", max_tokens=4),
        ],
    ]
    for batch in batches:
        for r in batch:
            r.sampling.temperature, r.sampling.logprobs = 0, True
    stream = BatchStream(stub)
    try:
        streamed = await asyncio.gather(*(_collect(stream, b) for b in batches))
    finally:
        await stream.aclose()
    for batch, got in zip(batches, streamed, strict=True):
        want = await generate_batch_ordered(stub, batch, timeout=60)
        for w, g in zip(want, got, strict=True):
            assert (g.code, g.message) == (w.code, w.message)
            if w.response is not None:
                assert g.response is not None
                assert_same(w.response, g.response)
    assert [i.code for i in streamed[1]] == [
        grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INVALID_ARGUMENT
    ]  # fmt: skip


async def test_numbering_batch_errors_and_the_stream_cap(
    stub: pb_grpc.InferenceServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Numbers run over the stream across batches (an empty batch takes none). A batch GenerateBatch would
    refuse as a whole (here over the character limit) and one past the stream's cap of unanswered requests
    have each request answered with that status; the batches around them are served; every number once."""
    monkeypatch.setattr(server_module, "MAX_BATCH_CHARS", 50)
    monkeypatch.setattr(server_module, "MAX_BATCH_ITEMS", 3)
    messages = [
        _batch([tokens([5, 6], "strict", max_tokens=2), tokens([5, 7], "strict", max_tokens=2)]),  # 0, 1
        pb.GenerateBatchStreamRequest(),  # empty: ignored
        _batch([chat("x" * 60, "strict", max_tokens=2)]),  # 2: over MAX_BATCH_CHARS
        _batch([tokens([5], "strict", max_tokens=2)] * 4),  # 3-6: more than the stream may hold
        _batch([tokens([6, 5], "strict", max_tokens=2)]),  # 7
    ]
    results: dict[int, pb.GenerateBatchResult] = {}
    async for msg in stub.GenerateBatchStream(_requests(messages), timeout=60):
        for r in msg.results:
            assert r.index not in results, "each number exactly once"
            results[r.index] = r
    assert sorted(results) == list(range(8))
    assert all(results[i].HasField("response") for i in (0, 1, 7))
    assert code_of(results[2].error) == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt characters" in results[2].error.message
    assert {code_of(results[i].error) for i in range(3, 7)} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert list(results[7].response.prompt_token_ids)[-2:] == [6, 5], "numbered in the order sent"


async def test_cancel_aborts_a_batch_on_the_server(stub: pb_grpc.InferenceServiceStub, held: Watched) -> None:
    """``cancel`` with a batch's first number aborts its unfinished requests in the backend and answers
    them CANCELLED; the request of it that had finished keeps its result, and the stream goes on."""
    queue: asyncio.Queue[pb.GenerateBatchStreamRequest | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[pb.GenerateBatchStreamRequest]:
        while (m := await queue.get()) is not None:
            yield m

    results: dict[int, pb.GenerateBatchResult] = {}
    with StepGate(held):
        call = stub.GenerateBatchStream(requests(), timeout=60)
        queue.put_nowait(pb.GenerateBatchStreamRequest(batch=long_batch()))  # numbers 0-3
        first = await call.read()
        assert [r.index for r in first.results] == [0], "the 1-token request ends first"
        await wait_for(lambda: len(held.started) == 3)
        queue.put_nowait(pb.GenerateBatchStreamRequest(cancel=[0]))
        while len(results) < 3:
            msg = await call.read()
            results.update((r.index, r) for r in msg.results)
    assert sorted(results) == [1, 2, 3]
    assert {code_of(r.error) for r in results.values()} == {grpc.StatusCode.CANCELLED}
    await wait_for(lambda: len(held.ended) == 3)
    assert held.ended == {"r1": "cancelled", "r2": "cancelled", "r3": "cancelled"}
    queue.put_nowait(_batch([tokens([5, 6], "strict", max_tokens=3)]))  # number 4
    msg = await call.read()
    assert [r.index for r in msg.results] == [4] and len(
        msg.results[0].response.completions[0].token_ids
    ) == 3
    queue.put_nowait(None)  # the caller's side closes: the call ends once all is answered
    assert await call.read() == grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK


async def test_client_deadline_and_leaving_early_abort_on_the_server(
    stub: pb_grpc.InferenceServiceStub, held: Watched
) -> None:
    """``BatchStream.generate_batch`` as ``generate_batch``: its deadline raises DEADLINE_EXCEEDED and
    leaving it early both cancel the batch's rows in the backend, and the same stream serves the next."""
    stream = BatchStream(stub)
    try:
        with StepGate(held):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in stream.generate_batch(long_batch(), timeout=3.0):
                    pass
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await wait_for(lambda: len(held.ended) == 3)
            assert held.ended == {"r1": "cancelled", "r2": "cancelled", "r3": "cancelled"}
            held.ended.clear()
            batch = long_batch()
            for i, r in enumerate(batch.requests):
                r.request_id = f"s{i}"
            async with contextlib.aclosing(stream.generate_batch(batch, timeout=60)) as items:
                async for item in items:
                    assert item.index == 0 and item.ok
                    break
            await wait_for(lambda: len(held.ended) == 3)
            assert held.ended == {"s1": "cancelled", "s2": "cancelled", "s3": "cancelled"}
        (after,) = await _collect(stream, [tokens([5, 6], "watched", max_tokens=3)])
        assert after.response is not None and len(after.response.completions[0].token_ids) == 3
    finally:
        await stream.aclose()


async def test_closing_fails_waiting_batches_and_the_next_opens_a_new_call(
    stub: pb_grpc.InferenceServiceStub, held: Watched
) -> None:
    stream = BatchStream(stub)
    with StepGate(held):
        waiting = asyncio.ensure_future(_collect(stream, long_batch().requests))
        await wait_for(lambda: len(held.started) == 3)
        await stream.aclose()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await waiting
        assert err.value.code() == grpc.StatusCode.CANCELLED
    await wait_for(lambda: len(held.ended) == 3)
    assert set(held.ended.values()) == {"cancelled"}, "the server cancelled the rows"
    (item,) = await _collect(stream, [tokens([5, 6], "strict", max_tokens=2)])
    assert item.ok
    await stream.aclose()
    with pytest.raises(grpc.aio.AioRpcError) as empty:
        async for _ in stream.generate_batch([], timeout=5):
            pass
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_an_undecodable_message_ends_the_stream_invalid_argument(registry: PolicyRegistry) -> None:
    """A message that is not a GenerateBatchStreamRequest ends the call INVALID_ARGUMENT (the batch before
    it was admitted), instead of gRPC's own UNKNOWN from a failed parse."""
    settings = load_settings(rpc_timeout_s=60)
    servicer = InferenceServicer(registry)
    server = await rpc.start_server("inference", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    try:
        async with rpc.channel(f"127.0.0.1:{server.port}", settings) as channel:
            raw = channel.stream_stream(
                "/wolfpack.v1.InferenceService/GenerateBatchStream",
                request_serializer=lambda b: b,
                response_deserializer=pb.GenerateBatchStreamResponse.FromString,
            )
            good = _batch([tokens([5, 6], "strict", max_tokens=2)]).SerializeToString()
            call = raw(_requests([good, b"\xff\xff\xff"]), timeout=60)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in call:
                    pass
    finally:
        await server.stop(0)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid message" in (err.value.details() or "")
