"""The stream's documented numbers and edges (docs/architecture.md, "Trajectory stream"), each against a
real Redis except the retry schedule, which runs on a fake clock so it can be checked exactly:

- retries back off exponentially from 20 ms, doubling to at most 1 s, jittered to 50-100 %, until the
  retry window would be overrun;
- the reclaim cadence: every ``reclaim_interval_ms`` (default half of ``claim_idle_ms``, at most 10 s), at
  once again while a scan comes back full; entries delivered once come back together, suspects alone;
- one append round trip per 1000 messages; message ids remembered for 7 days (hashes expire after two
  periods);
- a hand-written entry whose values look like field names is still read field by field.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from types import SimpleNamespace
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from wolfpack import stream
from wolfpack.stream import ProtoStreamConsumer, ProtoStreamProducer, RetryPolicy, StreamUnavailableError
from wolfpack.v1.common_pb2 import GameRef
from wolfpack.v1.trajectory_pb2 import Trajectory

WEEK_S = 7 * 24 * 60 * 60  # 604,800 s: the documented dedup period


def traj(i: int | str) -> Trajectory:
    return Trajectory(trajectory_id=f"t-{i}", episode_id=f"e-{i}", game=GameRef(game_id="werewolf_v1"))


def producer(client: aioredis.Redis, key: str, **kw: Any) -> ProtoStreamProducer[Trajectory]:
    return ProtoStreamProducer(client, key, id_of=lambda t: t.trajectory_id, **kw)


def consumer(client: aioredis.Redis, key: str, name: str, **kw: Any) -> ProtoStreamConsumer[Trajectory]:
    return ProtoStreamConsumer(client, key, "trainer", name, Trajectory, **kw)


class FakeClock:
    """``time.monotonic`` and ``asyncio.sleep`` for the stream module only: sleeping advances the clock."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def install(monkeypatch: pytest.MonkeyPatch, clock: FakeClock, jitter: float | None = None) -> None:
    monkeypatch.setattr(stream, "time", SimpleNamespace(monotonic=clock.monotonic, time=time.time))
    if jitter is not None:
        monkeypatch.setattr(stream, "asyncio", SimpleNamespace(sleep=clock.sleep))
        monkeypatch.setattr(stream, "random", SimpleNamespace(random=lambda: jitter))


# --------------------------------------------------------------------------- retries (fake clock)


def always_down(attempts: list[float], clock: FakeClock, limit: int = 100) -> Any:
    async def op() -> None:
        attempts.append(clock.now)
        if len(attempts) > limit:
            raise AssertionError("retrying never gave up")
        raise RedisConnectionError("connection refused")

    return op


@pytest.mark.parametrize(
    ("jitter", "sleeps"),
    [
        # random() = 1: the full backoff. Attempts at t = 0, .02, .06, .14, .30, .62, 1.26, 2.26; the next
        # backoff (1 s) would end at 3.26 > 3, so the eighth failure is final.
        (1.0, [0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0]),
        # random() = 0: half of each backoff. The window is checked against the full backoff, so the
        # schedule runs longer before it would be overrun (attempts at t = 0, .01, .03, .07, .15, .31,
        # .63, 1.13, 1.63, 2.13; then 2.13 + 1 > 3).
        (0.0, [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5, 0.5]),
    ],
)
async def test_retry_backoff_doubles_from_20_ms_to_1_s_with_jitter(
    monkeypatch: pytest.MonkeyPatch, jitter: float, sleeps: list[float]
) -> None:
    clock = FakeClock(0.0)
    install(monkeypatch, clock, jitter)
    attempts: list[float] = []
    with pytest.raises(StreamUnavailableError, match=r"append to s: Redis unreachable for 3\.0s"):
        await stream.retrying(always_down(attempts, clock), RetryPolicy(timeout_s=3.0), "append to s")
    assert clock.sleeps == pytest.approx(sleeps)
    assert len(attempts) == len(sleeps) + 1


async def test_retry_returns_once_redis_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock(0.0)
    install(monkeypatch, clock, 1.0)
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise OSError("reset by peer")
        return "ok"

    assert await stream.retrying(flaky, RetryPolicy(timeout_s=3.0), "x") == "ok"
    assert clock.sleeps == pytest.approx([0.02, 0.04])


async def test_retry_window_shorter_than_the_first_backoff_fails_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock(0.0)
    install(monkeypatch, clock, 1.0)
    attempts: list[float] = []
    with pytest.raises(StreamUnavailableError):
        await stream.retrying(always_down(attempts, clock), RetryPolicy(timeout_s=0.01), "x")
    assert len(attempts) == 1 and clock.sleeps == []


def test_the_shared_default_retry_policy_cannot_be_changed() -> None:
    """Every producer and consumer built without ``retry=`` shares one default instance."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        RetryPolicy().timeout_s = 1.0  # type: ignore[misc]


# --------------------------------------------------------------------------- reclaim cadence


@pytest.mark.parametrize(
    ("claim_idle_ms", "interval_s"), [(1_000, 0.5), (15_000, 7.5), (20_000, 10.0), (60_000, 10.0), (3, 0.001)]
)
def test_default_reclaim_interval_is_half_the_claim_idle_at_most_10_s(
    claim_idle_ms: int, interval_s: float
) -> None:
    client = aioredis.Redis()  # never connected
    c = consumer(client, "s", "c", claim_idle_ms=claim_idle_ms)
    assert c.reclaim_interval_s == pytest.approx(interval_s)
    assert (
        consumer(client, "s", "c", claim_idle_ms=claim_idle_ms, reclaim_interval_ms=0).reclaim_interval_s == 0
    )


async def idle_for(client: aioredis.Redis, key: str, count: int, idle_ms: int) -> None:
    """Wait (bounded) until ``count`` entries are pending and each has been idle at least ``idle_ms``."""
    for _ in range(3000):  # generous: the shared box may be slow
        pending = await client.xpending_range(key, "trainer", min="-", max="+", count=count + 1)
        if len(pending) == count and all(int(p["time_since_delivered"]) >= idle_ms for p in pending):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} entries never became idle for {idle_ms} ms")


async def test_reclaim_scans_on_its_interval_only(
    monkeypatch: pytest.MonkeyPatch, redis_client: aioredis.Redis, stream_key: str
) -> None:
    """A scan that found less than a page waits ``reclaim_interval_ms`` before the next one, then scans
    at the interval exactly (the consumer's clock is frozen here, so only it decides)."""
    clock = FakeClock(1000.0)
    install(monkeypatch, clock)
    b = consumer(redis_client, stream_key, "B", claim_idle_ms=5, reclaim_interval_ms=60_000, block_ms=10)
    await b.ensure_group()
    assert await b.read() == []  # scans at t = 1000: nothing pending; the next scan is due at 1060
    await producer(redis_client, stream_key).append(traj(1))
    dead = consumer(redis_client, stream_key, "A", block_ms=10)
    assert len(await dead.read()) == 1  # A dies holding it
    await idle_for(redis_client, stream_key, 1, 10)
    clock.now = 1059.999
    assert await b.read() == [] and b.reclaimed == 0, "no scan before the interval"
    clock.now = 1060.0
    [again] = await b.read()
    assert again.message.trajectory_id == "t-1" and again.deliveries == 2 and b.reclaimed == 1


async def test_a_full_scan_page_scans_again_on_the_next_read(
    monkeypatch: pytest.MonkeyPatch, redis_client: aioredis.Redis, stream_key: str
) -> None:
    clock = FakeClock(2000.0)  # frozen: the interval never passes
    install(monkeypatch, clock)
    await producer(redis_client, stream_key).append_many([traj(i) for i in range(3)])
    dead = consumer(redis_client, stream_key, "A", block_ms=10)
    assert len(await dead.read()) == 3
    await idle_for(redis_client, stream_key, 3, 10)
    c = consumer(
        redis_client, stream_key, "C", batch=2, claim_idle_ms=5, reclaim_interval_ms=60_000, block_ms=10
    )
    first = await c.read()  # a full page of 2: due again at once
    assert [d.message.trajectory_id for d in first] == ["t-0", "t-1"]
    await c.ack(first)
    [last] = await c.read()
    assert last.message.trajectory_id == "t-2"
    await c.ack([last])
    assert await c.read() == [] and c.reclaimed == 3  # that scan was not full: the next waits 60 s


async def test_entries_delivered_once_come_back_together_suspects_alone(
    redis_client: aioredis.Redis, stream_key: str
) -> None:
    """Three entries held by a consumer that died come back in one read; held again by a consumer that
    died too (delivered twice now), each comes back alone; past ``max_deliveries`` they are dead letters."""
    await producer(redis_client, stream_key).append_many([traj(i) for i in range(3)])
    first = consumer(redis_client, stream_key, "A", block_ms=10)
    assert len(await first.read()) == 3

    def reclaimer(name: str) -> ProtoStreamConsumer[Trajectory]:
        return consumer(
            redis_client,
            stream_key,
            name,
            claim_idle_ms=300,  # an entry just claimed is not idle again by the next read
            reclaim_interval_ms=0,
            max_deliveries=3,
            block_ms=10,
        )

    second = reclaimer("B")
    await idle_for(redis_client, stream_key, 3, 310)
    together = await second.read()
    assert sorted(d.message.trajectory_id for d in together) == ["t-0", "t-1", "t-2"]
    assert {d.deliveries for d in together} == {2}
    # B dies holding them too: each is now a suspect
    third = reclaimer("C")
    await idle_for(redis_client, stream_key, 3, 310)
    alone = [await third.read() for _ in range(3)]
    assert [len(got) for got in alone] == [1, 1, 1]
    assert sorted(got[0].message.trajectory_id for got in alone) == ["t-0", "t-1", "t-2"]
    assert {got[0].deliveries for got in alone} == {3}
    # C dies as well: a fourth delivery would pass max_deliveries = 3
    fourth = reclaimer("D")
    await idle_for(redis_client, stream_key, 3, 310)
    for _ in range(3):
        assert await fourth.read() == []
    assert fourth.dead_lettered == 3 and await fourth.pending_count() == 0
    assert await redis_client.xlen(stream.dead_letter_key(stream_key)) == 3


# --------------------------------------------------------------------------- append: round trips, dedup period


async def test_one_append_round_trip_per_thousand_messages(
    redis_client: aioredis.Redis, stream_key: str
) -> None:
    calls: list[int] = []
    real = redis_client.evalsha

    async def counted(sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        calls.append(len(keys_and_args))
        return await real(sha, numkeys, *keys_and_args)

    prod = producer(redis_client, stream_key)
    await producer(redis_client, f"{stream_key}:warm").append(traj("warm"))  # the script is cached
    redis_client.evalsha = counted  # type: ignore[method-assign]
    try:
        ids = await prod.append_many([traj(i) for i in range(2000)])
        assert len(calls) == 2, "2000 messages: two round trips"
        ids += await prod.append_many([traj(i) for i in range(2000, 3001)])
        assert len(calls) == 4, "1001 messages: two more"
    finally:
        del redis_client.evalsha
    assert len(set(ids)) == 3001 and await redis_client.xlen(stream_key) == 3001
    entries = await redis_client.xrange(stream_key)
    assert [e.decode() for e, _f in entries] == ids, "entries in order, one per message"


async def test_message_ids_are_remembered_for_a_week_by_default(
    redis_client: aioredis.Redis, stream_key: str
) -> None:
    before = int(time.time()) // WEEK_S
    await producer(redis_client, stream_key).append(traj(1))
    after = int(time.time()) // WEEK_S
    [key] = await redis_client.keys(f"{stream_key}:ids:*")
    assert int(key.decode().rsplit(":", 1)[1]) in {before, after}, "one hash per 7-day period"
    ttl = await redis_client.ttl(key)
    assert 2 * WEEK_S - 60 <= ttl <= 2 * WEEK_S, "a period's hash expires two periods after its last write"


# --------------------------------------------------------------------------- hand-written entries


async def test_values_that_look_like_field_names_are_values(
    redis_client: aioredis.Redis, stream_key: str
) -> None:
    """Fields are read in (name, value) pairs: an entry whose id is literally "data" (written by hand,
    the id field first) still yields its real data and that id."""
    c = consumer(redis_client, stream_key, "A", block_ms=10)
    await c.ensure_group()
    payload = traj("x").SerializeToString()
    await redis_client.xadd(stream_key, {b"id": b"data", b"data": payload})
    [d] = await c.read()
    assert d.message == traj("x") and d.message_id == "data" and c.dead_lettered == 0
