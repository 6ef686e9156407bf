"""The stream loads OpenTelemetry only where something else did (``wolfpack.tracing``): a producer in a
process that never loaded it (the trainer's local mode) sends no trace context and registers no gauge; in
one that did (every service) its ``wolfpack.stream.backlog`` gauge is collected as before. Each case runs
in a fresh interpreter: which modules are loaded is the point."""

from __future__ import annotations

import subprocess
import sys

MAKE_PRODUCER = """
import sys
import redis.asyncio as aioredis
from wolfpack.stream import ProtoStreamProducer, tracing
producer = ProtoStreamProducer(aioredis.Redis.from_url("redis://127.0.0.1:1"), "s", id_of=lambda m: "x")
producer.last_backlog = 7
"""


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_producer_without_opentelemetry_loads_none_and_sends_no_trace_context() -> None:
    out = run(
        MAKE_PRODUCER
        + "print(tracing.inject_carrier(), sorted(m for m in sys.modules if m.split('.')[0] == 'opentelemetry'))"
    )
    assert out.strip() == "{} []"


def test_the_backlog_gauge_is_collected_where_opentelemetry_is_set_up() -> None:
    setup = """
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
"""
    collect = """
points = [
    (m.name, p.value, dict(p.attributes))
    for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    for p in m.data.data_points
]
print(points)
"""
    assert run(setup + MAKE_PRODUCER + collect).strip() == "[('wolfpack.stream.backlog', 7, {'stream': 's'})]"
