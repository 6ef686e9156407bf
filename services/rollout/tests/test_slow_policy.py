"""A policy slower than the environment's turn timeout: the cause of the ``no_turns`` failures seen with
``wolfpack rollout`` on two cores (16 episodes in flight, SmolLM2): every decision is defaulted while the
model is still generating, the game ends among the bots, and the episode has no policy turn. The failure
must say so (and how to fix it), not only that the episode "ended before any policy seat acted"."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from wolfpack import rpc
from wolfpack.v1 import inference_service_pb2 as inf_pb
from wolfpack_environment.client import EnvironmentClient
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.policies import PolicyRegistry
from wolfpack_inference.server import register
from wolfpack_rollout.driver import RolloutConfig, RolloutDriver, SamplingConfig

from .conftest import POLICY, SpyInference, werewolf_task


class SlowInference(SpyInference):
    """The real servicer, answering each GenerateBatch only after ``delay_s`` (an overloaded CPU)."""

    def __init__(self, registry: PolicyRegistry, delay_s: float) -> None:
        super().__init__(registry)
        self.delay_s = delay_s
        self.calls = 0

    async def GenerateBatch(
        self, request: inf_pb.GenerateBatchRequest, context: Any
    ) -> AsyncIterator[inf_pb.GenerateBatchResponse]:  # type: ignore[override]
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        async for msg in super().GenerateBatch(request, context):
            yield msg


async def test_every_decision_timed_out_fails_no_turns_saying_why(
    stack: Any, tiny_dir: Path, tmp_path: Path
) -> None:
    cfg = PolicyConfig(policy_id=POLICY, model=str(tiny_dir), device="cpu", dtype="float32")
    registry = PolicyRegistry.from_configs([cfg], tmp_path)
    slow = SlowInference(registry, delay_s=60.0)  # never answers within the game
    server = await rpc.start_server("inference", lambda s: register(s, slow), stack.settings, "127.0.0.1:0")
    config = RolloutConfig(concurrency=1, turn_timeout_s=0.2, sampling=SamplingConfig(max_tokens=8))
    try:
        async with (
            EnvironmentClient(stack.environment, stack.settings) as env,
            rpc.channel(f"127.0.0.1:{server.port}", stack.settings) as inf,
            rpc.channel(stack.reward, stack.settings) as reward,
        ):
            driver = RolloutDriver(config, environment=env, inference_channel=inf, reward_channel=reward)
            played = await asyncio.wait_for(driver.play([werewolf_task(71)]), timeout=60)
    finally:
        await server.stop(0)
        await registry.close()
    assert played == [] and slow.calls >= 1, "the policy was asked, and never answered in time"
    assert driver.stats.failures == {"no_turns": 1} and driver.stats.turns == 0
    (failure,) = driver.stats.recent_failures
    assert failure.where == "werewolf_v1/6p seed 71"
    assert "decision(s) asked, none answered" in failure.detail and "turn timeout" in failure.detail
    assert "concurrency 1, max_tokens 8" in failure.detail, failure.detail
