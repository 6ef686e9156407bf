"""A real environment gRPC server on a free port, per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

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
async def servicer(limits: Limits) -> EnvironmentServicer:
    return EnvironmentServicer(EpisodeManager(limits))


@pytest.fixture
async def env_client(servicer: EnvironmentServicer) -> AsyncIterator[EnvironmentClient]:
    settings = load_settings(rpc_timeout_s=20)
    server = await rpc.start_server("environment", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    async with EnvironmentClient(f"127.0.0.1:{server.port}", settings) as client:
        yield client
    servicer.manager.close_all()
    await server.stop(0)
