"""OpenTelemetry for every Wolfpack process, configured only by the standard ``OTEL_*`` variables.

- ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set → OTLP/gRPC export;
  ``OTEL_TRACES_EXPORTER=console`` → spans printed; otherwise the API's no-op tracer stays: spans cost
  nothing, and a caller's trace context still passes through gRPC and stream entries unchanged.
- ``OTEL_SDK_DISABLED=true`` turns the SDK off entirely.
- Trace context crosses gRPC in metadata (the gRPC instrumentation does it) and crosses the Redis stream
  or a proto message in W3C ``traceparent``/``tracestate`` strings (helpers below), so one episode is
  one trace from rollout through reward to the trainer.

The SDK (``opentelemetry.sdk``: provider, processors, exporters, resources) is imported only when spans
are exported: every service process imports this module, and the SDK's ~0.05 s of imports bought nothing
in the usual case of no ``OTEL_*`` exporter. Without it no SDK provider can exist, which is how
``sdk_active`` answers without importing it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

_attached: list[SpanExporter] = []


def setup_telemetry(service: str, exporter: SpanExporter | None = None) -> TracerProvider | None:
    """Install a tracer provider for ``service`` (once per process). ``exporter`` overrides the env choice
    (tests pass an in-memory exporter). Returns the provider, or None when nothing exports spans.

    A provider already installed (by an earlier call, or by someone else such as ``opentelemetry-instrument``)
    is kept, since OpenTelemetry allows only one: an explicit ``exporter`` is attached to it (once), and the
    env choice adds nothing (that provider exports already)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    current = _sdk_provider()
    if current is not None:
        if exporter is not None and all(e is not exporter for e in _attached):
            current.add_span_processor(_processor(exporter))
            _attached.append(exporter)
        return current
    chosen = exporter or _exporter_from_env()
    if chosen is None:
        # Nobody collects spans: keep the API's no-op tracer. Spans cost nothing, and trace context
        # that arrives from callers (gRPC metadata, stream entries) still flows through unchanged.
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", f"wolfpack-{service}")})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(_processor(chosen))
    _attached.append(chosen)
    trace.set_tracer_provider(provider)
    return provider


def _processor(exporter: SpanExporter) -> Any:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    # In-memory exporters are for tests: export synchronously so assertions see spans at once.
    if isinstance(exporter, InMemorySpanExporter):
        return SimpleSpanProcessor(exporter)
    return BatchSpanProcessor(exporter)


def _exporter_from_env() -> SpanExporter | None:
    choice = os.environ.get("OTEL_TRACES_EXPORTER", "").lower()
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if choice == "none":
        return None
    if choice == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if endpoint or choice == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()  # reads endpoint, headers, TLS from OTEL_EXPORTER_OTLP_* itself
    return None


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


LONG_STREAMS = ("Observe", "PlaySeats", "GenerateStream", "GenerateBatchStream", "PushWeights")
"""Streaming methods that last an episode or a transfer: not wrapped in one server span each. The
instrumentation's stream wrapper also fails ("token created in a different Context") when thousands of
such streams end at once; their work is traced per turn/request inside the services instead."""


def _sdk_provider() -> TracerProvider | None:
    """The installed provider if it is the SDK's. Not imported, the SDK cannot have made one (whoever
    installed it, ``opentelemetry-instrument`` included, imported it), so it is not imported to ask."""
    sdk = sys.modules.get("opentelemetry.sdk.trace")
    current = trace.get_tracer_provider()
    return current if sdk is not None and isinstance(current, sdk.TracerProvider) else None


def sdk_active() -> bool:
    """Whether anyone collects spans (an SDK provider is installed, see ``setup_telemetry``). Cheap enough
    to check per call, which services do because tracing may be set up after they started."""
    return _sdk_provider() is not None


def server_interceptors() -> list[Any]:
    """gRPC asyncio server interceptors that continue the caller's trace (context from metadata).

    With spans exported, OpenTelemetry's instrumentation (a server span per call). Without, a light
    interceptor that only carries an incoming ``traceparent`` into the handler: spans nobody collects are
    not worth their cost on every request, but a caller's trace must still pass through this service.
    """
    if not sdk_active():
        return [ContextServerInterceptor()]
    from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

    skip = filters.any_of(*(filters.method_name(m) for m in LONG_STREAMS), filters.health_check())
    return [aio_server_interceptor(filter_=filters.negate(skip))]


def client_interceptors() -> list[Any]:
    """gRPC asyncio client interceptors that send the current trace context in metadata (a client span
    per call when spans are exported; only the ``traceparent`` header otherwise)."""
    if not sdk_active():
        return [ContextClientInterceptor(), ContextStreamClientInterceptor()]
    from opentelemetry.instrumentation.grpc import aio_client_interceptors, filters

    skip = filters.any_of(*(filters.method_name(m) for m in LONG_STREAMS), filters.health_check())
    return list(aio_client_interceptors(filter_=filters.negate(skip)))


def _incoming_context(context: Any) -> Context | None:
    """The caller's trace context from the call's metadata, or None when it sent none."""
    metadata = dict(context.invocation_metadata() or ())
    parent = metadata.get("traceparent")
    if not parent:
        return None
    return extract_carrier({"traceparent": str(parent), "tracestate": str(metadata.get("tracestate", ""))})


def _short_stream(method: str) -> bool:
    """A server-streaming method that is one request's worth of work (``GenerateBatch``), not one that
    lasts an episode: those are traced per turn inside the services (see ``LONG_STREAMS``)."""
    return method.rsplit("/", 1)[-1] not in LONG_STREAMS


class ContextServerInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Makes the caller's W3C trace context current inside unary handlers and short server streams;
    nothing else. Wrapped handlers are cached per method, so a call costs one metadata lookup."""

    def __init__(self) -> None:
        self._wrapped: dict[str, Any] = {}

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        method = details.method  # type: ignore[attr-defined]
        cached = self._wrapped.get(method)
        if cached is not None:
            return cached
        handler = await continuation(details)
        if handler is None:
            return handler
        if handler.unary_unary is not None:
            wrapped = self._unary(handler)
        elif handler.unary_stream is not None and _short_stream(method):
            wrapped = self._unary_stream(handler)
        else:
            return handler
        self._wrapped[method] = wrapped
        return wrapped

    @staticmethod
    def _unary(handler: Any) -> Any:
        inner = handler.unary_unary

        async def with_context(request: Any, context: Any) -> Any:
            parent = _incoming_context(context)
            if parent is None:
                return await inner(request, context)
            token = otel_context.attach(parent)
            try:
                return await inner(request, context)
            finally:
                otel_context.detach(token)

        return grpc.unary_unary_rpc_method_handler(
            with_context,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    @staticmethod
    def _unary_stream(handler: Any) -> Any:
        inner = handler.unary_stream

        async def with_context(request: Any, context: Any) -> AsyncIterator[Any]:
            # The handler runs in the call's own task, so the context attached here stays current
            # across its yields and is detached in the same task when the stream ends.
            parent = _incoming_context(context)
            token = otel_context.attach(parent) if parent is not None else None
            try:
                async for response in inner(request, context):
                    yield response
            finally:
                if token is not None:
                    otel_context.detach(token)

        return grpc.unary_stream_rpc_method_handler(
            with_context,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _with_trace_metadata(details: Any) -> Any:
    """``details`` with the current context's ``traceparent``/``tracestate`` added, when there is one."""
    if not trace.get_current_span().get_span_context().is_valid:
        return details
    metadata = list(details.metadata or ())
    metadata.extend(inject_carrier().items())
    return grpc.aio.ClientCallDetails(
        method=details.method,
        timeout=details.timeout,
        metadata=grpc.aio.Metadata(*metadata),
        credentials=details.credentials,
        wait_for_ready=details.wait_for_ready,
    )


class ContextClientInterceptor(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Adds ``traceparent``/``tracestate`` of the current context to unary calls, when there is one."""

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_trace_metadata(details), request)


class ContextStreamClientInterceptor(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """The same for short server streams (``GenerateBatch``). A separate class because a grpc.aio
    channel files each interceptor under the first call kind it implements only."""

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else str(details.method)
        if _short_stream(method):
            details = _with_trace_metadata(details)
        return await continuation(details, request)


# --- W3C trace context in strings, proto messages and stream entries ---------------------------------


def inject_carrier(context: Context | None = None) -> dict[str, str]:
    """The current (or given) context as W3C headers: ``{"traceparent": ..., "tracestate": ...}``."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return carrier


def extract_carrier(carrier: Mapping[str, str]) -> Context:
    """A context whose remote parent is the span described by the W3C headers in ``carrier``."""
    return propagate.extract(dict(carrier))


class _HasTraceContext(Protocol):
    traceparent: str
    tracestate: str


def inject_into(msg: _HasTraceContext, context: Context | None = None) -> None:
    """Write the current trace context into a ``wolfpack.v1.TraceContext`` message."""
    carrier = inject_carrier(context)
    msg.traceparent = carrier.get("traceparent", "")
    msg.tracestate = carrier.get("tracestate", "")


def extract_from(msg: _HasTraceContext) -> Context:
    """The parent context recorded in a ``wolfpack.v1.TraceContext`` message."""
    carrier = {"traceparent": msg.traceparent}
    if msg.tracestate:
        carrier["tracestate"] = msg.tracestate
    return extract_carrier(carrier) if msg.traceparent else Context()


# --- GenAI semantic conventions ------------------------------------------------------------------------


def gen_ai_attributes(
    *,
    operation: str,
    model: str,
    system: str = "wolfpack",
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    max_tokens: int | None = None,
    finish_reason: str | None = None,
    policy_id: str | None = None,
    policy_version: int | None = None,
) -> dict[str, Any]:
    """Span attributes following the OpenTelemetry GenAI semantic conventions (``gen_ai.*``), plus the
    Wolfpack policy id/version that the conventions have no name for."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.system": system,
        "gen_ai.request.model": model,
    }
    optional = {
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
        "gen_ai.request.temperature": temperature,
        "gen_ai.request.top_p": top_p,
        "gen_ai.request.max_tokens": max_tokens,
        "wolfpack.policy.id": policy_id,
        "wolfpack.policy.version": policy_version,
    }
    attrs.update({k: v for k, v in optional.items() if v is not None})
    if finish_reason is not None:
        attrs["gen_ai.response.finish_reasons"] = [finish_reason]
    return attrs
