"""Fixtures for the shared-library tests (``redis_url`` comes from the root conftest)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from wolfpack import telemetry


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def stream_key() -> str:
    """A fresh stream name per test, so tests never see each other's entries on a shared server."""
    return f"test:{uuid.uuid4().hex}"


_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    telemetry.setup_telemetry("tests", exporter=_EXPORTER)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()
