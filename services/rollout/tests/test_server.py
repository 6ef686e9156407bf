"""The rollout service as a process would run it: a driver playing from a curriculum into the stream,
reporting through GetRolloutStatus over real gRPC."""

from __future__ import annotations

import uuid
from typing import Any

import redis.asyncio as aioredis

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import rollout_service_pb2 as pb
from wolfpack.v1 import rollout_service_pb2_grpc as pb_grpc
from wolfpack_curriculum.client import CurriculumClient
from wolfpack_curriculum.config import CurriculumConfig
from wolfpack_curriculum.server import CurriculumServicer
from wolfpack_curriculum.server import register as register_curriculum
from wolfpack_curriculum.store import CurriculumStore
from wolfpack_rollout.client import Addresses, connect
from wolfpack_rollout.config import RolloutConfig, SamplingConfig
from wolfpack_rollout.server import RolloutServicer, register


async def test_run_from_the_curriculum_into_the_stream_with_status(
    stack: Any, redis_url: str, redis_client: aioredis.Redis, stream_key: str
) -> None:
    cfg = CurriculumConfig.model_validate(
        {"policy_id": "learner", "group_size": 2, "key_prefix": f"test:ro:{uuid.uuid4().hex}"}
    )
    store = CurriculumStore(redis_client, cfg)
    cur_server = await rpc.start_server(
        "curriculum",
        lambda s: register_curriculum(s, CurriculumServicer(store)),
        stack.settings,
        "127.0.0.1:0",
    )
    servicer = RolloutServicer()
    ro_server = await rpc.start_server(
        "rollout", lambda s: register(s, servicer), stack.settings, "127.0.0.1:0"
    )
    addresses = Addresses(
        stack.environment,
        stack.inference,
        stack.reward,
        f"127.0.0.1:{cur_server.port}",
        redis_url,
        stream_key,
    )
    config = RolloutConfig(concurrency=8, sampling=SamplingConfig(max_tokens=8))
    async with connect(stack.settings, config, addresses) as driver:
        servicer.stats, servicer.worker_id = driver.stats, driver.worker_id
        summary = await driver.run(6)
        first = list(driver.trajectories)
        again = await driver.run(2)  # a second run's summary counts its own episodes and tokens only
        assert again.episodes == 2 and again.failed == 0, again.failures
        tokens = sum(len(t.response_token_ids) for tr in driver.trajectories for t in tr.turns)
        assert 0 < again.generated_tokens == tokens < driver.stats.generated_tokens
        driver.trajectories = first
    assert summary.episodes == 6 and summary.failed == 0, summary.failures
    assert summary.trainee_turns > 0 and set(summary.win_rate_by_opponent) == {"scripted"}
    assert await redis_client.xlen(stream_key) == 8
    groups: dict[str, int] = {}
    for traj in driver.trajectories:
        groups[traj.group_id] = groups.get(traj.group_id, 0) + 1
        assert traj.group_size == 2
    assert sorted(groups.values()) == [2, 2, 2], "whole groups of the same task and seed"
    async with rpc.channel(f"127.0.0.1:{ro_server.port}", load_settings()) as ch:
        status = await pb_grpc.RolloutServiceStub(ch).GetRolloutStatus(pb.GetRolloutStatusRequest())
    assert (status.episodes_finished, status.episodes_failed, status.episodes_in_flight) == (8, 0, 0)
    assert status.turns == summary.trainee_turns + again.trainee_turns and status.worker_id
    async with CurriculumClient(f"127.0.0.1:{cur_server.port}", stack.settings) as cur:
        stats = await cur.get_stats()
    assert sum(b.scheduled for b in stats.buckets) == 8
    for server in (cur_server, ro_server):
        await server.stop(0)
