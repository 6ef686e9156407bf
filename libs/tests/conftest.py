"""Fixtures for the shared-library tests: a real Redis (never a mock) and an in-memory span exporter."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from wolfpack import telemetry
from wolfpack.redis_server import EmbeddedRedis


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``WOLFPACK_TEST_REDIS_URL`` if set, else an embedded real server for the session."""
    url = os.environ.get("WOLFPACK_TEST_REDIS_URL")
    if url:
        yield url
        return
    with EmbeddedRedis(Path(tmp_path_factory.mktemp("redis"))) as server:
        yield server.url


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
