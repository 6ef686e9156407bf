"""The stream consumer loop on a real Redis stream: it keeps reading through an idle stream and through a
failed read (backing off first), and returns how many entries it recorded once stopped."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from wolfpack.stream import Delivery, ProtoStreamConsumer, ProtoStreamProducer
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_curriculum import consumer as consumer_module
from wolfpack_curriculum.config import CurriculumConfig
from wolfpack_curriculum.consumer import consume
from wolfpack_curriculum.store import CurriculumStore

Trajectory = trajectory_pb2.Trajectory
BUCKET = "werewolf_v1/6p"


class WatchedConsumer(ProtoStreamConsumer[Trajectory]):
    """The real consumer, with its first ``fail`` reads failing as if Redis were away, and an event set
    once it has come back empty-handed twice (the loop went round an idle stream)."""

    def __init__(self, *args: object, fail: int = 0, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fail, self.reads, self.empty = fail, 0, 0
        self.idle = asyncio.Event()

    async def read(self) -> list[Delivery[Trajectory]]:
        self.reads += 1
        if self.reads <= self.fail:
            raise ConnectionError("redis away (injected by the test)")
        out = await super().read()
        if not out:
            self.empty += 1
            if self.empty >= 2:
                self.idle.set()
        return out


@pytest.fixture
async def parts(redis_url: str) -> AsyncIterator[tuple[aioredis.Redis, CurriculumStore, str]]:
    client = aioredis.Redis.from_url(redis_url)
    cfg = CurriculumConfig.model_validate({"key_prefix": f"test:consumer:{uuid.uuid4().hex}"})
    yield client, CurriculumStore(client, cfg), f"test:consumer:stream:{uuid.uuid4().hex}"
    await client.aclose()


def producer(client: aioredis.Redis, stream: str) -> ProtoStreamProducer[Trajectory]:
    return ProtoStreamProducer(client, stream, id_of=lambda t: t.trajectory_id)


def scored(seed: int) -> Trajectory:
    traj = Trajectory(trajectory_id=uuid.uuid4().hex, task_id=f"{BUCKET}#{seed}/g", seed=seed)
    traj.metadata.update({"bucket": BUCKET, "opponent_id": "self:learner"})
    traj.trainee_seats.append(0)
    traj.outcomes.add(seat=0, outcome=common_pb2.OUTCOME_KIND_WIN, final_reward=1.0)
    return traj


async def recorded(store: CurriculumStore, n: int, reader: asyncio.Task[int]) -> None:
    while (await store.stats()).stream_outcomes < n:
        assert not reader.done(), "the consumer loop ended before recording"
        await asyncio.sleep(0.02)


async def test_an_idle_stream_does_not_end_the_loop(
    parts: tuple[aioredis.Redis, CurriculumStore, str],
) -> None:
    client, store, stream = parts
    watched = WatchedConsumer(client, stream, "curriculum", "c1", Trajectory, block_ms=20)
    stop = asyncio.Event()
    reader = asyncio.create_task(consume(store, watched, stop))

    async def idle() -> None:
        while not watched.idle.is_set():
            assert not reader.done(), "the consumer loop ended on an idle stream"
            await asyncio.sleep(0.01)

    await asyncio.wait_for(idle(), 30)  # generous bound for two empty 20 ms reads
    await producer(client, stream).append_many([scored(1), scored(2)])
    await asyncio.wait_for(recorded(store, 2, reader), 30)
    stop.set()
    assert await asyncio.wait_for(reader, 30) == 2
    assert await watched.pending_count() == 0


async def test_a_failed_read_is_logged_and_retried_after_a_pause(
    parts: tuple[aioredis.Redis, CurriculumStore, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, store, stream = parts
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:  # the consumer's back-off, recorded instead of waited
        pauses.append(seconds)
        await asyncio.sleep(0)

    monkeypatch.setattr(consumer_module, "_pause", sleep)
    await producer(client, stream).append_many([scored(1)])
    watched = WatchedConsumer(client, stream, "curriculum", "c1", Trajectory, block_ms=20, fail=2)
    stop = asyncio.Event()
    with caplog.at_level(logging.ERROR, logger=consumer_module.__name__):
        reader = asyncio.create_task(consume(store, watched, stop))
        await asyncio.wait_for(recorded(store, 1, reader), 30)
        stop.set()
        assert await asyncio.wait_for(reader, 30) == 1
    assert len(pauses) == 2 and all(p > 0 for p in pauses), "a pause after each failed read, not a hot loop"
    assert [r.message for r in caplog.records] == ["reading the trajectory stream failed"] * 2


async def test_stop_does_not_wait_out_a_blocked_read_and_loses_nothing(
    parts: tuple[aioredis.Redis, CurriculumStore, str],
) -> None:
    """A read blocking on an idle stream is abandoned when the loop is stopped (shutdown would otherwise
    wait out ``block_ms``); an entry appended afterwards is recorded by the next consumer."""
    client, store, stream = parts
    slow = WatchedConsumer(client, stream, "curriculum", "c1", Trajectory, block_ms=60_000)
    stop = asyncio.Event()
    reader = asyncio.create_task(consume(store, slow, stop))
    while slow.reads == 0:  # the loop is inside its first (blocking) read
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    stop.set()
    # a bound far below the read's 60 s block: the stop did not wait for it
    assert await asyncio.wait_for(reader, 20) == 0
    await producer(client, stream).append_many([scored(3)])
    again = WatchedConsumer(client, stream, "curriculum", "c2", Trajectory, block_ms=20)
    stop2 = asyncio.Event()
    reader2 = asyncio.create_task(consume(store, again, stop2))
    await asyncio.wait_for(recorded(store, 1, reader2), 30)
    stop2.set()
    assert await asyncio.wait_for(reader2, 30) == 1
