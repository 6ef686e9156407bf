"""GenerateBatch over real gRPC on the tiny Qwen2: same results as Generate, streamed as each request
finishes, per-request errors, per-request versions, cancellation and deadlines reaching the backend."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from wolfpack import rpc, telemetry
from wolfpack.errors import code_of
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import inference_service_pb2 as pb
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc
from wolfpack_inference import server as server_module
from wolfpack_inference.backends.base import Backend, Request, Result, StreamChunk
from wolfpack_inference.backends.transformers_backend import TransformersBackend
from wolfpack_inference.client import BatchItem, generate_batch, generate_batch_ordered
from wolfpack_inference.policies import Policy, PolicyRegistry, build_backend
from wolfpack_inference.server import InferenceServicer, register

from .conftest import tiny_config  # type: ignore[import-not-found]
from .test_errors import tokens  # type: ignore[import-not-found]
from .test_generate import PROMPTS, chat  # type: ignore[import-not-found]


def assert_same(single: pb.GenerateResponse, batched: pb.GenerateResponse) -> None:
    """Everything but float rounding equal: batching pads rows, which moves logprobs by ~1e-6."""
    assert list(batched.prompt_token_ids) == list(single.prompt_token_ids)
    assert batched.policy == single.policy and batched.usage == single.usage
    assert len(batched.completions) == len(single.completions)
    for s, b in zip(single.completions, batched.completions, strict=True):
        assert list(b.token_ids) == list(s.token_ids) and b.text == s.text
        assert b.finish_reason == s.finish_reason
        assert len(b.logprobs) == len(s.logprobs) == len(s.token_ids)
        assert max(abs(x - y) for x, y in zip(s.logprobs, b.logprobs, strict=True)) < 1e-4


async def test_batch_equals_individual_generates(stub: pb_grpc.InferenceServiceStub) -> None:
    reqs = [
        chat(p, max_tokens=m, temperature=0, logprobs=True)
        for p, m in zip(PROMPTS, [12, 3, 8, 5], strict=True)
    ]
    reqs.append(tokens([5, 6, 7, 8], "strict", max_tokens=6, logprobs=True))
    reqs.append(chat(PROMPTS[1], max_tokens=6, temperature=1.0, seed=11, n=3, logprobs=True))  # seeded n > 1
    singles = [await stub.Generate(r) for r in reqs]
    items = await generate_batch_ordered(stub, reqs, timeout=60)
    assert [i.index for i in items] == list(range(len(reqs)))
    for single, item in zip(singles, items, strict=True):
        assert item.ok and item.code == grpc.StatusCode.OK and item.response is not None
        assert_same(single, item.response)


async def test_results_stream_as_they_finish(stub: pb_grpc.InferenceServiceStub, watched: Watched) -> None:
    """A 2-token request comes back before the 60-token ones it was sent with, in a message of its own,
    while they still decode. It runs on another policy (another engine); the 60-token rows are held at a
    decode step until it has arrived, so the order does not depend on how fast either engine runs."""
    reqs = [tokens([5, 6, 7], "watched", max_tokens=60) for _ in range(3)]
    reqs.insert(2, tokens([5, 6, 7], "strict", max_tokens=2))
    with StepGate(watched) as gate:
        call = stub.GenerateBatch(pb.GenerateBatchRequest(requests=reqs), timeout=60)
        messages = [[r.index for r in (await call.read()).results]]
        await gate.reached()
        assert not watched.ended, "the long rows are still decoding"
        gate.open()
        messages += [[r.index for r in m.results] async for m in call]
    assert messages[0] == [2], messages
    assert sorted(i for m in messages for i in m) == [0, 1, 2, 3]


async def test_bad_items_fail_alone(stub: pb_grpc.InferenceServiceStub) -> None:
    good = chat(PROMPTS[0], max_tokens=6, temperature=0, logprobs=True)
    reqs = [
        good,
        chat("hi", "nope", max_tokens=4),  # unknown policy
        chat("hi", max_tokens=-3),  # bad sampling
        pb.GenerateRequest(policy_id="tiny", sampling=common_pb2.SamplingParams(max_tokens=4)),  # no prompt
        tokens([5] * 600, max_tokens=4),  # rejected by the backend, not by validation
        chat(PROMPTS[2], "strict", max_tokens=5, temperature=0, logprobs=True),
    ]
    items = await generate_batch_ordered(stub, reqs, timeout=60)
    errors = {i.index: (i.code, i.message) for i in items if not i.ok}
    assert errors.keys() == {1, 2, 3, 4}
    assert errors[1][0] == grpc.StatusCode.NOT_FOUND and "unknown policy 'nope'" in errors[1][1]
    assert errors[2][0] == grpc.StatusCode.INVALID_ARGUMENT and "max_tokens" in errors[2][1]
    assert errors[3][0] == grpc.StatusCode.INVALID_ARGUMENT and "prompt is empty" in errors[3][1]
    assert errors[4][0] == grpc.StatusCode.INVALID_ARGUMENT and "512 positions" in errors[4][1]
    for i in (0, 5):
        response = items[i].response
        assert response is not None
        assert_same(await stub.Generate(reqs[i]), response)


async def test_rejected_items_come_first(stub: pb_grpc.InferenceServiceStub) -> None:
    reqs = [tokens([5, 6], "strict", max_tokens=4), chat("hi", "nope", max_tokens=4)]
    call = stub.GenerateBatch(pb.GenerateBatchRequest(requests=reqs), timeout=60)
    messages = [m async for m in call]
    assert [[(r.index, r.HasField("response"), code_of(r.error)) for r in m.results] for m in messages] == [
        [(1, False, grpc.StatusCode.NOT_FOUND)],
        [(0, True, grpc.StatusCode.OK)],
    ]
    assert "nope" in messages[0].results[0].error.message  # a google.rpc.Status: code and message


async def test_same_tick_results_share_a_message(stub: pb_grpc.InferenceServiceStub) -> None:
    """Requests the backend rejects on admission all end in the same event-loop tick: one message."""
    reqs = [tokens([5] * 600, max_tokens=4) for _ in range(3)]
    call = stub.GenerateBatch(pb.GenerateBatchRequest(requests=reqs), timeout=60)
    messages = [[(r.index, code_of(r.error)) for r in m.results] async for m in call]
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert messages == [[(0, invalid), (1, invalid), (2, invalid)]]


async def test_large_results_are_split_into_messages(
    stub: pb_grpc.InferenceServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message is sent once its results reach the size limit (here: 1 byte, so one result each)."""
    monkeypatch.setattr(server_module, "_MESSAGE_BYTES", 1)
    reqs = [tokens([5, 6, i], max_tokens=3) for i in range(4)]
    call = stub.GenerateBatch(pb.GenerateBatchRequest(requests=reqs), timeout=60)
    messages = [[r.index for r in m.results if r.HasField("response")] async for m in call]
    assert all(len(m) == 1 for m in messages) and sorted(i for m in messages for i in m) == [0, 1, 2, 3]


@pytest.mark.parametrize("size", [0, 4097])
async def test_empty_or_oversized_batch_is_invalid(stub: pb_grpc.InferenceServiceStub, size: int) -> None:
    reqs = [tokens([5], "strict", max_tokens=1)] * size
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await generate_batch_ordered(stub, reqs, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"got {size}" in (err.value.details() or "")


async def test_version_switch_mid_batch(
    stub: pb_grpc.InferenceServiceStub, watched: Watched, tiny_v2_dir: Path
) -> None:
    """Weights change after the first result arrived, while the others still decode: each request of that
    batch finishes on the version that admitted it, with that version's tokens; the next batch runs on the
    new one. (The first request runs on another policy, so it ends first.)"""

    def batch() -> list[pb.GenerateRequest]:
        long = [chat(p, "watched", max_tokens=200, temperature=0, logprobs=True) for p in PROMPTS[1:]]
        return [chat(PROMPTS[0], "strict", max_tokens=2, temperature=0, logprobs=True), *long]

    old = await asyncio.gather(*[stub.Generate(r) for r in batch()])
    watched.ended.clear()
    seen: list[BatchItem] = []
    with StepGate(watched) as gate:  # the long rows wait at a decode step until the switch is done
        async for item in generate_batch(stub, batch(), timeout=60):
            if not seen:
                await gate.reached()
                await stub.LoadPolicy(
                    pb.LoadPolicyRequest(policy_id="watched", version=1, model_path=str(tiny_v2_dir))
                )
                assert not watched.ended, "the long rows are still decoding at the switch"
                gate.open()
            seen.append(item)
    assert seen[0].index == 0 and sorted(i.index for i in seen) == [0, 1, 2, 3]
    assert sorted(watched.ended.values()) == ["finished"] * 3
    for item in seen:
        assert item.response is not None and item.response.policy.version == 0
        assert_same(old[item.index], item.response)
    after = await generate_batch_ordered(stub, batch(), timeout=60)
    new = await asyncio.gather(*[stub.Generate(r) for r in batch()])
    assert all(list(n.completions[0].token_ids) != list(o.completions[0].token_ids)
               for n, o in zip(new[1:], old[1:], strict=True))  # fmt: skip
    for item, single in zip(after, new, strict=True):
        assert item.response is not None
        assert item.response.policy.version == (1 if item.index else 0)
        assert_same(single, item.response)


class Watched(Backend):
    """The real transformers backend, plus a record of how each request's ``generate`` ended: lets a test
    see that the server cancelled the backend calls (what then stops the decoding rows)."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name, self.model, self.max_positions = inner.name, inner.model, inner.max_positions
        self.started: set[str] = set()
        self.ended: dict[str, str] = {}

    @property
    def tokenizer(self) -> object:
        return self.inner.tokenizer

    @property  # type: ignore[override]
    def version(self) -> int:
        return self.inner.version

    async def generate(self, request: Request) -> Result:
        self.started.add(request.request_id or str(id(request)))
        try:
            result = await self.inner.generate(request)
        except asyncio.CancelledError:
            self.ended[request.request_id or str(id(request))] = "cancelled"
            raise
        self.ended[request.request_id or str(id(request))] = "finished"
        return result

    async def load(self, version: int, model_path: str = "", adapter_path: str = "") -> None:
        await self.inner.load(version, model_path, adapter_path)

    def stream(self, request: Request) -> AsyncIterator[StreamChunk]:
        return self.inner.stream(request)

    async def close(self) -> None:
        await self.inner.close()


class StepGate:
    """Holds the decode thread of ``watched``'s current model at the start of its first decode step until
    the test opens the gate: the requests on that model cannot finish before then, on any machine. What
    the tests used to get from timing (a 2-token request "surely" ends before 60-token ones, a switch
    "surely" lands before 200 tokens are decoded) they get from this explicit order instead. Requests
    arriving meanwhile wait in the batcher's inbox (already bound to their weights) and join afterwards.
    The thread waits at most ``HOLD_S``: a test that fails before opening must not hang the batcher."""

    HOLD_S = 120.0  # far beyond any test here; only bounds a failed test's leftover thread

    def __init__(self, backend: Watched) -> None:
        assert isinstance(backend.inner, TransformersBackend)
        self._model: Any = backend.inner.torch_model
        self._reached = threading.Event()
        self._opened = threading.Event()
        self._handle: Any = None

    def __enter__(self) -> StepGate:
        self._handle = self._model.register_forward_pre_hook(self._hold, with_kwargs=True)
        return self

    def __exit__(self, *_: object) -> None:
        self.open()
        self._handle.remove()

    def _hold(self, _module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        if kwargs["input_ids"].shape[1] != 1 or self._opened.is_set():
            return  # prefills pass: only decode steps are held
        self._reached.set()
        self._opened.wait(self.HOLD_S)

    async def reached(self) -> None:
        """Wait (bounded: ``HOLD_S``) until the decode thread is held at the gate."""
        assert await asyncio.to_thread(self._reached.wait, self.HOLD_S), "no decode step reached the gate"

    def open(self) -> None:
        self._opened.set()


@pytest.fixture
def watched(registry: PolicyRegistry, tiny_dir: Path, tmp_path: Path) -> Watched:
    cfg = tiny_config("watched", tiny_dir, compress=False, ignore_eos=True)
    backend = Watched(build_backend(cfg, tmp_path))
    registry.add(Policy(cfg, backend))
    return backend


def long_batch() -> pb.GenerateBatchRequest:
    """One 1-token request (on its own policy, so it ends first) and three 480-token ones (EOS ignored:
    about a second of decoding on CPU)."""
    batch = pb.GenerateBatchRequest()
    for i, m in enumerate([1, 480, 480, 480]):
        batch.requests.add(
            policy_id="strict" if i == 0 else "watched", tokens=pb.TokenPrompt(token_ids=[5, 6, 7]),
            sampling=common_pb2.SamplingParams(max_tokens=m), request_id=f"r{i}",
        )  # fmt: skip
    return batch


async def wait_for(cond: object, timeout: float = 60.0) -> None:
    """Bounded poll: what it waits for happens within milliseconds; the bound only turns a hang into a
    failure, so it is generous for a loaded machine."""
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_leaving_early_cancels_the_rest(stub: pb_grpc.InferenceServiceStub, watched: Watched) -> None:
    with StepGate(watched):  # the long rows cannot finish before the client leaves
        async with contextlib.aclosing(generate_batch(stub, long_batch(), timeout=60)) as items:
            async for item in items:
                assert item.index == 0 and item.ok
                break
        await wait_for(lambda: len(watched.ended) == 3)
        assert watched.ended == {"r1": "cancelled", "r2": "cancelled", "r3": "cancelled"}
    after = await stub.Generate(tokens([5, 6], "watched", max_tokens=3))  # the batcher still serves
    assert len(after.completions[0].token_ids) == 3


async def test_deadline_cancels_the_batch(stub: pb_grpc.InferenceServiceStub, watched: Watched) -> None:
    """The held rows cannot finish, so the deadline passes with them in the backend whatever the machine's
    speed. 3 s: ample for the server to hand four requests to their backends (milliseconds); checked."""
    with StepGate(watched):
        call = asyncio.ensure_future(generate_batch_ordered(stub, long_batch(), timeout=3.0))
        await wait_for(lambda: len(watched.started) == 3 or call.done())
        assert watched.started == {"r1", "r2", "r3"}, "every request reached its backend before the deadline"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await wait_for(lambda: len(watched.ended) == 3)
        assert watched.ended == {"r1": "cancelled", "r2": "cancelled", "r3": "cancelled"}


@pytest.fixture
async def traced_stub(
    registry: PolicyRegistry,
) -> AsyncIterator[tuple[pb_grpc.InferenceServiceStub, InMemorySpanExporter]]:
    """Server and channel built after tracing is set up, as services do at startup: their interceptors
    then carry the trace context on streaming calls too."""
    exporter = InMemorySpanExporter()
    telemetry.setup_telemetry("inference", exporter=exporter)
    settings = load_settings(rpc_timeout_s=60)
    servicer = InferenceServicer(registry)
    server = await rpc.start_server("inference", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    async with rpc.channel(f"127.0.0.1:{server.port}", settings) as channel:
        yield pb_grpc.InferenceServiceStub(channel), exporter
    await server.stop(0)


@pytest.mark.tracing_sdk
async def test_one_span_per_request(
    traced_stub: tuple[pb_grpc.InferenceServiceStub, InMemorySpanExporter],
) -> None:
    stub, exporter = traced_stub
    reqs = [chat(PROMPTS[0], max_tokens=4, temperature=0), chat("x", "nope", max_tokens=4),
            tokens([5, 6], "strict", max_tokens=3)]  # fmt: skip
    with telemetry.tracer("test").start_as_current_span("rollout-step") as parent:
        items = await generate_batch_ordered(stub, reqs, timeout=60)
    spans = {s.attributes["wolfpack.batch.index"]: s for s in exporter.get_finished_spans()
             if s.attributes and "wolfpack.batch.index" in s.attributes}  # fmt: skip
    assert set(spans) == {0, 2}  # the rejected request never reached a policy
    assert spans[0].name == "chat tiny" and spans[2].name == "text_completion strict"
    for i, span in spans.items():
        response = items[i].response
        assert response is not None and span.attributes is not None
        assert span.context is not None and span.context.trace_id == parent.get_span_context().trace_id
        assert span.attributes["gen_ai.usage.output_tokens"] == response.usage.completion_tokens
        assert span.attributes["wolfpack.batch.size"] == 3
        assert span.attributes["wolfpack.policy.version"] == 0
