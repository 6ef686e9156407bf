"""A real reward gRPC server on a free port, and the library's worked example trajectories
(``wolfpack_rewards.examples``) as fixtures."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import reward_service_pb2_grpc as pb_grpc
from wolfpack.v1 import trajectory_pb2
from wolfpack_games.scenarios import Scenario
from wolfpack_reward.server import register
from wolfpack_rewards import examples


@pytest.fixture
def ww() -> Callable[..., trajectory_pb2.Trajectory]:
    return examples.werewolf_trajectory


@pytest.fixture
def bargaining() -> Scenario:
    return examples.bargaining_scenario()


@pytest.fixture
def sc_traj() -> Callable[..., trajectory_pb2.Trajectory]:
    return examples.scenario_trajectory


@pytest.fixture
async def stub() -> AsyncIterator[pb_grpc.RewardServiceStub]:
    settings = load_settings(rpc_timeout_s=20)
    server = await rpc.start_server("reward", register, settings, "127.0.0.1:0")
    async with rpc.channel(f"127.0.0.1:{server.port}", settings) as ch:
        yield pb_grpc.RewardServiceStub(ch)
    await server.stop(0)
