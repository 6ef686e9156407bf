"""Failures are retried, then counted by reason; a failed episode is never returned or appended."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from wolfpack import rpc
from wolfpack_environment.client import EnvironmentClient
from wolfpack_rollout.driver import RolloutConfig, RolloutDriver, SamplingConfig

FAST = RolloutConfig(concurrency=2, retries=2, backoff_s=0.01, sampling=SamplingConfig(max_tokens=8))


@pytest.fixture
def dead() -> Iterator[str]:
    """An address where nothing listens (UNAVAILABLE), held for the test: a socket bound but never
    listening refuses connections, and no other process can take its port meanwhile (as one could take a
    port picked free and closed)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{held.getsockname()[1]}"


async def test_unreachable_inference_fails_episodes_by_reason(
    stack: Any, tasks: dict[str, Any], dead: str
) -> None:
    async with (
        EnvironmentClient(stack.environment, stack.settings) as env,
        rpc.channel(dead, stack.settings) as inference,
        rpc.channel(stack.reward, stack.settings) as reward,
    ):
        driver = RolloutDriver(FAST, environment=env, inference_channel=inference, reward_channel=reward)
        played = await driver.play([tasks["werewolf"](41), tasks["bargaining"](42)])
        await driver.close()
    assert played == []
    assert driver.stats.failures == {"inference_unavailable": 2}
    assert driver.stats.retries >= FAST.retries, "retried with backoff before giving up"
    assert (driver.stats.episodes_failed, driver.stats.episodes_finished, driver.stats.in_flight) == (2, 0, 0)


async def test_unreachable_reward_fails_after_playing(stack: Any, tasks: dict[str, Any], dead: str) -> None:
    async with (
        EnvironmentClient(stack.environment, stack.settings) as env,
        rpc.channel(stack.inference, stack.settings) as inference,
        rpc.channel(dead, stack.settings) as reward,
    ):
        driver = RolloutDriver(FAST, environment=env, inference_channel=inference, reward_channel=reward)
        played = await driver.play([tasks["bargaining"](43)])
        await driver.close()
    assert played == [] and driver.stats.turns > 0, "the game was played, the scoring failed"
    assert driver.stats.failures == {"reward_unavailable": 1}
