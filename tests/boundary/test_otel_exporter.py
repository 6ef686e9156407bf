"""The span exporter is chosen by the standard ``OTEL_*`` variables, in a real service process
(``wolfpack serve reward``): ``OTEL_TRACES_EXPORTER=console`` prints spans, ``OTEL_EXPORTER_OTLP_ENDPOINT``
sends them to an OTLP collector (here a real gRPC one in the test), and with neither nothing is exported.
Each case is its own process, so none depends on what another installed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as otlp_grpc

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import reward_service_pb2 as pb
from wolfpack.v1 import reward_service_pb2_grpc as pb_grpc

from .conftest import WAIT_S, ServerProcess

# A broken build may hang (a stuck event loop) instead of failing: bound each test.
pytestmark = pytest.mark.timeout(120)

METHOD = "/wolfpack.v1.RewardService/ListRewardSpecs"
SERVE = ["-m", "wolfpack.cli.main", "serve", "reward", "--address", "127.0.0.1:0"]


async def one_call_then_stop(server: ServerProcess) -> str:
    """Make one traced call, SIGTERM the server (its exit flushes the exporter) and return its stdout."""
    target = f"127.0.0.1:{server.port()}"
    async with rpc.channel(target, load_settings(rpc_timeout_s=WAIT_S)) as channel:
        await pb_grpc.RewardServiceStub(channel).ListRewardSpecs(pb.ListRewardSpecsRequest())
    assert await asyncio.to_thread(server.terminate) == 0
    lines = []
    while line := await asyncio.to_thread(server.stdout_line):
        lines.append(line)
    return "".join(lines)


async def test_console_exporter(spawn: Callable[..., ServerProcess]) -> None:
    server = spawn(SERVE, {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "boundary-console"})
    printed = await one_call_then_stop(server)
    assert METHOD in printed and "boundary-console" in printed, printed[-2000:]


class Collector(otlp_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[otlp.ExportTraceServiceRequest] = []
        self.received = asyncio.Event()

    async def Export(self, request: otlp.ExportTraceServiceRequest, context: Any) -> Any:
        self.requests.append(request)
        self.received.set()
        return otlp.ExportTraceServiceResponse()


@pytest.fixture
async def collector() -> AsyncIterator[tuple[Collector, int]]:
    servicer = Collector()
    server = grpc.aio.server()
    otlp_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield servicer, port
    await server.stop(0)


async def test_otlp_exporter(spawn: Callable[..., ServerProcess], collector: tuple[Collector, int]) -> None:
    servicer, port = collector
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_SERVICE_NAME": "boundary-otlp",
    }
    await one_call_then_stop(spawn(SERVE, env))
    await asyncio.wait_for(servicer.received.wait(), timeout=WAIT_S)
    spans = {
        (attr.value.string_value, span.name)
        for req in servicer.requests
        for rs in req.resource_spans
        for attr in rs.resource.attributes
        if attr.key == "service.name"
        for ss in rs.scope_spans
        for span in ss.spans
    }
    assert ("boundary-otlp", METHOD.lstrip("/")) in spans or ("boundary-otlp", METHOD) in spans, spans


async def test_no_otel_variables_export_nothing(spawn: Callable[..., ServerProcess]) -> None:
    printed = await one_call_then_stop(spawn(SERVE))
    assert METHOD not in printed and "span_id" not in printed, printed[-2000:]
