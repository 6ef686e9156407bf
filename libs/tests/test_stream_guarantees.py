"""The stream's guarantees against a real server: no silent loss under lag, backpressure, idempotent
retries, poison isolation, group recreation, and exactly-once processing across a Redis restart."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from wolfpack.redis_server import EmbeddedRedis
from wolfpack.settings import load_settings
from wolfpack.stream import (
    Delivery,
    ProtoStreamConsumer,
    ProtoStreamProducer,
    RetryPolicy,
    StreamBackpressureError,
    _flat_entries,
    dead_letter_key,
    retrying,
)
from wolfpack.v1.common_pb2 import GameRef
from wolfpack.v1.trajectory_pb2 import Trajectory

# A trainer's commit, idempotent under retries: count an entry as processed only if this ack removed it
# from the pending list. An entry delivered twice because a reply was lost counts once; a duplicate
# entry on the stream, or an acked entry delivered again, would count twice (what the tests look for).
COMMIT = """
for i = 1, #ARGV, 2 do
  if redis.call('XACK', KEYS[1], 'trainer', ARGV[i]) == 1 then redis.call('HINCRBY', KEYS[2], ARGV[i + 1], 1) end
end
"""


def traj(i: int | str, task: str = "") -> Trajectory:
    return Trajectory(trajectory_id=f"t-{i}", task_id=task, game=GameRef(game_id="werewolf_v1"))


def producer(client: aioredis.Redis, key: str, **kw: Any) -> ProtoStreamProducer[Trajectory]:
    return ProtoStreamProducer(client, key, id_of=lambda t: t.trajectory_id, **kw)


def consumer(
    client: aioredis.Redis, key: str, group: str, name: str, **kw: Any
) -> ProtoStreamConsumer[Trajectory]:
    return ProtoStreamConsumer(client, key, group, name, Trajectory, **kw)


async def drain(c: ProtoStreamConsumer[Trajectory], seen: list[str], *, ack: bool = True) -> None:
    """Read until a read comes back empty, recording trajectory ids (and acking them)."""
    while got := await c.read():
        seen.extend(d.message.trajectory_id for d in got)
        if ack:
            await c.ack(got)


async def test_lagging_group_loses_nothing_and_producers_get_backpressure(
    redis_client: aioredis.Redis, stream_key: str
) -> None:
    """The issue's loss case: a bound of 100, one group keeping up and one lagging with 30 entries held by
    a consumer that never acks. Nothing the lagging group has not acked is trimmed; appends past the
    bound wait and then raise; once the group catches up, appends resume and it receives every entry."""
    prod = producer(redis_client, stream_key, maxlen=100, backpressure_timeout_s=0.2)
    fast = consumer(redis_client, stream_key, "fast", "f", batch=50, block_ms=10)
    slow = consumer(redis_client, stream_key, "slow", "s", batch=30, block_ms=10)
    await fast.ensure_group()
    await slow.ensure_group()
    fast_seen: list[str] = []
    slow_seen: list[str] = []

    await prod.append_many([traj(i) for i in range(60)])
    await drain(fast, fast_seen)
    held = await slow.read()  # a consumer that will die holding these
    assert len(held) == 30

    appended = 60
    with pytest.raises(StreamBackpressureError) as err:
        while True:
            await prod.append_many([traj(i) for i in range(appended, appended + 10)])
            appended += 10
    assert appended == 100, "appends are admitted while the backlog is under the bound"
    assert err.value.backlog == 100 and prod.backpressure_waits == 1
    assert await prod.backlog() == 100
    assert await redis_client.xlen(stream_key) == 100, "nothing the slow group needs was trimmed"

    # The slow group catches up (the held entries are acked late, as after a reclaim).
    slow_seen += [d.message.trajectory_id for d in held]
    await slow.ack(held)
    await drain(slow, slow_seen)
    await drain(fast, fast_seen)
    assert await prod.backlog() == 0, "entries every group acked are trimmed"

    await prod.append_many([traj(i) for i in range(100, 200)])
    await drain(slow, slow_seen)
    await drain(fast, fast_seen)
    expected = [f"t-{i}" for i in range(200)]
    assert slow_seen == expected and fast_seen == expected


async def test_without_any_group_nothing_is_trimmed(redis_client: aioredis.Redis, stream_key: str) -> None:
    """A producer that starts before its consumers keeps everything up to the bound, then waits: a group
    created later from the beginning receives all of it."""
    prod = producer(redis_client, stream_key, maxlen=5, backpressure_timeout_s=0.05)
    await prod.append_many([traj(i) for i in range(5)])
    with pytest.raises(StreamBackpressureError):
        await prod.append(traj(5))
    late = consumer(redis_client, stream_key, "late", "l", block_ms=10)
    seen: list[str] = []
    await drain(late, seen)
    assert seen == [f"t-{i}" for i in range(5)]


async def test_retry_after_a_lost_reply_appends_once(
    redis_client: aioredis.Redis, stream_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append reaches Redis but its reply is lost (connection dropped): the producer retries, and the
    retry must not put a second copy of any message on the stream."""
    real = redis_client.evalsha
    calls = 0

    async def reply_lost_once(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        result = await real(*args, **kwargs)
        if calls == 1:
            raise RedisConnectionError("connection lost before the reply")
        return result

    prod = producer(redis_client, stream_key)
    await producer(redis_client, f"{stream_key}:warm").append(traj(0))  # script cached: EVALSHA succeeds
    monkeypatch.setattr(redis_client, "evalsha", reply_lost_once)
    ids = await prod.append_many([traj(i) for i in range(20)])
    assert calls == 2
    entries = await redis_client.xrange(stream_key)
    assert [e.decode() for e, _f in entries] == ids
    assert prod.duplicates == 20, "the retry found every message already appended"


async def test_a_message_id_twice_in_one_batch_is_appended_once(
    redis_client: aioredis.Redis, stream_key: str
) -> None:
    """Dedup also holds within a batch, and across the per-period id hashes' boundary (the previous
    period's hash is consulted too)."""
    prod = producer(redis_client, stream_key)
    first, again = await prod.append_many([traj(1), traj(1)])
    assert first == again and await redis_client.xlen(stream_key) == 1
    [older] = [k for k in await redis_client.keys(f"{stream_key}:ids:*")]
    bucket = int(older.decode().rsplit(":", 1)[1])
    await redis_client.rename(older, f"{stream_key}:ids:{bucket - 1}")  # as if appended a period ago
    assert await prod.append(traj(1)) == first and await redis_client.xlen(stream_key) == 1


async def test_poison_mixed_into_valid_traffic_dead_letters_only_the_poison(
    redis_client: aioredis.Redis, stream_key: str
) -> None:
    """Five messages crash their consumer (it dies holding its whole batch), one entry has no data and
    one does not parse. Each crash abandons the consumer and a fresh one takes over, as a restarted
    process would. Only the seven bad entries reach the dead-letter stream; each valid one is processed
    exactly once."""
    prod = producer(redis_client, stream_key)
    crashy = {f"t-crash-{k}" for k in range(5)}
    valid = [f"t-{i}" for i in range(150)]
    for i in range(150):
        if i % 30 == 7:
            await prod.append(traj(f"crash-{i // 30}", task="crash"))
        if i == 50:
            await redis_client.xadd(stream_key, {b"id": b"no-data"})
        if i == 90:
            await redis_client.xadd(stream_key, {b"data": b"\xff\xff\xff garbage", b"id": b"garbled"})
        await prod.append(traj(i))
    total = 150 + 5 + 2

    def fresh(gen: int) -> ProtoStreamConsumer[Trajectory]:
        return consumer(
            redis_client, stream_key, "trainer", f"w{gen}",
            batch=20, block_ms=20, claim_idle_ms=30, reclaim_interval_ms=0, max_deliveries=3,
        )  # fmt: skip

    gen = 0
    c = fresh(gen)
    await c.ensure_group()
    processed: collections.Counter[str] = collections.Counter()
    dead_total = 0
    for _ in range(3000):  # bounded: each crash costs a few reads of claim_idle_ms
        got = await c.read()
        if any(d.message.task_id == "crash" for d in got):
            dead_total += c.dead_lettered
            gen += 1
            c = fresh(gen)  # the crashed consumer's batch stays pending on it
            continue
        processed.update(d.message.trajectory_id for d in got)
        await c.ack(got)
        if sum(processed.values()) + dead_total + c.dead_lettered == total:
            break
    dead = await redis_client.xrange(dead_letter_key(stream_key))
    dead_ids = {f[b"id"].decode() for _e, f in dead}
    assert dead_ids == crashy | {"no-data", "garbled"}, "only the bad entries are dead-lettered"
    assert sorted(processed) == sorted(valid) and set(processed.values()) == {1}
    reasons = {f[b"id"].decode(): f[b"reason"].decode() for _e, f in dead}
    assert reasons["no-data"] == "malformed entry: no data field"
    assert reasons["garbled"].startswith("undecodable Trajectory")
    assert all("after 3 deliveries" in reasons[t] for t in crashy)
    assert await c.pending_count() == 0


async def test_consumer_recreates_a_vanished_group_and_resumes(
    redis_client: aioredis.Redis, stream_key: str
) -> None:
    """A Redis that restarted without its data (or an operator's XGROUP DESTROY) leaves consumers with
    NOGROUP: the consumer recreates its group from the start of the stream and keeps reading."""
    prod = producer(redis_client, stream_key)
    c = consumer(redis_client, stream_key, "trainer", "A", block_ms=10)
    await prod.append_many([traj(i) for i in range(3)])
    seen: list[str] = []
    await drain(c, seen)
    await redis_client.xgroup_destroy(stream_key, "trainer")
    await prod.append_many([traj(i) for i in range(3, 5)])
    await drain(c, seen)
    assert seen[:3] == ["t-0", "t-1", "t-2"]
    assert {"t-3", "t-4"} <= set(seen[3:]), "entries appended after the loss are delivered"


async def test_ack_in_commits_with_the_callers_writes(redis_client: aioredis.Redis, stream_key: str) -> None:
    """A trainer that records its progress in Redis acks in the same transaction: both or neither."""
    await producer(redis_client, stream_key).append(traj(1))
    c = consumer(redis_client, stream_key, "trainer", "A", block_ms=10)
    got = await c.read()
    pipe = redis_client.pipeline(transaction=True)
    pipe.set(f"{stream_key}:step", 1)
    c.ack_in(pipe, got)
    assert await pipe.execute() == [True, 1]
    assert await c.pending_count() == 0


async def test_keep_alive_resets_idle_without_counting_a_delivery(
    redis_client: aioredis.Redis, stream_key: str
) -> None:
    """A trainer holding entries across a long update keeps them from being reclaimed: their idle time
    goes back to zero and their delivery count stays 1 (a reclaim would make them suspects)."""
    await producer(redis_client, stream_key).append(traj(1))
    c = consumer(redis_client, stream_key, "trainer", "A", block_ms=10)
    got = await c.read()

    async def idle_and_count() -> tuple[int, int]:
        [p] = await redis_client.xpending_range(stream_key, "trainer", min="-", max="+", count=1)
        return int(p["time_since_delivered"]), int(p["times_delivered"])

    for _ in range(300):  # bounded wait until the entry has aged far more than a scheduling hiccup
        if (await idle_and_count())[0] >= 300:
            break
        await asyncio.sleep(0.02)
    before, _ = await idle_and_count()
    await c.keep_alive(got)
    after, count = await idle_and_count()
    assert after < before and count == 1


def test_reply_shapes_of_xreadgroup_all_read_the_same() -> None:
    """The consumer asks for XREADGROUP's raw reply; should a client parse it anyway (a callback, RESP3),
    the entries still come out as ``(id, [field, value, ...])``."""
    flat = [(b"1-0", [b"data", b"x", b"id", b"t-1"])]
    parsed = [(b"1-0", {b"data": b"x", b"id": b"t-1"})]
    for reply in ([[b"s", flat]], [[b"s", parsed]], {b"s": flat}, {b"s": [parsed]}):
        assert _flat_entries(reply) == flat, reply


def test_from_settings_uses_the_stream_settings() -> None:
    """Rollout and trainer build their ends from ``WOLFPACK_STREAM_*`` (one place to tune them)."""
    settings = load_settings(
        stream_maxlen=7, stream_backpressure_timeout_s=3, stream_retry_timeout_s=9, stream_max_deliveries=4
    )
    client = aioredis.Redis()  # never connected
    prod = ProtoStreamProducer[Trajectory].from_settings(client, settings, lambda t: t.trajectory_id)
    assert (prod.stream, prod.maxlen, prod.backpressure_timeout_s) == (settings.stream_trajectories, 7, 3)
    cons = ProtoStreamConsumer.from_settings(client, settings, "trainer", "t0", Trajectory, batch=8)
    assert (cons.max_deliveries, cons.retry.timeout_s, cons.batch) == (4, 9, 8)


async def test_dead_letter_by_the_caller(redis_client: aioredis.Redis, stream_key: str) -> None:
    """A handler that rejects an entry (e.g. it fails validation) moves it to the dead-letter stream."""
    await producer(redis_client, stream_key).append(traj("bad"))
    c = consumer(redis_client, stream_key, "trainer", "A", block_ms=10)
    [d] = await c.read()
    await c.dead_letter(d, "invalid: no turns")
    [(_e, fields)] = await redis_client.xrange(dead_letter_key(stream_key))
    assert fields[b"reason"] == b"invalid: no turns" and fields[b"id"] == b"t-bad"
    assert await c.pending_count() == 0


@pytest.mark.parametrize("crash", [False, True], ids=["graceful-restart", "sigkill-always-fsync"])
async def test_redis_restart_under_load_processes_every_trajectory_exactly_once(
    tmp_path: Path, crash: bool
) -> None:
    """Producer and two consumers run while Redis restarts (SIGTERM with fsync everysec, or SIGKILL
    with fsync always). Producers retry, consumers resume; each consumer commits its processing and
    the ack in one transaction. Every appended trajectory ends up processed exactly once."""
    server = EmbeddedRedis(tmp_path / "redis", appendfsync="always" if crash else "everysec").start()
    stream, n = "traj", 1500
    retry = RetryPolicy(timeout_s=30)
    half_appended = asyncio.Event()
    server_down = asyncio.Event()
    stop = asyncio.Event()
    try:

        async def produce() -> None:
            client = aioredis.Redis.from_url(server.url)
            prod = producer(client, stream, retry=retry)
            for start in range(0, n, 25):
                if start == n // 2:  # the rest is appended while the server is down, then back
                    half_appended.set()
                    await server_down.wait()
                await prod.append_many([traj(i) for i in range(start, start + 25)])
            await client.aclose()

        async def consume(name: str) -> None:
            client = aioredis.Redis.from_url(server.url)
            # An entry whose read reply died with the old server waits claim_idle_ms to be reclaimed.
            c = consumer(
                client, stream, "trainer", name, batch=50, block_ms=50, claim_idle_ms=1000, retry=retry
            )
            while not stop.is_set():
                got = await c.read()
                if got:
                    await commit(client, c, got)
            await client.aclose()

        async def commit(
            client: aioredis.Redis, c: ProtoStreamConsumer[Trajectory], got: list[Delivery[Trajectory]]
        ) -> None:
            args = [x for d in got for x in (d.entry_id, d.message.trajectory_id)]
            await retrying(lambda: client.eval(COMMIT, 2, stream, "processed", *args), retry, "commit")

        async def restart() -> None:
            await half_appended.wait()
            await asyncio.to_thread(server.kill if crash else server.stop)
            server_down.set()
            await asyncio.to_thread(server.start)

        async def watch() -> None:
            client = aioredis.Redis.from_url(server.url)
            while True:
                try:
                    done = await client.hlen("processed")
                except (RedisConnectionError, OSError):
                    done = 0  # the server is restarting
                if done >= n:
                    break
                await asyncio.sleep(0.05)
            stop.set()
            await client.aclose()

        tasks = [produce(), consume("A"), consume("B"), restart(), watch()]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)  # a hang, not a timing assertion
        client = aioredis.Redis.from_url(server.url)
        processed = {k.decode(): int(v) for k, v in (await client.hgetall("processed")).items()}
        assert set(processed) == {f"t-{i}" for i in range(n)}, "a trajectory was lost"
        assert set(processed.values()) == {1}, "a trajectory was processed twice"
        assert int((await client.xpending(stream, "trainer"))["pending"]) == 0
        await client.aclose()
    finally:
        server.stop()


@pytest.mark.parametrize("required", [True, False], ids=["trainer-required", "no-required-group"])
async def test_required_groups_keep_entries_for_a_consumer_not_started_yet(
    redis_client: aioredis.Redis, stream_key: str, required: bool
) -> None:
    """``wolfpack rollout`` with no trainer running: the curriculum's group reads and acks every entry.
    With the trainer's group required, the producer created it before its first append, so every entry
    waits for the trainer; without it (the control) the acked entries are trimmed and the trainer, started
    later, finds only what came after."""
    groups = ("trainer",) if required else ()
    prod = producer(redis_client, stream_key, required_groups=groups)
    curriculum = consumer(redis_client, stream_key, "curriculum", "c0", block_ms=10)
    await curriculum.ensure_group()
    await prod.append_many([traj(i) for i in range(5)])
    seen_by_curriculum: list[str] = []
    await drain(curriculum, seen_by_curriculum)
    assert len(seen_by_curriculum) == 5
    await prod.append(traj(5))  # an append trims below what every existing group acked
    trainer = consumer(redis_client, stream_key, "trainer", "t0", block_ms=10)
    await trainer.ensure_group()  # the trainer starts: BUSYGROUP when the producer made it, kept as is
    seen_by_trainer: list[str] = []
    await drain(trainer, seen_by_trainer)
    if required:
        assert sorted(seen_by_trainer) == [f"t-{i}" for i in range(6)]
    else:
        assert sorted(seen_by_trainer) == ["t-5"]


def test_required_groups_come_from_the_settings() -> None:
    client = aioredis.Redis()  # never connected
    make = ProtoStreamProducer[Trajectory].from_settings
    assert make(client, load_settings(), lambda t: t.trajectory_id).required_groups == ("trainer",)
    custom = load_settings(stream_required_groups=" trainer, eval ,")
    assert make(client, custom, lambda t: t.trajectory_id).required_groups == ("trainer", "eval")
    assert (
        make(client, load_settings(stream_required_groups=""), lambda t: t.trajectory_id).required_groups
        == ()
    )
