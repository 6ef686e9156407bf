"""The curriculum service over real gRPC and a real Redis: tasks, idempotent outcomes, stream outcomes
through its own consumer group, league, and a restart that loses nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.stream import ProtoStreamConsumer, ProtoStreamProducer
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack.v1 import curriculum_service_pb2 as pb
from wolfpack_curriculum.client import CurriculumClient
from wolfpack_curriculum.config import CurriculumConfig
from wolfpack_curriculum.consumer import consume
from wolfpack_curriculum.server import CurriculumServicer, register
from wolfpack_curriculum.store import CurriculumStore


def config(prefix: str) -> CurriculumConfig:
    return CurriculumConfig.model_validate(
        {
            "key_prefix": prefix, "group_size": 2, "replay_ratio": 0.0,
            "buckets": [{"game_id": "werewolf_v1", "variant": "6p", "seats": {"trainee_seats": [3]}}],
        }
    )  # fmt: skip


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def serve(client: aioredis.Redis, cfg: CurriculumConfig) -> tuple[Any, str]:
    store = CurriculumStore(client, cfg)
    server = await rpc.start_server(
        "curriculum", lambda s: register(s, CurriculumServicer(store)), load_settings(), "127.0.0.1:0"
    )
    return server, f"127.0.0.1:{server.port}"


def outcome(task: pb.Task, success: bool, opponent: str = "scripted:heuristic") -> pb.TaskOutcome:
    return pb.TaskOutcome(
        task_id=task.task_id, bucket=task.bucket, trajectory_id=uuid.uuid4().hex, success=success,
        score=1.0 if success else 0.0, opponent_id=opponent, opponent_kind=pb.OPPONENT_KIND_SCRIPTED,
        fingerprint="you are the seer of a six player village",
    )  # fmt: skip


async def test_tasks_outcomes_and_a_restart(redis_client: aioredis.Redis) -> None:
    cfg = config(f"test:cur:{uuid.uuid4().hex}")
    server, addr = await serve(redis_client, cfg)
    async with CurriculumClient(addr, load_settings()) as cur:
        tasks = await cur.next_tasks(3, worker_id="w")
        assert len(tasks) == 4, "whole groups of 2"
        assert tasks[0].group_id == tasks[1].group_id != tasks[2].group_id
        assert tasks[0].seed != tasks[2].seed, "fresh seeds per group"
        assert list(tasks[0].trainee_seats) == [3]
        lost = outcome(tasks[0], False)
        assert await cur.report_outcomes([lost, outcome(tasks[2], True)]) == 2
        assert await cur.report_outcomes([lost]) == 0, "idempotent by trajectory id"
        before = await cur.get_stats()
    await server.stop(0)
    server, addr = await serve(redis_client, cfg)  # a new process would read the same Redis keys
    async with CurriculumClient(addr, load_settings()) as cur:
        after = await cur.get_stats()
        assert after == before
        [bucket] = after.buckets
        assert (bucket.scheduled, bucket.finished, bucket.failures) == (4, 2, 1)
        assert bucket.success_rate == pytest.approx(0.5)
        assert after.failure_history == 1 and after.outcomes == 2
        # the failed task's weight rose (1 + self_boost), the won one decayed (1 * 0.5)
        assert bucket.tasks == 2 and bucket.mean_task_weight == pytest.approx((2.0 + 0.5) / 2)
        more = await cur.next_tasks(1)
        assert more[0].seed not in {t.seed for t in tasks}, "the seed counter survived the restart"
        league = await cur.list_opponents()
        assert [o.opponent_id for o in league.opponents] == ["scripted:heuristic"]
        assert league.trainee_games == 2
    await server.stop(0)


async def test_eval_split_uses_held_out_seeds(redis_client: aioredis.Redis) -> None:
    cfg = config(f"test:cur:{uuid.uuid4().hex}")
    store = CurriculumStore(redis_client, cfg)
    tasks = await store.next_tasks(2, "eval")
    assert all(t.seed >= cfg.eval_seed_offset and t.split == "eval" for t in tasks)
    with pytest.raises(ValueError, match="split"):
        await store.next_tasks(1, "test")


async def test_league_ratings_from_a_strong_vs_weak_matchup(redis_client: aioredis.Redis) -> None:
    cfg = config(f"test:cur:{uuid.uuid4().hex}")
    server, addr = await serve(redis_client, cfg)
    async with CurriculumClient(addr, load_settings()) as cur:
        ckpt = pb.Opponent(opponent_id="checkpoint:learner@1", kind=pb.OPPONENT_KIND_CHECKPOINT)
        ckpt.policy.policy_id, ckpt.policy.version = "learner-v1", 1
        registered = await cur.register_opponent(ckpt)
        assert registered.created and registered.opponent.rating == cfg.league.initial_rating
        [task] = (await cur.next_tasks(1))[:1]
        for _ in range(10):
            await cur.report_outcomes(
                [outcome(task, False, "scripted:heuristic"), outcome(task, True, "scripted:random")]
            )
        table = await cur.list_opponents()
        ratings = {o.opponent_id: o.rating for o in table.opponents}
        assert ratings["scripted:heuristic"] > table.trainee_rating > ratings["scripted:random"]
        assert ratings["checkpoint:learner@1"] == cfg.league.initial_rating
        assert not (await cur.register_opponent(ckpt)).created
    await server.stop(0)


def scored(task: pb.Task, won: bool) -> trajectory_pb2.Trajectory:
    traj = trajectory_pb2.Trajectory(trajectory_id=uuid.uuid4().hex, task_id=task.task_id, seed=task.seed)
    traj.game.CopyFrom(task.game)
    traj.seats.extend(task.seats)
    traj.trainee_seats.extend(task.trainee_seats)
    traj.metadata.update({"bucket": task.bucket,
                          "opponent_id": task.opponent_id, "opponent_kind": "OPPONENT_KIND_SCRIPTED"})  # fmt: skip
    traj.turns.add(seat=3, observation_text="you are a villager", valid=True)
    kind = common_pb2.OUTCOME_KIND_WIN if won else common_pb2.OUTCOME_KIND_LOSS
    traj.outcomes.add(
        seat=3, role="villager", team="village", outcome=kind, final_reward=1.0 if won else -1.0
    )
    return traj


async def test_outcomes_from_the_stream_through_its_own_group(redis_client: aioredis.Redis) -> None:
    cfg = config(f"test:cur:{uuid.uuid4().hex}")
    stream = f"test:cur:stream:{uuid.uuid4().hex}"
    store = CurriculumStore(redis_client, cfg)
    tasks = await store.next_tasks(3, "train")
    producer: ProtoStreamProducer[trajectory_pb2.Trajectory] = ProtoStreamProducer(
        redis_client, stream, id_of=lambda t: t.trajectory_id
    )
    trajs = [scored(tasks[0], True), scored(tasks[1], False), scored(tasks[2], False)]
    await producer.append_many(trajs)
    consumer = ProtoStreamConsumer(
        redis_client, stream, cfg.stream_group, "c1", trajectory_pb2.Trajectory, block_ms=50
    )
    stop = asyncio.Event()
    reader = asyncio.create_task(consume(store, consumer, stop))
    for _ in range(3000):  # bounded wait (60 s; milliseconds normally) for the consumer to record three
        if (await store.stats()).stream_outcomes == 3:
            break
        await asyncio.sleep(0.02)
    stop.set()
    assert await asyncio.wait_for(reader, 30) == 3
    stats = await store.stats()
    assert (stats.outcomes, stats.stream_outcomes) == (3, 3)
    assert stats.buckets[0].failures == 2
    # an RPC report of a trajectory the stream already delivered changes nothing
    from wolfpack_curriculum.client import outcome_of

    assert await store.record([outcome_of(trajs[0])]) == 0
    assert await consumer.pending_count() == 0, "acked after recording"
