"""Spans and W3C trace context for code that also runs where nobody traces, without loading OpenTelemetry.

OpenTelemetry's API gets loaded by ``wolfpack.telemetry`` (every service process, through ``wolfpack.rpc``),
by ``opentelemetry-instrument``, or by whoever installs a tracer provider. In a process where none of them
ran (``wolfpack train`` in local mode: the rollout driver and the stream, no service) there can be no
tracer provider, no current span and no baggage: every span would be a non-recording one and every
injected carrier empty. The helpers here give exactly that without importing the API, and go through the
API once it is loaded (checked on every call, so tracing set up later is seen).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from opentelemetry.context import Context


def loaded() -> bool:
    """Whether OpenTelemetry's context API is loaded: without it nothing can be current or traced."""
    return "opentelemetry.context" in sys.modules


class Span(Protocol):
    """What the callers here use of ``opentelemetry.trace.Span``."""

    def set_attribute(self, key: str, value: Any) -> None: ...

    def record_exception(self, exception: BaseException) -> None: ...

    def is_recording(self) -> bool: ...

    def end(self) -> None: ...


class _NoSpan:
    """The span of a process that does not trace: records nothing (as the API's non-recording span)."""

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def record_exception(self, exception: BaseException) -> None:
        pass

    def is_recording(self) -> bool:
        return False

    def end(self) -> None:
        pass


NO_SPAN = _NoSpan()


class Tracer:
    """``opentelemetry.trace.get_tracer(name)``, looked up per span while the API is loaded."""

    def __init__(self, name: str) -> None:
        self.name = name

    def start_span(
        self, name: str, parent: Context | None = None, attributes: Mapping[str, Any] | None = None
    ) -> Span:
        """A span under ``parent`` (None: the root of a new trace), or ``NO_SPAN`` when nobody traces."""
        if not loaded():
            return NO_SPAN
        from opentelemetry import context as otel_context
        from opentelemetry import trace

        return trace.get_tracer(self.name).start_span(
            name, context=parent if parent is not None else otel_context.Context(), attributes=attributes
        )


def context_of(span: Span) -> Context | None:
    """The current context with ``span`` in it (the parent of its children), None for ``NO_SPAN``."""
    if span is NO_SPAN or not loaded():
        return None
    from opentelemetry import trace

    return trace.set_span_in_context(span)  # type: ignore[arg-type]


def attach(context: Context | None) -> object | None:
    """Make ``context`` current (None: an empty one, no trace); the token for ``detach``. Nothing to do
    (None) when the API is not loaded: then nothing is current."""
    if not loaded():
        return None
    from opentelemetry import context as otel_context

    return otel_context.attach(context if context is not None else otel_context.Context())


def detach(token: object | None) -> None:
    if token is not None:
        from opentelemetry import context as otel_context

        otel_context.detach(token)  # type: ignore[arg-type]


def inject_carrier(context: Context | None = None) -> dict[str, str]:
    """``context`` (default the current one) as W3C headers (``traceparent``, ``tracestate``); ``{}`` when
    the API is not loaded (as the API gives for a context without a span)."""
    if context is None and not loaded():
        return {}
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return carrier


def extract_carrier(carrier: Mapping[str, str]) -> Context:
    """A context whose remote parent is the span the W3C headers in ``carrier`` describe (loads the API:
    whoever asks for a parent traces)."""
    from opentelemetry import propagate

    return propagate.extract(dict(carrier))


class _HasTraceContext(Protocol):
    traceparent: str
    tracestate: str


def inject_into(msg: _HasTraceContext, context: Context) -> None:
    """Write ``context`` into a ``wolfpack.v1.TraceContext`` message (as ``telemetry.inject_into``)."""
    carrier = inject_carrier(context)
    msg.traceparent = carrier.get("traceparent", "")
    msg.tracestate = carrier.get("tracestate", "")
