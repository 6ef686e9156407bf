"""Redis stream semantics against a real server: crash recovery, poison messages, no loss, tracing."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest
import redis.asyncio as aioredis
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from wolfpack.stream import ProtoStreamConsumer, ProtoStreamProducer, dead_letter_key
from wolfpack.v1.common_pb2 import GameRef
from wolfpack.v1.trajectory_pb2 import Trajectory


def traj(i: int | str) -> Trajectory:
    return Trajectory(trajectory_id=f"t-{i}", episode_id=f"e-{i}", game=GameRef(game_id="werewolf_v1"))


def producer(client: aioredis.Redis, key: str) -> ProtoStreamProducer[Trajectory]:
    return ProtoStreamProducer(client, key, id_of=lambda t: t.trajectory_id)


def consumer(client: aioredis.Redis, key: str, name: str, **kw: int) -> ProtoStreamConsumer[Trajectory]:
    return ProtoStreamConsumer(client, key, "trainer", name, Trajectory, **kw)  # type: ignore[arg-type]


async def test_killed_consumer_pending_entries_are_reclaimed(
    redis_url: str, redis_client: aioredis.Redis, stream_key: str
) -> None:
    prod = producer(redis_client, stream_key)
    await consumer(redis_client, stream_key, "setup").ensure_group()
    await prod.append_many([traj(i) for i in range(10)])

    # Consumer A runs in its own process: it reads all 10, acks 3, then is SIGKILLed mid-batch.
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        import redis.asyncio as aioredis
        from wolfpack.stream import ProtoStreamConsumer
        from wolfpack.v1.trajectory_pb2 import Trajectory
        async def main():
            c = ProtoStreamConsumer(aioredis.Redis.from_url({redis_url!r}), {stream_key!r}, "trainer", "A",
                                    Trajectory, batch=10)
            got = await c.read()
            await c.ack(got[:3])
            print(len(got), flush=True)
            await asyncio.sleep(3600)
        asyncio.run(main())
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "10"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    b = consumer(redis_client, stream_key, "B", claim_idle_ms=200)
    assert await b.pending_count() == 7
    reclaimed = []

    async def reclaim() -> None:
        # Entries become claimable once idle for 200 ms: read until all 7 came back, however long the
        # machine takes (bounded below), instead of sleeping a fixed time and reading a fixed number.
        while len(reclaimed) < 7:
            got = await b.read()
            reclaimed.extend(got)
            await b.ack(got)
            if not got:
                await asyncio.sleep(0.05)

    await asyncio.wait_for(reclaim(), timeout=60)
    assert sorted(d.message.trajectory_id for d in reclaimed) == [f"t-{i}" for i in range(3, 10)]
    assert all(d.deliveries == 2 for d in reclaimed)
    assert await b.pending_count() == 0


async def test_poison_messages_go_to_dead_letter(redis_client: aioredis.Redis, stream_key: str) -> None:
    c = consumer(redis_client, stream_key, "A", claim_idle_ms=1, max_deliveries=3, block_ms=10)
    await c.ensure_group()
    # An entry that does not parse as a Trajectory is dead-lettered on first sight.
    await redis_client.xadd(stream_key, {b"data": b"\xff\xff\xff not a proto", b"id": b"bad-1"})
    assert await c.read() == []
    assert c.dead_lettered == 1

    # A parseable entry whose processing always fails (never acked) is dead-lettered after 3 deliveries.
    await producer(redis_client, stream_key).append(traj("crashy"))
    seen = 0
    for _ in range(10):
        got = await c.read()
        seen += len(got)
        await asyncio.sleep(0.01)  # handler "fails": no ack
    assert seen == 3
    assert c.dead_lettered == 2
    assert await c.pending_count() == 0
    dead = await redis_client.xrange(dead_letter_key(stream_key))
    reasons = [fields[b"reason"].decode() for _id, fields in dead]
    assert "undecodable" in reasons[0]
    assert "not acknowledged after 3 deliveries" in reasons[1]
    assert Trajectory.FromString(dead[1][1][b"data"]).trajectory_id == "t-crashy"


async def test_ten_thousand_messages_two_consumers_none_lost_none_twice(
    redis_url: str, redis_client: aioredis.Redis, stream_key: str
) -> None:
    """Two consumers share 10,000 entries; a producer retry of 50 already-appended trajectories must not
    put them on the stream again (the append script dedups by message id)."""
    n = 10_000
    prod = producer(redis_client, stream_key)
    for start in range(0, n, 500):
        await prod.append_many([traj(i) for i in range(start, start + 500)])
    first_ids = await prod.append_many([traj(i) for i in range(50)])
    assert prod.duplicates == 50
    assert await redis_client.xlen(stream_key) == n
    originals = await redis_client.xrange(stream_key, count=50)
    assert first_ids == [eid.decode() for eid, _f in originals], "a retry returns the first append's ids"

    processed: list[str] = []

    async def run(name: str) -> None:
        client = aioredis.Redis.from_url(redis_url)
        c = consumer(client, stream_key, name, batch=200, block_ms=200)
        await c.ensure_group()
        idle_reads = 0
        while idle_reads < 3:
            got = await c.read()
            if not got:
                idle_reads += 1
                continue
            idle_reads = 0
            processed.extend(d.message.trajectory_id for d in got)
            await c.ack(got)
        await client.aclose()

    await asyncio.gather(run("A"), run("B"))
    assert len(processed) == len(set(processed)), "a trajectory was processed twice"
    assert set(processed) == {f"t-{i}" for i in range(n)}, "a trajectory was lost"
    assert await consumer(redis_client, stream_key, "A").pending_count() == 0


@pytest.mark.tracing_sdk
async def test_trace_context_survives_the_stream(
    redis_client: aioredis.Redis, stream_key: str, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("test")
    c = consumer(redis_client, stream_key, "A", block_ms=10)
    await c.ensure_group()
    with tracer.start_as_current_span("episode") as produce_span:
        await producer(redis_client, stream_key).append(traj(uuid.uuid4().hex))
    # The consumer runs with no active span: its parent must come from the entry.
    assert not trace.get_current_span().get_span_context().is_valid
    [delivery] = await c.read()
    with tracer.start_as_current_span("train", context=delivery.context):
        pass
    by_name = {s.name: s for s in spans.get_finished_spans()}
    producer_ctx = produce_span.get_span_context()
    consumed = by_name["train"]
    assert consumed.context.trace_id == producer_ctx.trace_id
    assert consumed.parent is not None and consumed.parent.span_id == producer_ctx.span_id
