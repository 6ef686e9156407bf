"""Rollout honours the stream's backpressure: with a lagging consumer group the appends are refused,
the driver waits and retries (starting no new episode meanwhile), and once the group catches up every
trajectory arrives exactly once."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import redis.asyncio as aioredis

from wolfpack import rpc
from wolfpack.stream import ProtoStreamConsumer, ProtoStreamProducer
from wolfpack.v1 import trajectory_pb2
from wolfpack_curriculum.client import CurriculumClient
from wolfpack_curriculum.config import CurriculumConfig
from wolfpack_curriculum.server import CurriculumServicer, register
from wolfpack_curriculum.store import CurriculumStore
from wolfpack_environment.client import EnvironmentClient
from wolfpack_rollout.driver import RolloutConfig, RolloutDriver, SamplingConfig


async def test_backpressure_slows_rollout_and_loses_nothing(
    stack: Any, redis_client: aioredis.Redis, stream_key: str
) -> None:
    cfg = CurriculumConfig.model_validate(
        {"policy_id": "learner", "key_prefix": f"test:bp:{uuid.uuid4().hex}"}
    )
    cur_server = await rpc.start_server(
        "curriculum", lambda s: register(s, CurriculumServicer(CurriculumStore(redis_client, cfg))),
        stack.settings, "127.0.0.1:0",
    )  # fmt: skip
    consumer = ProtoStreamConsumer(
        redis_client, stream_key, "trainer", "t0", trajectory_pb2.Trajectory, block_ms=50
    )
    await consumer.ensure_group()  # a group that does not read yet: the backlog grows
    producer: ProtoStreamProducer[trajectory_pb2.Trajectory] = ProtoStreamProducer(
        redis_client, stream_key, id_of=lambda t: t.trajectory_id, maxlen=2, backpressure_timeout_s=0.2
    )
    config = RolloutConfig(concurrency=4, sampling=SamplingConfig(max_tokens=8), backpressure_retry_s=0.05)
    async with (
        EnvironmentClient(stack.environment, stack.settings) as env,
        rpc.channel(stack.inference, stack.settings) as inference,
        rpc.channel(stack.reward, stack.settings) as reward,
        CurriculumClient(f"127.0.0.1:{cur_server.port}", stack.settings) as curriculum,
    ):
        driver = RolloutDriver(
            config, environment=env, inference_channel=inference, reward_channel=reward,
            curriculum=curriculum, producer=producer,
        )  # fmt: skip
        run = asyncio.create_task(driver.run(8))
        for _ in range(600):  # bounded wait (60 s) for the driver to hit the bound
            if driver.stats.backpressure_waits or run.done():
                break
            await asyncio.sleep(0.1)
        assert driver.stats.backpressure_waits >= 1, "appends past the bound were refused and retried"
        assert await redis_client.xlen(stream_key) <= 3, "the backlog stays near its bound while nobody acks"
        assert driver.stats.in_flight <= config.concurrency
        received: list[str] = []
        while not (run.done() and len(received) >= driver.stats.episodes_finished):  # the trainer catches up
            batch = await consumer.read()
            received += [d.message.trajectory_id for d in batch]
            await consumer.ack(batch)
        summary = await run
        await driver.close()
    await cur_server.stop(0)
    assert summary.failed == 0 and summary.episodes == 8
    # each refused append waited backpressure_retry_s (asyncio.sleep never returns early) and was counted
    waits = driver.stats.backpressure_waits
    assert (
        summary.backpressure_wait_s
        == driver.stats.backpressure_wait_s
        >= 0.9 * waits * config.backpressure_retry_s
    )
    assert sorted(received) == sorted(t.trajectory_id for t in driver.trajectories), "each exactly once"
