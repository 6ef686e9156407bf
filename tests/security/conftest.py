"""Real servers on free loopback ports for the security tests (gRPC services and the gateway)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from wolfpack import rpc
from wolfpack.settings import Settings, load_settings
from wolfpack_environment.client import EnvironmentClient
from wolfpack_environment.gateway import GatewayConfig, RunningGateway, start_gateway
from wolfpack_environment.server import EnvironmentServicer, register
from wolfpack_environment.sessions import EpisodeManager, Limits

SECRET = "s3cret-credential"


@dataclass
class EnvStack:
    """A running environment service (and optionally its gateway)."""

    servicer: EnvironmentServicer
    server: rpc.Server
    client: EnvironmentClient
    settings: Settings
    target: str

    @property
    def manager(self) -> EpisodeManager:
        return self.servicer.manager


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 built from a config, shared by the inference tests of this folder."""
    from wolfpack_inference.models import tiny_model

    return tiny_model(tmp_path_factory.mktemp("models"))


@pytest.fixture
def env_limits() -> Limits:
    return Limits(max_episodes=200, max_text_chars=2_000)


@pytest.fixture
async def env(env_limits: Limits) -> AsyncIterator[EnvStack]:
    settings = load_settings(rpc_timeout_s=20)
    servicer = EnvironmentServicer(EpisodeManager(env_limits))
    server = await rpc.start_server("environment", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    target = f"127.0.0.1:{server.port}"
    async with EnvironmentClient(target, settings) as client:
        yield EnvStack(servicer, server, client, settings, target)
    servicer.manager.close_all()
    await server.stop(0)


@pytest.fixture
def gateway_config() -> GatewayConfig:
    return GatewayConfig(env_target="", header_timeout_s=1.0, max_connections=64)


@pytest.fixture
async def gateway(env: EnvStack, gateway_config: GatewayConfig) -> AsyncIterator[RunningGateway]:
    cfg = GatewayConfig(**{**gateway_config.__dict__, "env_target": env.target})
    running = await start_gateway("127.0.0.1", 0, env.target, settings=env.settings, config=cfg)
    yield running
    await running.stop()
