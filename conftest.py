"""Fixtures shared by every test folder: a real Redis, never a mock."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

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
