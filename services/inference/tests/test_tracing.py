"""A Generate call makes one GenAI-convention span, child of the caller's trace."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from wolfpack import telemetry
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc

from .test_generate import chat  # type: ignore[import-not-found]


@pytest.mark.tracing_sdk
async def test_generate_span(stub: pb_grpc.InferenceServiceStub) -> None:
    exporter = InMemorySpanExporter()
    telemetry.setup_telemetry("inference", exporter=exporter)
    with telemetry.tracer("test").start_as_current_span("rollout-turn") as parent:
        resp = await stub.Generate(chat("Who is the wolf?", max_tokens=5, temperature=0))
    spans = [s for s in exporter.get_finished_spans() if s.name == "chat tiny"]
    assert len(spans) == 1
    span = spans[0]
    assert span.context is not None and span.context.trace_id == parent.get_span_context().trace_id
    attrs = dict(span.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.usage.input_tokens"] == resp.usage.prompt_tokens
    assert attrs["gen_ai.usage.output_tokens"] == resp.usage.completion_tokens
    assert attrs["wolfpack.policy.id"] == "tiny" and attrs["wolfpack.policy.version"] == 0
    assert attrs["gen_ai.request.max_tokens"] == 5
