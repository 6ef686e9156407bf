"""Telemetry setup and trace-context plumbing, checked against hand-written W3C values and real gRPC.

The exporter choice (``OTEL_*``) is read without installing anything. Tests that install the SDK do it
inside ``fresh_sdk``, which puts OpenTelemetry's process-global provider back as it was afterwards (the
root conftest fails any test that leaves the SDK installed), so they run in the default session.
The end-to-end exporter cases, in real service processes, are tests/boundary/test_otel_exporter.py.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from opentelemetry.util._once import Once

from wolfpack import telemetry
from wolfpack.v1.common_pb2 import TraceContext

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331
# The W3C spec's own example header for these ids, sampled (https://www.w3.org/TR/trace-context/).
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

OTEL_VARS = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SERVICE_NAME",
)


def caller_span(state: TraceState | None = None) -> NonRecordingSpan:
    return NonRecordingSpan(
        SpanContext(TRACE_ID, SPAN_ID, is_remote=False, trace_flags=TraceFlags(1), trace_state=state)
    )


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def fresh_sdk(clean_env: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No provider installed yet (as in a fresh process); afterwards, the process's globals as before."""
    saved = (trace._TRACER_PROVIDER_SET_ONCE, trace._TRACER_PROVIDER)
    saved_attached = list(telemetry._attached)
    trace._TRACER_PROVIDER_SET_ONCE, trace._TRACER_PROVIDER = Once(), None
    telemetry._attached.clear()
    try:
        yield clean_env
    finally:
        installed = trace._TRACER_PROVIDER
        if isinstance(installed, TracerProvider):
            installed.shutdown()
        trace._TRACER_PROVIDER_SET_ONCE, trace._TRACER_PROVIDER = saved
        telemetry._attached[:] = saved_attached


# --------------------------------------------------------------------------- exporter choice (OTEL_*)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"OTEL_TRACES_EXPORTER": "console"}, ConsoleSpanExporter),
        ({"OTEL_TRACES_EXPORTER": "Console"}, ConsoleSpanExporter),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, OTLPSpanExporter),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, OTLPSpanExporter),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317"}, OTLPSpanExporter),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, None),
        ({"OTEL_TRACES_EXPORTER": "NONE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, None),
        (
            {"OTEL_TRACES_EXPORTER": "console", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317"},
            ConsoleSpanExporter,
        ),
        ({"OTEL_TRACES_EXPORTER": "zipkin-not-installed"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, None),
    ],
)
def test_exporter_is_chosen_by_the_otel_variables(
    clean_env: pytest.MonkeyPatch, env: dict[str, str], expected: type | None
) -> None:
    for name, value in env.items():
        clean_env.setenv(name, value)
    chosen = telemetry._exporter_from_env()
    if expected is None:
        assert chosen is None
    else:
        assert type(chosen) is expected
        chosen.shutdown()


# --------------------------------------------------------------------------- setup_telemetry


def test_nothing_to_export_keeps_the_no_op_tracer(fresh_sdk: pytest.MonkeyPatch) -> None:
    assert telemetry.setup_telemetry("svc") is None
    assert not telemetry.sdk_active()
    with trace.get_tracer("t").start_as_current_span("x") as span:
        assert not span.get_span_context().is_valid


@pytest.mark.parametrize("value", ["true", "TRUE", "True"])
def test_sdk_disabled_wins_over_everything(fresh_sdk: pytest.MonkeyPatch, value: str) -> None:
    fresh_sdk.setenv("OTEL_SDK_DISABLED", value)
    fresh_sdk.setenv("OTEL_TRACES_EXPORTER", "console")
    assert telemetry.setup_telemetry("svc", exporter=InMemorySpanExporter()) is None
    assert not telemetry.sdk_active()


def test_sdk_disabled_false_is_not_disabled(fresh_sdk: pytest.MonkeyPatch) -> None:
    fresh_sdk.setenv("OTEL_SDK_DISABLED", "false")
    assert telemetry.setup_telemetry("svc", exporter=InMemorySpanExporter()) is not None
    assert telemetry.sdk_active()


def test_an_exporter_installs_a_provider_exporting_synchronously(fresh_sdk: pytest.MonkeyPatch) -> None:
    exporter = InMemorySpanExporter()
    provider = telemetry.setup_telemetry("reward", exporter=exporter)
    assert isinstance(provider, TracerProvider) and trace.get_tracer_provider() is provider
    assert telemetry.sdk_active()
    assert provider.resource.attributes["service.name"] == "wolfpack-reward"
    with telemetry.tracer("t").start_as_current_span("one"):
        pass
    # in-memory exporters get a synchronous processor: the span is there as soon as it ends
    assert [s.name for s in exporter.get_finished_spans()] == ["one"]


def test_otel_service_name_overrides_the_default(fresh_sdk: pytest.MonkeyPatch) -> None:
    fresh_sdk.setenv("OTEL_SERVICE_NAME", "my-reward")
    provider = telemetry.setup_telemetry("reward", exporter=InMemorySpanExporter())
    assert provider is not None and provider.resource.attributes["service.name"] == "my-reward"


def test_the_env_choice_installs_a_batching_provider(fresh_sdk: pytest.MonkeyPatch) -> None:
    fresh_sdk.setenv("OTEL_TRACES_EXPORTER", "console")
    provider = telemetry.setup_telemetry("svc")
    assert isinstance(provider, TracerProvider)
    processors = provider._active_span_processor._span_processors
    assert len(processors) == 1 and isinstance(processors[0], BatchSpanProcessor)
    assert isinstance(processors[0].span_exporter, ConsoleSpanExporter)


def test_a_second_setup_adds_a_new_exporter_once_and_keeps_the_provider(
    fresh_sdk: pytest.MonkeyPatch,
) -> None:
    first, second = InMemorySpanExporter(), InMemorySpanExporter()
    provider = telemetry.setup_telemetry("a", exporter=first)
    assert telemetry.setup_telemetry("b", exporter=second) is provider
    assert telemetry.setup_telemetry("b", exporter=second) is provider  # the same exporter: not twice
    assert telemetry.setup_telemetry("c", exporter=first) is provider
    assert telemetry.setup_telemetry("d") is provider
    assert provider is not None and provider.resource.attributes["service.name"] == "wolfpack-a"
    with telemetry.tracer("t").start_as_current_span("s"):
        pass
    assert [s.name for s in first.get_finished_spans()] == ["s"]
    assert [s.name for s in second.get_finished_spans()] == ["s"]


def test_a_provider_installed_by_someone_else_is_kept_and_gets_the_exporter(
    fresh_sdk: pytest.MonkeyPatch,
) -> None:
    """An SDK provider installed before us (``opentelemetry-instrument``, or an embedding application) stays
    the one spans go to: an explicit exporter is attached to it, and the env choice adds no second copy of
    what it already exports. (It used to build a second provider that could not be installed, so the
    exporter given received nothing.)"""
    theirs = TracerProvider()
    trace.set_tracer_provider(theirs)
    fresh_sdk.setenv("OTEL_TRACES_EXPORTER", "console")
    assert telemetry.setup_telemetry("svc") is theirs
    assert theirs._active_span_processor._span_processors == ()
    exporter = InMemorySpanExporter()
    assert telemetry.setup_telemetry("svc", exporter=exporter) is theirs
    assert telemetry.setup_telemetry("svc", exporter=exporter) is theirs
    with telemetry.tracer("t").start_as_current_span("seen"):
        pass
    assert [s.name for s in exporter.get_finished_spans()] == ["seen"]


# --------------------------------------------------------------------------- W3C strings and messages


def test_inject_writes_the_w3c_header_of_the_current_or_given_context() -> None:
    assert telemetry.inject_carrier() == {}, "no current span: nothing to send"
    with trace.use_span(caller_span()):
        assert telemetry.inject_carrier() == {"traceparent": TRACEPARENT}
    given = trace.set_span_in_context(caller_span(TraceState([("vendor", "v1")])))
    assert telemetry.inject_carrier(given) == {"traceparent": TRACEPARENT, "tracestate": "vendor=v1"}


def test_extract_reads_a_remote_parent() -> None:
    ctx = telemetry.extract_carrier({"traceparent": TRACEPARENT, "tracestate": "vendor=v1"})
    parent = trace.get_current_span(ctx).get_span_context()
    assert (parent.trace_id, parent.span_id, parent.is_remote) == (TRACE_ID, SPAN_ID, True)
    assert parent.trace_state.get("vendor") == "v1"
    assert not trace.get_current_span(telemetry.extract_carrier({})).get_span_context().is_valid


def test_trace_context_messages_round_trip() -> None:
    msg = TraceContext()
    telemetry.inject_into(msg)
    assert (msg.traceparent, msg.tracestate) == ("", "")
    assert not trace.get_current_span(telemetry.extract_from(msg)).get_span_context().is_valid

    given = trace.set_span_in_context(caller_span(TraceState([("vendor", "v1")])))
    telemetry.inject_into(msg, given)
    assert (msg.traceparent, msg.tracestate) == (TRACEPARENT, "vendor=v1")
    parent = trace.get_current_span(telemetry.extract_from(msg)).get_span_context()
    assert (parent.trace_id, parent.span_id, parent.trace_state.get("vendor")) == (TRACE_ID, SPAN_ID, "v1")

    with trace.use_span(caller_span()):
        telemetry.inject_into(msg)  # the current context; overwrites the old tracestate
    assert (msg.traceparent, msg.tracestate) == (TRACEPARENT, "")
    parent = trace.get_current_span(telemetry.extract_from(msg)).get_span_context()
    assert parent.span_id == SPAN_ID and len(parent.trace_state) == 0


def test_gen_ai_attributes_follow_the_conventions() -> None:
    assert telemetry.gen_ai_attributes(operation="chat", model="tiny") == {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": "wolfpack",
        "gen_ai.request.model": "tiny",
    }
    full = telemetry.gen_ai_attributes(
        operation="text_completion", model="m", system="vllm", input_tokens=12, output_tokens=0,
        temperature=0.0, top_p=0.9, max_tokens=64, finish_reason="stop", policy_id="p", policy_version=0,
    )  # fmt: skip
    assert full == {
        "gen_ai.operation.name": "text_completion",
        "gen_ai.system": "vllm",
        "gen_ai.request.model": "m",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 0,  # zeros are values, not "unset"
        "gen_ai.request.temperature": 0.0,
        "gen_ai.request.top_p": 0.9,
        "gen_ai.request.max_tokens": 64,
        "gen_ai.response.finish_reasons": ["stop"],
        "wolfpack.policy.id": "p",
        "wolfpack.policy.version": 0,
    }


@pytest.mark.parametrize(
    ("method", "short"),
    [
        ("/wolfpack.v1.EnvironmentService/Observe", False),
        ("/wolfpack.v1.EnvironmentService/PlaySeats", False),
        ("/wolfpack.v1.InferenceService/GenerateStream", False),
        ("/wolfpack.v1.InferenceService/PushWeights", False),
        ("/wolfpack.v1.InferenceService/GenerateBatch", True),
        ("/wolfpack.v1.InferenceService/Generate", True),
        ("/wolfpack.v1.ObserveService/Other", True),  # the method name decides, not the service
    ],
)
def test_long_streams_are_episode_or_transfer_long(method: str, short: bool) -> None:
    assert telemetry._short_stream(method) is short


# --------------------------------------------------------------------------- interceptors over real gRPC

ENV = "wolfpack.v1.EnvironmentService"
INF = "wolfpack.v1.InferenceService"


class Seen:
    """Generic byte handlers of every call kind recording the trace id (and tracestate) current inside."""

    def __init__(self) -> None:
        self.by_method: dict[str, list[tuple[int, str, tuple[str, str]]]] = {}

    def note(self, method: str, context: Any) -> None:
        span = trace.get_current_span().get_span_context()
        metadata = dict(context.invocation_metadata() or ())
        header = (metadata.get("traceparent", ""), metadata.get("x-other", ""))
        self.by_method.setdefault(method, []).append(
            (span.trace_id, span.trace_state.get("vendor") or "", header)
        )

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        def unary(method: str) -> Any:
            async def handle(request: bytes, context: Any) -> bytes:
                self.note(method, context)
                return b"ok"

            return grpc.unary_unary_rpc_method_handler(handle)

        def server_stream(method: str) -> Any:
            async def handle(request: bytes, context: Any) -> AsyncIterator[bytes]:
                for _ in range(2):  # the context stays current across yields
                    self.note(method, context)
                    yield b"ok"

            return grpc.unary_stream_rpc_method_handler(handle)

        def client_stream(method: str) -> Any:
            async def handle(requests: AsyncIterator[bytes], context: Any) -> bytes:
                async for _ in requests:
                    pass
                self.note(method, context)
                return b"ok"

            return grpc.stream_unary_rpc_method_handler(handle)

        def bidi(method: str) -> Any:
            async def handle(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
                async for _ in requests:
                    self.note(method, context)
                    yield b"ok"

            return grpc.stream_stream_rpc_method_handler(handle)

        return [
            grpc.method_handlers_generic_handler(
                ENV,
                {
                    "CreateEpisode": unary("CreateEpisode"),
                    "Observe": server_stream("Observe"),
                    "PlaySeats": bidi("PlaySeats"),
                },
            ),
            grpc.method_handlers_generic_handler(
                INF,
                {
                    "GenerateBatch": server_stream("GenerateBatch"),
                    "GenerateStream": server_stream("GenerateStream"),
                    "PushWeights": client_stream("PushWeights"),
                },
            ),
            grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": unary("Check")}),
        ]


async def requests() -> AsyncIterator[bytes]:
    yield b"r"


async def call_all(ch: grpc.aio.Channel, metadata: Any = None) -> None:
    """Each method twice (the second call goes through any per-method cache)."""
    for _ in range(2):
        assert await ch.unary_unary(f"/{ENV}/CreateEpisode")(b"x", metadata=metadata, timeout=10) == b"ok"
        assert (
            await ch.unary_unary("/grpc.health.v1.Health/Check")(b"x", metadata=metadata, timeout=10) == b"ok"
        )
        for method in (f"/{ENV}/Observe", f"/{INF}/GenerateBatch", f"/{INF}/GenerateStream"):
            got = [r async for r in ch.unary_stream(method)(b"x", metadata=metadata, timeout=10)]
            assert got == [b"ok", b"ok"], method
        assert (
            await ch.stream_unary(f"/{INF}/PushWeights")(requests(), metadata=metadata, timeout=10) == b"ok"
        )
        got = [
            r async for r in ch.stream_stream(f"/{ENV}/PlaySeats")(requests(), metadata=metadata, timeout=10)
        ]
        assert got == [b"ok"]


async def start(interceptors: list[Any]) -> tuple[grpc.aio.Server, Seen, str]:
    seen = Seen()
    server = grpc.aio.server(interceptors=interceptors)
    server.add_generic_rpc_handlers(seen.handlers())
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, seen, f"127.0.0.1:{port}"


def test_without_an_sdk_the_light_interceptors_are_used() -> None:
    assert not telemetry.sdk_active()
    [server] = telemetry.server_interceptors()
    assert isinstance(server, telemetry.ContextServerInterceptor)
    unary, stream = telemetry.client_interceptors()
    assert isinstance(unary, telemetry.ContextClientInterceptor)
    assert isinstance(stream, telemetry.ContextStreamClientInterceptor)


async def test_the_light_server_interceptor_continues_unary_and_short_streams_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A caller's traceparent (sent by hand here) is current inside unary handlers and short server
    streams, with its tracestate; episode-long streams and client/bidi streams run untouched; and no call,
    with or without a trace, leaves an error behind (such as a context detached that was never attached)."""
    caplog.set_level(logging.WARNING)
    server, seen, target = await start(telemetry.server_interceptors())
    metadata = [("traceparent", TRACEPARENT), ("tracestate", "vendor=v1")]
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            await call_all(ch)  # no trace sent: nothing current
            await call_all(ch, metadata)
            # unknown methods stay UNIMPLEMENTED through the interceptor, twice (nothing cached for them)
            for _ in range(2):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await ch.unary_unary(f"/{ENV}/Nope")(b"x", metadata=metadata, timeout=10)
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(0)
    continued = {"CreateEpisode", "Check", "GenerateBatch"}
    for method, notes in seen.by_method.items():
        ids = [(trace_id, vendor) for trace_id, vendor, _ in notes]
        half = len(ids) // 2
        assert ids[:half] == [(0, "")] * half, method
        expected = (TRACE_ID, "v1") if method in continued else (0, "")
        assert ids[half:] == [expected] * half, method
    assert set(seen.by_method) == continued | {"Observe", "GenerateStream", "PushWeights", "PlaySeats"}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_the_light_client_interceptors_send_the_current_context_on_unary_and_short_streams() -> None:
    server, seen, target = await start([])
    try:
        async with grpc.aio.insecure_channel(target, interceptors=telemetry.client_interceptors()) as ch:
            await call_all(ch)  # no current span: no header
            token = otel_context.attach(trace.set_span_in_context(caller_span()))
            try:
                await call_all(ch, [("x-other", "kept")])
            finally:
                otel_context.detach(token)
    finally:
        await server.stop(0)
    sent = {"CreateEpisode", "Check", "GenerateBatch"}  # unary calls, and the one short server stream
    for method, notes in seen.by_method.items():
        headers = [header for _, _, header in notes]
        half = len(headers) // 2
        assert headers[:half] == [("", "")] * half, method
        # the caller's own metadata travels beside the trace context
        assert headers[half:] == [(TRACEPARENT if method in sent else "", "kept")] * half, method


async def test_with_the_sdk_calls_get_spans_except_long_streams_and_health(
    fresh_sdk: pytest.MonkeyPatch,
) -> None:
    exporter = InMemorySpanExporter()
    telemetry.setup_telemetry("tests", exporter=exporter)
    server, _seen, target = await start(telemetry.server_interceptors())
    try:
        async with grpc.aio.insecure_channel(target, interceptors=telemetry.client_interceptors()) as ch:
            with telemetry.tracer("t").start_as_current_span("episode") as episode:
                await call_all(ch)
    finally:
        await server.stop(0)
    spans = exporter.get_finished_spans()
    traced = {s.name.rsplit("/", 1)[-1] for s in spans if s.name != "episode"}
    assert traced == {"CreateEpisode", "GenerateBatch"}, [s.name for s in spans]
    episode_trace = episode.get_span_context().trace_id
    assert all(s.context.trace_id == episode_trace for s in spans)
    kinds = sorted((s.name.rsplit("/", 1)[-1], s.kind.name) for s in spans if s.name != "episode")
    assert kinds == sorted(
        [(m, k) for m in ("CreateEpisode", "GenerateBatch") for k in ("CLIENT", "SERVER")] * 2
    )


def test_sdk_interceptors_are_the_instrumentations(fresh_sdk: pytest.MonkeyPatch, caplog: Any) -> None:
    with caplog.at_level(logging.WARNING):
        telemetry.setup_telemetry("tests", exporter=InMemorySpanExporter())
    assert not any(isinstance(i, telemetry.ContextServerInterceptor) for i in telemetry.server_interceptors())
    assert len(telemetry.server_interceptors()) == 1
    clients = telemetry.client_interceptors()
    assert clients and not any(
        isinstance(i, telemetry.ContextClientInterceptor | telemetry.ContextStreamClientInterceptor)
        for i in clients
    )


# --------------------------------------------------------------------------- the SDK only when it exports

_PROBE = """
import sys
from wolfpack import telemetry
provider = telemetry.setup_telemetry("probe")
print(provider is not None, telemetry.sdk_active(), "opentelemetry.sdk.trace" in sys.modules)
"""


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "False False False"),  # nothing exports: the SDK's imports are not paid
        ({"OTEL_TRACES_EXPORTER": "none"}, "False False False"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "True True True"),  # exporting: the SDK, as before
    ],
)
def test_the_sdk_is_imported_only_when_spans_are_exported(env: dict[str, str], expected: str) -> None:
    """In a fresh interpreter (this one's modules would hide an import): every service calls
    ``setup_telemetry`` at start, and without an exporter it must neither install nor import the SDK."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == expected, done.stdout + done.stderr
