"""A real environment gRPC server on a free port, per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack_environment.client import EnvironmentClient
from wolfpack_environment.server import EnvironmentServicer, register
from wolfpack_environment.sessions import EpisodeManager, Limits


@pytest.fixture
def limits() -> Limits:
    return Limits(max_episodes=50, max_text_chars=2_000)


@pytest.fixture
def scenario_store(tmp_path: Path) -> str:
    return str(tmp_path / "scenarios.sqlite3")


@pytest.fixture
async def servicer(limits: Limits, scenario_store: str) -> EnvironmentServicer:
    return EnvironmentServicer(EpisodeManager(limits), scenario_store=scenario_store)


@pytest.fixture
async def env_client(servicer: EnvironmentServicer) -> AsyncIterator[EnvironmentClient]:
    settings = load_settings(rpc_timeout_s=20)
    server = await rpc.start_server("environment", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    async with EnvironmentClient(f"127.0.0.1:{server.port}", settings) as client:
        yield client
    servicer.manager.close_all()
    await server.stop(0)
