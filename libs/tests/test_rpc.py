"""The shared gRPC bootstrap over real sockets: health, reflection, deadlines, draining, tracing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import environment_service_pb2 as env_pb
from wolfpack.v1 import environment_service_pb2_grpc as env_grpc
from wolfpack.v1 import rollout_service_pb2 as pb
from wolfpack.v1 import rollout_service_pb2_grpc as pb_grpc


class SlowRollout(pb_grpc.RolloutServiceServicer):
    """A servicer whose GetRolloutStatus answers at once, or (``hold``) only once ``release`` is set:
    deadlines and draining are observed with events, not with sleeps racing the machine's load."""

    def __init__(self, hold: bool) -> None:
        self.hold = hold
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def GetRolloutStatus(
        self, request: pb.GetRolloutStatusRequest, context: object
    ) -> pb.GetRolloutStatusResponse:
        self.started.set()
        if self.hold:
            await self.release.wait()
        return pb.GetRolloutStatusResponse(episodes_finished=42)


def registrar(servicer: SlowRollout):  # type: ignore[no-untyped-def]
    def register(server: grpc.aio.Server) -> Sequence[str]:
        pb_grpc.add_RolloutServiceServicer_to_server(servicer, server)
        return ["wolfpack.v1.RolloutService"]

    return register


async def start(hold: bool, **settings: object) -> rpc.Server:
    return await start_with(SlowRollout(hold), **settings)


async def start_with(servicer: SlowRollout, **settings: object) -> rpc.Server:
    return await rpc.start_server("rollout", registrar(servicer), load_settings(**settings), "127.0.0.1:0")


async def test_health_and_reflection() -> None:
    server = await start(hold=False)
    target = f"127.0.0.1:{server.port}"
    try:
        assert await rpc.check_health(target) == "SERVING"
        assert await rpc.check_health(target, service="wolfpack.v1.RolloutService") == "SERVING"
        async with grpc.aio.insecure_channel(target) as ch:
            stub = reflection_pb2_grpc.ServerReflectionStub(ch)
            responses = stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
            names = [s.name async for r in responses for s in r.list_services_response.service]
        assert "wolfpack.v1.RolloutService" in names and "grpc.health.v1.Health" in names
    finally:
        await server.stop(0)


async def test_client_calls_get_a_default_deadline() -> None:
    server = await start(hold=True)  # never answers: only the client's default deadline ends the call
    settings = load_settings(rpc_timeout_s=0.3)
    try:
        async with rpc.channel(f"127.0.0.1:{server.port}", settings) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await pb_grpc.RolloutServiceStub(ch).GetRolloutStatus(pb.GetRolloutStatusRequest())
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        await server.stop(0)


async def test_shutdown_drains_in_flight_calls() -> None:
    servicer = SlowRollout(hold=True)
    server = await start_with(servicer)
    target = f"127.0.0.1:{server.port}"
    async with rpc.channel(target, load_settings()) as ch:
        stub = pb_grpc.RolloutServiceStub(ch)

        async def get_status() -> pb.GetRolloutStatusResponse:
            return await stub.GetRolloutStatus(pb.GetRolloutStatusRequest())

        call = asyncio.create_task(get_status())
        await asyncio.wait_for(servicer.started.wait(), timeout=60)  # the call is in its handler
        stopping = asyncio.create_task(server.stop(grace=60.0))

        async def refusing_new_calls() -> None:
            while await rpc.check_health(target, timeout_s=5) != "UNREACHABLE":
                await asyncio.sleep(0.01)

        await asyncio.wait_for(refusing_new_calls(), timeout=60)  # the shutdown is under way
        servicer.release.set()
        response = await call
        await stopping
    assert response.episodes_finished == 42
    assert await rpc.check_health(target, timeout_s=0.5) == "UNREACHABLE"


async def test_not_serving_is_reported_before_the_drain() -> None:
    server = await start(hold=False)
    target = f"127.0.0.1:{server.port}"
    try:
        await server.set_serving(False)
        assert await rpc.check_health(target) == "NOT_SERVING"
        assert await rpc.check_health(target, service="wolfpack.v1.RolloutService") == "NOT_SERVING"
    finally:
        await server.stop(0)


@pytest.mark.tracing_sdk
async def test_trace_context_crosses_a_real_grpc_call(spans: InMemorySpanExporter) -> None:
    server = await start(hold=False)
    try:
        tracer = trace.get_tracer("test")
        async with rpc.channel(f"127.0.0.1:{server.port}", load_settings()) as ch:
            with tracer.start_as_current_span("episode") as root:
                await pb_grpc.RolloutServiceStub(ch).GetRolloutStatus(pb.GetRolloutStatusRequest())
    finally:
        await server.stop(0)
    finished = spans.get_finished_spans()
    server_spans = [s for s in finished if s.kind == trace.SpanKind.SERVER]
    client_spans = [s for s in finished if s.kind == trace.SpanKind.CLIENT]
    assert len(server_spans) == 1 and len(client_spans) == 1
    client, srv = client_spans[0], server_spans[0]
    root_ctx = root.get_span_context()
    assert client.context.trace_id == srv.context.trace_id == root_ctx.trace_id
    assert client.parent is not None and client.parent.span_id == root_ctx.span_id
    assert srv.parent is not None and srv.parent.span_id == client.context.span_id
    assert srv.parent.is_remote


def test_service_config_json_shape() -> None:
    """Only the shape of the config; that retries really happen against a server answering
    UNAVAILABLE (and never for non-idempotent methods) is tests/boundary/test_retries.py."""
    import json

    cfg = json.loads(rpc.service_config(rpc.IDEMPOTENT_METHODS))
    retrying = [c for c in cfg["methodConfig"] if "retryPolicy" in c]
    assert retrying and {"service": "wolfpack.v1.EnvironmentService", "method": "Act"} in retrying[0]["name"]


async def test_light_interceptors_carry_trace_context_without_an_sdk() -> None:
    """When nothing exports spans, a service still passes its caller's trace on (traceparent only)."""
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    from wolfpack.telemetry import ContextClientInterceptor, ContextServerInterceptor

    seen: list[int] = []

    class Echo(pb_grpc.RolloutServiceServicer):
        async def GetRolloutStatus(
            self, request: pb.GetRolloutStatusRequest, context: object
        ) -> pb.GetRolloutStatusResponse:
            seen.append(trace.get_current_span().get_span_context().trace_id)
            return pb.GetRolloutStatusResponse()

    server = grpc.aio.server(interceptors=[ContextServerInterceptor()])
    pb_grpc.add_RolloutServiceServicer_to_server(Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    caller = SpanContext(trace_id=0xABC123, span_id=0x42, is_remote=False, trace_flags=TraceFlags(1))
    try:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", interceptors=[ContextClientInterceptor()]
        ) as ch:
            stub = pb_grpc.RolloutServiceStub(ch)
            await stub.GetRolloutStatus(pb.GetRolloutStatusRequest())  # no current trace: nothing sent
            with trace.use_span(NonRecordingSpan(caller)):
                await stub.GetRolloutStatus(pb.GetRolloutStatusRequest())
    finally:
        await server.stop(0)
    assert seen == [0, 0xABC123]


async def test_light_interceptors_carry_trace_context_into_short_server_streams() -> None:
    """GenerateBatch (a server stream that is one request's worth of work) continues its caller's trace
    without an SDK too; episode-long streams such as Observe are left alone."""

    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    from wolfpack.telemetry import (
        ContextClientInterceptor,
        ContextServerInterceptor,
        ContextStreamClientInterceptor,
    )
    from wolfpack.v1 import inference_service_pb2 as ipb
    from wolfpack.v1 import inference_service_pb2_grpc as ipb_grpc

    seen: list[int] = []

    class Batch(ipb_grpc.InferenceServiceServicer):
        async def GenerateBatch(
            self, request: ipb.GenerateBatchRequest, context: object
        ) -> AsyncIterator[ipb.GenerateBatchResponse]:
            for i in range(2):  # the context stays current across the stream's yields
                seen.append(trace.get_current_span().get_span_context().trace_id)
                yield ipb.GenerateBatchResponse(results=[ipb.GenerateBatchResult(index=i + 1)])

    server = grpc.aio.server(interceptors=[ContextServerInterceptor()])
    ipb_grpc.add_InferenceServiceServicer_to_server(Batch(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    caller = SpanContext(trace_id=0xFEED, span_id=0x7, is_remote=False, trace_flags=TraceFlags(1))
    try:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", interceptors=[ContextClientInterceptor(), ContextStreamClientInterceptor()]
        ) as ch:
            stub = ipb_grpc.InferenceServiceStub(ch)
            assert len([r async for r in stub.GenerateBatch(ipb.GenerateBatchRequest())]) == 2
            with trace.use_span(NonRecordingSpan(caller)):
                assert len([r async for r in stub.GenerateBatch(ipb.GenerateBatchRequest())]) == 2
    finally:
        await server.stop(0)
    assert seen == [0, 0, 0xFEED, 0xFEED]


class LongStreams(env_grpc.EnvironmentServiceServicer):
    """Streams that outlive the client's ``rpc_timeout_s``: Observe answers twice with ``gap_s`` between,
    PlaySeats answers each client message after ``gap_s`` (as a rollout's stream does across many turns)."""

    def __init__(self, gap_s: float) -> None:
        self.gap_s = gap_s

    async def Observe(
        self, request: env_pb.ObserveRequest, context: object
    ) -> AsyncIterator[env_pb.ObserveResponse]:
        yield env_pb.ObserveResponse()
        await asyncio.sleep(self.gap_s)
        yield env_pb.ObserveResponse()

    async def PlaySeats(
        self, requests: AsyncIterator[env_pb.PlaySeatsRequest], context: object
    ) -> AsyncIterator[env_pb.PlaySeatsResponse]:
        async for _ in requests:
            await asyncio.sleep(self.gap_s)
            yield env_pb.PlaySeatsResponse()


async def test_streams_outlive_the_unary_default_deadline() -> None:
    """Regression: the channel's service config once gave every method ``rpc_timeout_s``, so PlaySeats and
    Observe streams were cut (DEADLINE_EXCEEDED) after 30-60 s of a rollout. Here the streams run for
    several times a 0.2 s default, while a unary call on the same channel still gets that deadline."""
    servicer = LongStreams(gap_s=0.5)

    def register(server: grpc.aio.Server) -> Sequence[str]:
        env_grpc.add_EnvironmentServiceServicer_to_server(servicer, server)
        return ["wolfpack.v1.EnvironmentService"]

    server = await rpc.start_server("environment", register, load_settings(), "127.0.0.1:0")
    held = await start(hold=True)  # a unary method that never answers
    settings = load_settings(rpc_timeout_s=0.2)
    try:
        async with rpc.channel(f"127.0.0.1:{server.port}", settings) as ch:
            stub = env_grpc.EnvironmentServiceStub(ch)
            observed = [r async for r in stub.Observe(env_pb.ObserveRequest(episode_id="e"))]
            assert len(observed) == 2

            async def requests() -> AsyncIterator[env_pb.PlaySeatsRequest]:
                for _ in range(3):
                    yield env_pb.PlaySeatsRequest()

            answered = [r async for r in stub.PlaySeats(requests())]
            assert len(answered) == 3  # 3 x 0.5 s on one stream, past 0.2 s
        async with rpc.channel(f"127.0.0.1:{held.port}", settings) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await pb_grpc.RolloutServiceStub(ch).GetRolloutStatus(pb.GetRolloutStatusRequest())
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        await server.stop(0)
        await held.stop(0)


async def test_a_taken_port_is_a_bind_error_not_a_runtime_error() -> None:
    """grpcio raises RuntimeError for a failed bind; start_server turns it into ``BindError`` (an OSError
    naming the service and address), for a port held by a plain socket and for one held by another
    server (no SO_REUSEPORT: the second server must not silently share the port)."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(rpc.BindError, match=f"rollout: cannot listen on 127.0.0.1:{port}"):
            await rpc.start_server(
                "rollout", registrar(SlowRollout(False)), load_settings(), f"127.0.0.1:{port}"
            )
    first = await start(hold=False)
    try:
        with pytest.raises(rpc.BindError, match=f":{first.port}"):
            await rpc.start_server(
                "rollout", registrar(SlowRollout(False)), load_settings(), f"127.0.0.1:{first.port}"
            )
        assert await rpc.check_health(f"127.0.0.1:{first.port}") == "SERVING"
    finally:
        await first.stop(0)


async def test_a_server_on_port_0_reports_the_port_it_bound(tmp_path: Path) -> None:
    """``announce_bound_address``: the next server started writes its bound address (the kernel's pick for
    port 0) as JSON, once; callers read the port back instead of guessing a free one beforehand."""
    import json
    import os

    ready = tmp_path / "ready" / "rollout.json"
    rpc.announce_bound_address(ready)
    first = await start(hold=False)
    second = await start(hold=False)  # not announced: the request was for one server
    try:
        assert json.loads(ready.read_text()) == {
            "service": "rollout", "address": f"127.0.0.1:{first.port}", "pid": os.getpid(),
        }  # fmt: skip
        assert first.port != 0 and second.port != first.port
        assert await rpc.check_health(json.loads(ready.read_text())["address"]) == "SERVING"
    finally:
        await first.stop(0)
        await second.stop(0)


async def _closed_by_server(sock: Any, within_s: float) -> bool:
    """Whether the server closes ``sock`` (reads end with b"") within ``within_s``; server bytes (its
    HTTP/2 settings) are read past."""
    import time

    sock.settimeout(0.2)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if not await asyncio.to_thread(sock.recv, 4096):
                return True
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True
    return False


async def test_silent_connections_are_closed_and_the_server_keeps_answering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sockets opened by anyone (no credential needed) that never speak gRPC are closed after the handshake
    timeout, and connections over the cap are closed at accept: they cannot hold the descriptors that health
    and real calls need (issue 20: 1,100 idle connections made health time out)."""
    import socket

    monkeypatch.setattr(rpc, "HANDSHAKE_TIMEOUT_MS", 500)
    monkeypatch.setattr(rpc, "MAX_CONNECTIONS", 8)
    server = await start(hold=False)
    target = f"127.0.0.1:{server.port}"
    try:
        silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(12)]
        closed = [await _closed_by_server(s, 10) for s in silent]
        assert all(closed), f"{closed.count(False)} of 12 silent connections still open after 10 s"
        for s in silent:
            s.close()
        assert await rpc.check_health(target) == "SERVING"
    finally:
        await server.stop(0)
