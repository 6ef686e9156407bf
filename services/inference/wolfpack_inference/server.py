"""gRPC adapter of the inference service: proto <-> ``PolicyRegistry`` (prompt logic in ``policies.py``
and ``prompts.py``, engines in ``backends/``). Start it with ``wolfpack serve inference``; the served
policies come from ``WOLFPACK_INFERENCE_*`` (see ``config.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import grpc
from opentelemetry import trace

from wolfpack import rpc, telemetry
from wolfpack.errors import ServiceError, make_status, to_status
from wolfpack.settings import Settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import inference_service_pb2 as pb
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc
from wolfpack_inference.backends import import_backends
from wolfpack_inference.backends.base import ErrorCode, Finish, InferenceError, Result, Sampling
from wolfpack_inference.policies import (
    CompressionNeeded,
    Policy,
    PolicyLoadError,
    PolicyRegistry,
    Prepared,
    TensorAssembler,
    make_sampling,
)
from wolfpack_inference.settings import InferenceSettings

SERVICE = "inference"
_FINISH = {Finish.LENGTH: common_pb2.FINISH_REASON_LENGTH, Finish.STOP: common_pb2.FINISH_REASON_STOP, Finish.ABORT: common_pb2.FINISH_REASON_ABORT}  # fmt: skip
_tracer = telemetry.tracer("wolfpack.inference")
_SAMPLING_CACHE_SIZE = 1024
log = logging.getLogger(__name__)

INLINE_COST = 16_384
"""Prompts cheaper than this (characters, plus ``MESSAGE_COST`` per chat message) are prepared on the
event loop: about 5 ms of rendering, less than what a thread hop would add for a common short turn. Anything
dearer, a whole GenerateBatch above it in total, and a chat whose compression would render and tokenize
more than ``policies.INLINE_COMPRESS_CHARS`` (up to ``prompts.MAX_RENDERS`` renders) is prepared in a
worker thread, so health and every other caller are answered while it renders."""
COMPRESSION_PASSES = 4
"""What a compressed prompt costs to prepare, in multiples of its ``_cost``: a token cut renders and
tokenizes the chat about four times (see ``policies.INLINE_COMPRESS_CHARS``). A cheap batch prepared
on the loop counts its compressed prompts so, and sends the rest to the thread once ``INLINE_COST`` is
spent."""
MESSAGE_COST = 64
"""What one chat message costs to render, in characters: the template's per-message work (~22 µs on the
dev CPU, about as much as tokenizing 64 characters). A chat of 4,000 two-character messages rendered in
~90 ms, which a character count alone called cheap."""
INLINE_PREPARE_S = 0.005
"""Event-loop time one GenerateBatch may spend preparing its cheap items inline, in order, before the
rest go to worker-thread slices (``PREPARE_SLICE_S``); each item is still cheap by ``INLINE_COST`` (a dear
one goes to a thread by itself), so the loop is held at most this plus one cheap item's preparation.

Why by time: with the prompt token cache, a compressed game prompt costs ~1 ms to prepare, not four
full passes; the character bound (``INLINE_COST`` over the whole batch, compressed items counted
``COMPRESSION_PASSES`` times) sent every item of a rollout's larger batches to threads (225 of 270
preparations at c=32 in the CPU rollout bench). A thread preparing beside the engine's thread pays the
hop and contends for the GIL; on the loop the same ids cost less CPU."""
INLINE_BY_TIME = True
"""``INLINE_PREPARE_S`` on (``bench/rollout/bench_rollout.py --baseline`` turns it off to compare: then a
batch is prepared inline only when its summed ``_cost`` is at most ``INLINE_COST``)."""
PREPARE_SLICE_S = 0.05
"""A large GenerateBatch is prepared in worker-thread slices of about this much CPU time each, admitted as
each slice ends: the executor's queue interleaves other callers' slices instead of holding them behind a
whole batch, and generation starts before the last item is rendered."""
MAX_BATCH_ITEMS = 4096
"""Most requests in one GenerateBatch: far above a rollout worker's batch (~100-300), low enough that one
call cannot queue unbounded work (split larger batches into several calls)."""
MAX_BATCH_MESSAGES = 65_536
"""Most chat messages in one GenerateBatch, over all its requests (a 256-seat rollout batch of 100-message
transcripts is 25,600). Without it the 64 MiB message limit let one call carry ~950 chats of 4,000 short
messages: minutes of rendering for one call."""
MAX_BATCH_CHARS = 16_000_000
"""Most prompt characters in one GenerateBatch, over all its chats (16 chats at ``MAX_PROMPT_CHARS``; a
256-seat batch of whole SmolLM2 contexts is ~8 million)."""
_MESSAGE_BYTES = 4 << 20
"""A GenerateBatchResponse is sent once its results reach this size, even when more finished in the same
tick: gRPC's default message limit, well below the configured one (64 MiB), so any client can read it."""


def policy_info(p: Policy) -> pb.PolicyInfo:
    return pb.PolicyInfo(
        policy=common_pb2.PolicyRef(policy_id=p.policy_id, version=p.version),
        base_model=p.backend.model, adapter=p.backend.adapter, backend=p.backend.name,
        context_budget=p.context_budget,
    )  # fmt: skip


def _span_attributes(policy: Policy, r: pb.GenerateRequest) -> tuple[str, dict[str, Any]]:
    """The GenAI operation name and span attributes of one generate request."""
    op = "chat" if r.WhichOneof("prompt") == "chat" else "text_completion"
    attrs = telemetry.gen_ai_attributes(
        operation=op, model=policy.backend.model, temperature=r.sampling.temperature,
        top_p=r.sampling.top_p or 1.0, max_tokens=r.sampling.max_tokens, policy_id=policy.policy_id,
    )  # fmt: skip
    attrs["wolfpack.request_id"] = r.request_id
    return op, attrs


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    def __init__(self, registry: PolicyRegistry, *, coalesce: bool = True) -> None:
        """``coalesce=False`` sends one GenerateBatch message per finished request instead of one per
        event-loop tick: only for the bench, to show what coalescing saves."""
        self.registry = registry
        self.coalesce = coalesce
        self._samplings: dict[bytes, Sampling] = {}

    def _sampling(self, s: common_pb2.SamplingParams) -> Sampling:
        """Validated ``Sampling`` for wire params, reused for identical params (a rollout sends the same
        ones with every request; ``Sampling`` is frozen, so sharing it is safe)."""
        key = s.SerializeToString(deterministic=True)
        sampling = self._samplings.get(key)
        if sampling is None:
            sampling = make_sampling(
                max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, stop=s.stop,
                seed=s.seed if s.HasField("seed") else None, n=s.n, logprobs=s.logprobs,
            )  # fmt: skip
            if len(self._samplings) >= _SAMPLING_CACHE_SIZE:  # per-request seeds: keep it bounded
                self._samplings.clear()
            self._samplings[key] = sampling
        return sampling

    def _prepare(self, r: pb.GenerateRequest, inline: bool = False) -> tuple[Policy, Prepared]:
        policy = self.registry.get(r.policy_id)
        sampling = self._sampling(r.sampling)
        if r.WhichOneof("prompt") == "chat":
            msgs = [{"role": m.role, "content": m.content, "name": m.name} for m in r.chat.messages]
            # the field has presence: unset leaves the choice to ``prepare`` (continuation or not)
            add_gen = r.chat.add_generation_prompt if r.chat.HasField("add_generation_prompt") else None
            return policy, policy.prepare(sampling, messages=msgs, add_generation_prompt=add_gen,
                                          request_id=r.request_id, inline=inline)  # fmt: skip
        # ``[:]`` is the quickest copy of a repeated field into a list (~30% faster than ``list()``)
        return policy, policy.prepare(sampling, token_ids=r.tokens.token_ids[:], request_id=r.request_id)

    async def _prepare_off_loop(self, r: pb.GenerateRequest, inline: bool = True) -> tuple[Policy, Prepared]:
        """``_prepare``, in a worker thread unless the prompt is cheap (``INLINE_COST``) and, if it needs
        compressing, its compression is too (``policies.INLINE_COMPRESS_CHARS``): rendering a long chat,
        and a compression that takes many renders (up to ``prompts.MAX_RENDERS``), must not stall every
        other caller's requests on the event loop. Cheap prompts (the common case, and the small model's
        per-turn compression of a game transcript) stay on the loop: a thread hop costs more than their
        render. ``inline=False``: straight to the thread."""
        if inline and _cost(r) <= INLINE_COST:
            try:
                return self._prepare(r, inline=True)
            except CompressionNeeded:
                pass
        return await asyncio.to_thread(self._prepare, r)

    def _prepare_slice(
        self, items: Sequence[pb.GenerateRequest], start: int
    ) -> list[tuple[Policy, Prepared] | InferenceError]:
        """Prepare ``items[start:]`` in a worker thread until ``PREPARE_SLICE_S`` has passed (at least
        one item); each outcome is the prepared request or the error that refused it."""
        out: list[tuple[Policy, Prepared] | InferenceError] = []
        until = time.perf_counter() + PREPARE_SLICE_S
        for i in range(start, len(items)):
            try:
                out.append(self._prepare(items[i]))
            except InferenceError as exc:
                out.append(exc)
            if time.perf_counter() >= until:
                break
        return out

    async def _prepared(
        self, items: Sequence[pb.GenerateRequest]
    ) -> AsyncIterator[tuple[int, tuple[Policy, Prepared] | InferenceError]]:
        """Each item's preparation, in order: on the loop for a cheap batch (as ``_prepare_off_loop``),
        in worker-thread slices otherwise, so a batch of many dear chats never holds the event loop.
        With ``INLINE_BY_TIME``: cheap items on the loop, in order, until ``INLINE_PREPARE_S`` is spent,
        the rest in worker-thread slices."""
        start = 0
        if INLINE_BY_TIME:
            until = time.perf_counter() + INLINE_PREPARE_S
            while start < len(items) and time.perf_counter() < until:
                try:
                    prepared = await self._prepare_off_loop(items[start])
                except InferenceError as exc:
                    yield start, exc
                else:
                    yield start, prepared
                start += 1
        elif sum(_cost(r) for r in items) <= INLINE_COST:
            left = INLINE_COST  # what the loop may still spend on this batch; a compression counts 4x
            for i, r in enumerate(items):
                try:
                    prepared = await self._prepare_off_loop(r, inline=left > 0)
                except InferenceError as exc:
                    yield i, exc
                    continue
                left -= _cost(r) * (COMPRESSION_PASSES if prepared[1].compressed else 1)
                yield i, prepared
            return
        while start < len(items):
            outcomes = await asyncio.to_thread(self._prepare_slice, items, start)
            for i, outcome in enumerate(outcomes, start):
                yield i, outcome
            start += len(outcomes)

    def _span(self, policy: Policy, r: pb.GenerateRequest) -> Any:
        """A span following the GenAI conventions, child of the caller's trace (the server interceptor
        made it current); a context yielding None when nobody collects spans."""
        # Building the GenAI attributes and entering a no-op span cost ~7 µs per call on the dev CPU,
        # paid for nothing when spans are not exported.
        if not telemetry.sdk_active():
            return contextlib.nullcontext()
        op, attrs = _span_attributes(policy, r)
        parent = telemetry.extract_from(r.trace) if r.trace.traceparent else None
        return _tracer.start_as_current_span(f"{op} {policy.policy_id}", context=parent, attributes=attrs)

    def _batch_span(self, policy: Policy, r: pb.GenerateRequest, index: int, size: int) -> Any:
        """The span of one request of a batch (only called when spans are recorded): the same name and
        attributes as Generate's, plus its place in the batch; a child of the request's own trace context
        when it carries one (its episode's turn), else of the call's. Ended when the request finishes,
        since the requests overlap in one handler."""
        op, attrs = _span_attributes(policy, r)
        attrs["wolfpack.batch.index"], attrs["wolfpack.batch.size"] = index, size
        parent = telemetry.extract_from(r.trace) if r.trace.traceparent else None
        return _tracer.start_span(f"{op} {policy.policy_id}", context=parent, attributes=attrs)

    async def Generate(self, request: pb.GenerateRequest, context: Any) -> pb.GenerateResponse:
        policy, prep = await self._prepare_off_loop(request)
        with self._span(policy, request) as span:
            result: Result = await policy.backend.generate(prep.request)
            if span is not None:
                span.set_attributes(_usage_attributes(result))
        resp = pb.GenerateResponse()
        _fill_response(resp, request, policy, prep, result)
        return resp

    async def GenerateBatch(
        self, request: pb.GenerateBatchRequest, context: Any
    ) -> AsyncIterator[pb.GenerateBatchResponse]:
        """Admit every request at once (in order, so each binds to the weights current at that moment),
        then send the results as they finish. A request that fails validation or in the backend becomes an
        error result for its index; the others run. Results finishing in the same event-loop tick (a batch
        that ends on one engine step) share one message: one write instead of one per request.

        Cleanup: the handler is cancelled when the client cancels or the deadline passes; ``finally`` then
        cancels the backend calls still running, which abort their rows (as a cancelled Generate does)."""
        items = request.requests
        _check_batch(items)
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        running: dict[asyncio.Task[Result], tuple[int, Policy, Prepared, Any]] = {}
        finished: list[asyncio.Task[Result]] = []
        ready = asyncio.Event()

        def on_done(task: asyncio.Task[Result]) -> None:
            finished.append(task)
            ready.set()

        spans = telemetry.sdk_active()
        msg = pb.GenerateBatchResponse()
        errors = 0
        try:
            async for i, outcome in self._prepared(items):
                if isinstance(outcome, InferenceError):
                    msg.results.add(index=i, error=_status(outcome))
                    errors += 1
                    continue
                policy, prep = outcome
                task = loop.create_task(policy.backend.generate(prep.request))
                task.add_done_callback(on_done)
                span = self._batch_span(policy, items[i], i, len(items)) if spans else None
                running[task] = (i, policy, prep, span)
            if msg.results:  # rejected requests are reported at once, before any generation ends
                yield msg
            while running:
                if not finished:
                    ready.clear()
                    await ready.wait()
                done = finished[:]
                finished.clear()
                msg, size = pb.GenerateBatchResponse(), 0
                for task in done:
                    i, policy, prep, span = running.pop(task)
                    result = msg.results.add(index=i)
                    failure = _outcome_error(task)
                    if failure is None:
                        generated = task.result()
                        _fill_response(result.response, items[i], policy, prep, generated)
                        size += _size_bound(generated)
                        if span is not None:
                            span.set_attributes(_usage_attributes(generated))
                    else:
                        result.error.CopyFrom(_status(failure))
                        errors += 1
                        if span is not None:
                            span.set_status(trace.Status(trace.StatusCode.ERROR, str(failure)))
                    if span is not None:
                        span.end()
                    if not self.coalesce:
                        yield msg
                        msg = pb.GenerateBatchResponse()
                        continue
                    if size >= _MESSAGE_BYTES:
                        yield msg
                        msg, size = pb.GenerateBatchResponse(), 0
                if msg.results:
                    yield msg
        finally:
            for task, (_, _, _, span) in running.items():  # cancelled or failed mid-stream
                if not task.done():
                    task.cancel()
                elif not task.cancelled():
                    task.exception()  # finished but never sent: retrieved, so asyncio does not log it
                if span is not None:
                    span.set_status(trace.Status(trace.StatusCode.ERROR, "cancelled"))
                    span.end()
            if log.isEnabledFor(logging.DEBUG):
                log.debug("rpc", extra={
                    "method": "GenerateBatch", "items": len(items), "errors": errors,
                    "unfinished": len(running), "ms": round((time.perf_counter() - started) * 1000, 2),
                })  # fmt: skip

    async def GenerateBatchStream(
        self, request_iterator: AsyncIterator[pb.GenerateBatchStreamRequest], context: Any
    ) -> AsyncIterator[pb.GenerateBatchStreamResponse]:
        """Every batch of the call runs through ``GenerateBatch`` itself, in a task of its own, as soon as
        it arrives; its results are renumbered over the stream (``base + index``) and the messages of
        every batch that finished since the last write go out as one. A batch ``GenerateBatch`` fails as a
        whole, or one that would leave more than ``MAX_BATCH_ITEMS`` requests unanswered on the stream,
        has each request it left unanswered answered with that status; a cancelled one, CANCELLED.

        Cleanup: when the call ends (the caller cancelled it, or closed its side and every batch was
        answered), the batches still running are cancelled, and each cancels its backend calls."""
        batches: dict[int, asyncio.Task[None]] = {}  # running, by the stream number of their first request
        ready: deque[pb.GenerateBatchResponse] = deque()  # renumbered, not yet sent
        wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        stream = {"open": 0, "input_done": False}  # requests admitted and unanswered; the caller's side
        failure: list[BaseException] = []

        async def run(batch: pb.GenerateBatchRequest, base: int) -> None:
            size = len(batch.requests)
            answered: set[int] = set()
            status: Any = None
            try:
                async for msg in self.GenerateBatch(batch, context):
                    for r in msg.results:
                        answered.add(r.index)
                        r.index += base
                    ready.append(msg)
                    wake.set()
            except asyncio.CancelledError:
                status = make_status(grpc.StatusCode.CANCELLED, "cancelled by the caller")
            except Exception as exc:  # what GenerateBatch would have ended its own call with
                if not isinstance(exc, ServiceError):
                    log.error("GenerateBatchStream batch failed", exc_info=exc)
                status = to_status(exc)
            finally:
                if status is not None and len(answered) < size:
                    ready.append(_answer_all(base, (i for i in range(size) if i not in answered), status))
                stream["open"] -= size
                del batches[base]
                wake.set()

        async def read() -> None:
            base = 0
            try:
                async for message in request_iterator:
                    for first in message.cancel:
                        task = batches.get(first)
                        if task is not None:
                            task.cancel()
                    size = len(message.batch.requests)
                    if not size:
                        continue
                    if stream["open"] + size > MAX_BATCH_ITEMS:
                        busy = make_status(
                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"GenerateBatchStream holds at most {MAX_BATCH_ITEMS} unanswered requests",
                        )
                        ready.append(_answer_all(base, range(size), busy))
                        wake.set()
                    else:
                        stream["open"] += size
                        batches[base] = loop.create_task(run(message.batch, base))
                    base += size
            except Exception as exc:  # an undecodable message: the call ends with its status
                failure.append(exc)
            finally:
                stream["input_done"] = True
                wake.set()

        reader = loop.create_task(read())
        try:
            while True:
                if ready:
                    out, size, many = pb.GenerateBatchStreamResponse(), 0, len(ready) > 1
                    while ready:
                        if many:  # several batches' messages in one write: keep it under the bound
                            grown = size + ready[0].ByteSize()
                            if size and grown > _MESSAGE_BYTES:
                                break
                            size = grown
                        out.results.extend(ready.popleft().results)
                    yield out
                    continue
                if failure:
                    raise failure[0]
                if stream["input_done"] and not batches:
                    return
                wake.clear()
                await wake.wait()
        finally:
            reader.cancel()
            for task in list(batches.values()):
                task.cancel()

    async def GenerateStream(
        self, request: pb.GenerateStreamRequest, context: Any
    ) -> AsyncIterator[pb.GenerateStreamResponse]:
        policy, prep = await self._prepare_off_loop(request.request)
        with self._span(policy, request.request):
            first = True
            async for ch in policy.backend.stream(prep.request):
                msg = pb.GenerateStreamResponse(
                    token_ids=ch.token_ids, logprobs=ch.logprobs, text=ch.text,
                    finish_reason=_FINISH[ch.finish] if ch.finish else common_pb2.FINISH_REASON_UNSPECIFIED,
                    policy=common_pb2.PolicyRef(policy_id=policy.policy_id, version=ch.version),
                )  # fmt: skip
                if first:
                    msg.prompt_token_ids.extend(prep.request.prompt_ids)
                    first = False
                yield msg

    async def ListPolicies(self, request: pb.ListPoliciesRequest, context: Any) -> pb.ListPoliciesResponse:
        if self.registry.unavailable:  # not "serves nothing": the caller learns why (see ``main``)
            raise InferenceError(ErrorCode.UNAVAILABLE, self.registry.unavailable)
        return pb.ListPoliciesResponse(policies=[policy_info(p) for p in self.registry.list()])

    async def LoadPolicy(self, request: pb.LoadPolicyRequest, context: Any) -> pb.LoadPolicyResponse:
        p = await self.registry.load(
            request.policy_id, request.version, request.model_path, request.adapter_path
        )
        return pb.LoadPolicyResponse(policy=policy_info(p))

    async def PushWeights(
        self, request_iterator: AsyncIterator[pb.PushWeightsRequest], context: Any
    ) -> pb.PushWeightsResponse:
        assembler, head = TensorAssembler(), None
        async for chunk in request_iterator:
            head = head or chunk
            assembler.add(chunk.name, chunk.dtype, chunk.shape, chunk.data, chunk.offset)
        if head is None:
            raise InferenceError(ErrorCode.INVALID_ARGUMENT, "no chunks received")
        tensors = await asyncio.to_thread(assembler.tensors)
        p = await self.registry.push(
            head.policy_id, head.version, tensors, head.is_adapter, head.adapter_config_json
        )
        return pb.PushWeightsResponse(policy=policy_info(p), tensors=len(tensors))


def _cost(r: pb.GenerateRequest) -> int:
    """What preparing ``r`` costs, in characters rendered (see ``INLINE_COST``): a chat's characters
    plus ``MESSAGE_COST`` per message; a token prompt is only copied and checked (~8 ids a character)."""
    if r.WhichOneof("prompt") == "chat":
        msgs = r.chat.messages
        return sum(len(m.content) for m in msgs) + MESSAGE_COST * len(msgs)
    return len(r.tokens.token_ids) // 8


def _check_batch(items: Sequence[pb.GenerateRequest]) -> None:
    """Refuse a GenerateBatch over ``MAX_BATCH_ITEMS``, ``MAX_BATCH_MESSAGES`` or ``MAX_BATCH_CHARS``
    before any work (messages are counted first: counting is O(1) per item, and bounds the character
    sum that follows)."""
    if not items or len(items) > MAX_BATCH_ITEMS:
        raise InferenceError(
            ErrorCode.INVALID_ARGUMENT,
            f"GenerateBatch takes 1 to {MAX_BATCH_ITEMS} requests, got {len(items)}",
        )
    chats = [r.chat.messages for r in items if r.WhichOneof("prompt") == "chat"]
    messages = sum(len(msgs) for msgs in chats)
    if messages > MAX_BATCH_MESSAGES:
        raise InferenceError(
            ErrorCode.INVALID_ARGUMENT,
            f"GenerateBatch takes at most {MAX_BATCH_MESSAGES} chat messages in all, got {messages}; "
            "split it into several calls",
        )
    chars = sum(len(m.content) for msgs in chats for m in msgs)
    if chars > MAX_BATCH_CHARS:
        raise InferenceError(
            ErrorCode.INVALID_ARGUMENT,
            f"GenerateBatch takes at most {MAX_BATCH_CHARS} prompt characters in all, got {chars}; "
            "split it into several calls",
        )


def _answer_all(base: int, indexes: Iterable[int], status: Any) -> pb.GenerateBatchResponse:
    """Results for ``indexes`` of the batch starting at stream number ``base``, each failed with ``status``."""
    msg = pb.GenerateBatchResponse()
    for i in indexes:
        msg.results.add(index=base + i, error=status)
    return msg


def _status(exc: InferenceError) -> Any:
    """``exc`` as the ``google.rpc.Status`` of one batch item: the code Generate would fail with."""
    return to_status(exc)


def _usage_attributes(result: Result) -> dict[str, Any]:
    return {
        "gen_ai.usage.input_tokens": result.prompt_tokens,
        "gen_ai.usage.output_tokens": sum(len(c.token_ids) for c in result.completions),
        "gen_ai.response.finish_reasons": [c.finish.value for c in result.completions],
        "wolfpack.policy.version": result.version,
    }


def _size_bound(result: Result) -> int:
    """An upper bound of the wire size of ``result``'s GenerateResponse (a varint id takes at most 5 bytes,
    a logprob 4, a character at most 4 in UTF-8, plus field overhead), for splitting batch messages. It
    costs ~0.3 µs where ``ByteSize()`` of a 256-token response costs ~6 µs."""
    size = 5 * len(result.prompt_ids) + 64
    for c in result.completions:
        size += 5 * len(c.token_ids) + 4 * len(c.logprobs) + 4 * len(c.text) + 32
    return size


def _outcome_error(task: asyncio.Task[Result]) -> InferenceError | None:
    """What made a finished backend call fail, as the error its batch item reports (None: it succeeded).
    Anything but an ``InferenceError`` is a bug: logged with its traceback, reported as INTERNAL, like
    the status a unary call would end with."""
    if task.cancelled():  # only the backend itself cancels it while the stream runs (shutting down)
        return InferenceError(ErrorCode.UNAVAILABLE, "generation was cancelled by the server")
    exc = task.exception()
    if exc is None or isinstance(exc, InferenceError):
        return exc
    log.error("GenerateBatch item failed", exc_info=exc)
    return InferenceError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")


def _fill_response(
    resp: pb.GenerateResponse, request: pb.GenerateRequest, policy: Policy, prep: Prepared, result: Result
) -> None:
    """Fill the empty ``resp`` (a new message, or a batch result's) for ``result``. Filling repeated fields from Python lists costs ~20 ns per
    element; a token prompt's ids are therefore copied from the request's own repeated field (one C-level
    copy, ~20x faster for 512 ids): they are exactly the ids the backend was given (token prompts are never
    rewritten, only rejected), which the length check confirms."""
    resp.prompt_compressed = prep.compressed
    resp.policy.policy_id, resp.policy.version = policy.policy_id, result.version
    completion_tokens = 0
    add = resp.completions.add
    for c in result.completions:
        add(token_ids=c.token_ids, logprobs=c.logprobs, text=c.text, finish_reason=_FINISH[c.finish])
        completion_tokens += len(c.token_ids)
    resp.usage.prompt_tokens, resp.usage.completion_tokens = result.prompt_tokens, completion_tokens
    if request.WhichOneof("prompt") == "tokens" and len(request.tokens.token_ids) == len(result.prompt_ids):
        resp.prompt_token_ids.extend(request.tokens.token_ids)
    else:
        resp.prompt_token_ids.extend(result.prompt_ids)


def register(server: grpc.aio.Server, servicer: InferenceServicer | None = None) -> Sequence[str]:
    """Add this service's servicers to ``server`` and return their full names."""
    if servicer is None:
        s = InferenceSettings()
        servicer = InferenceServicer(PolicyRegistry.from_configs(s.policies(), s.cache_dir))
    pb_grpc.add_InferenceServiceServicer_to_server(servicer, server)
    return [pb.DESCRIPTOR.services_by_name["InferenceService"].full_name]


def prepare() -> None:
    """What ``wolfpack up`` has this service do before it sends its start instructions (``serve
    --start-on-stdin``; it spawns this service first, before it reads its own settings): import the
    configured backends (torch, transformers) and freeze them, as ``main`` does first. Settings that do
    not validate are left for ``main`` to report."""
    try:
        policies = InferenceSettings().policies()
    except Exception:  # any reason: ``main`` reads them again and says why
        return
    import_backends([p.backend for p in policies])
    rpc.freeze_imports()


async def main(settings: Settings, address: str | None = None) -> None:
    s = InferenceSettings()
    try:
        policies = s.policies()
        # Imports first (torch, transformers: most of the start-up), frozen out of the cyclic collector,
        # then the models: the collection once set up (``rpc.tune_gc``) then walks only what loading the
        # models allocated (0.03 s instead of 0.5 s for the tiny model on a 2-core machine).
        await asyncio.to_thread(import_backends, [p.backend for p in policies])
        rpc.freeze_imports()
        registry = await asyncio.to_thread(PolicyRegistry.from_configs, policies, s.cache_dir)
    except PolicyLoadError as exc:
        # No silent substitute: the process stays up so health says NOT_SERVING (and every call says why,
        # UNAVAILABLE) instead of a crash loop that hides the reason or a model nobody asked for.
        log.error("not serving: a configured model cannot be prepared", extra={"reason": str(exc)})
        await _serve_not_serving(settings, address, PolicyRegistry(s.cache_dir, unavailable=str(exc)))
        return
    for policy in registry.list():
        if policy.fallback_reason:
            log.warning("policy served by the tiny fallback", extra={"policy_id": policy.policy_id})
    servicer = InferenceServicer(registry)
    front = None
    if s.http_addr:  # the OpenAI-compatible front shares the registry (same weights, same batches)
        from wolfpack_inference.http_api import HttpFront

        host, _, port = s.http_addr.rpartition(":")
        front = HttpFront(registry, s.http_api_key.get_secret_value())
        bound = await front.start(host, int(port))
        # The bound port (``:0`` asks for a free one), so callers and tests read it back instead of guessing.
        log.info("http front serving", extra={"address": f"{host or '127.0.0.1'}:{bound}"})

    async def on_stop() -> None:
        if front is not None:
            await front.stop()
        await registry.close()

    await rpc.serve(SERVICE, lambda server: register(server, servicer), settings, address, on_stop=on_stop)


async def _serve_not_serving(settings: Settings, address: str | None, registry: PolicyRegistry) -> None:
    """Health NOT_SERVING until SIGTERM; calls answer UNAVAILABLE with ``registry.unavailable``."""
    servicer = InferenceServicer(registry)
    running = await rpc.start_server(SERVICE, lambda server: register(server, servicer), settings, address)
    await running.set_serving(False)
    rpc.tune_gc()
    try:
        await rpc.stop_on_signals().wait()
    finally:
        await running.stop(0)
