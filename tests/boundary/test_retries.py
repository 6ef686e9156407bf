"""Client retries (``rpc.channel``'s service config) against a server that really answers UNAVAILABLE:
idempotent methods are retried until they succeed, others are not (a create must never run twice)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import environment_service_pb2 as env_pb
from wolfpack.v1 import environment_service_pb2_grpc as env_grpc
from wolfpack.v1 import reward_service_pb2 as pb
from wolfpack.v1 import reward_service_pb2_grpc as pb_grpc

# A broken build may hang (a stuck event loop) instead of failing: bound each test.
pytestmark = pytest.mark.timeout(120)


class Flaky(pb_grpc.RewardServiceServicer):
    """Answers UNAVAILABLE to the first ``failures`` calls of each method, then succeeds."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: dict[str, int] = {}

    async def _maybe_fail(self, method: str, context: Any) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        if self.calls[method] <= self.failures:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")

    async def ListRewardSpecs(self, request: pb.ListRewardSpecsRequest, context: Any) -> Any:
        await self._maybe_fail("ListRewardSpecs", context)
        return pb.ListRewardSpecsResponse(specs=[pb.RewardSpecInfo(spec="ok@1")])

    async def Score(self, request: pb.ScoreRequest, context: Any) -> Any:
        await self._maybe_fail("Score", context)
        return pb.ScoreResponse()


@pytest.fixture
async def flaky() -> AsyncIterator[tuple[Flaky, str]]:
    servicer = Flaky(failures=2)

    def register(server: grpc.aio.Server) -> list[str]:
        pb_grpc.add_RewardServiceServicer_to_server(servicer, server)
        return ["wolfpack.v1.RewardService"]

    server = await rpc.start_server("reward", register, load_settings(), "127.0.0.1:0")
    yield servicer, f"127.0.0.1:{server.port}"
    await server.stop(0)


async def test_idempotent_calls_are_retried_through_unavailable(flaky: tuple[Flaky, str]) -> None:
    servicer, target = flaky
    async with rpc.channel(target, load_settings(rpc_timeout_s=30)) as channel:
        response = await pb_grpc.RewardServiceStub(channel).ListRewardSpecs(pb.ListRewardSpecsRequest())
    assert [s.spec for s in response.specs] == ["ok@1"]
    assert servicer.calls["ListRewardSpecs"] == 3  # two UNAVAILABLE answers, then success


async def test_retries_are_bounded(flaky: tuple[Flaky, str]) -> None:
    servicer, target = flaky
    servicer.failures = 100
    async with rpc.channel(target, load_settings(rpc_timeout_s=30)) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pb_grpc.RewardServiceStub(channel).Score(pb.ScoreRequest())
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert servicer.calls["Score"] == 4  # maxAttempts of the service config


async def test_non_idempotent_calls_are_not_retried() -> None:
    """CreateEpisode is not idempotent (it is not in ``IDEMPOTENT_METHODS``): one UNAVAILABLE answer
    reaches the caller after exactly one attempt, so an episode is never created twice by a retry."""
    assert "CreateEpisode" not in rpc.IDEMPOTENT_METHODS["wolfpack.v1.EnvironmentService"]
    attempts = 0

    class Down(env_grpc.EnvironmentServiceServicer):
        async def CreateEpisode(self, request: env_pb.CreateEpisodeRequest, context: Any) -> Any:
            nonlocal attempts
            attempts += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")

    def register(server: grpc.aio.Server) -> list[str]:
        env_grpc.add_EnvironmentServiceServicer_to_server(Down(), server)
        return ["wolfpack.v1.EnvironmentService"]

    server = await rpc.start_server("environment", register, load_settings(), "127.0.0.1:0")
    try:
        async with rpc.channel(f"127.0.0.1:{server.port}", load_settings(rpc_timeout_s=30)) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await env_grpc.EnvironmentServiceStub(channel).CreateEpisode(env_pb.CreateEpisodeRequest())
    finally:
        await server.stop(0)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and attempts == 1
