"""Concurrent single appends (the rollout driver's pattern) coalesce into few script calls against a real
server, and each caller still gets its own result: its entry id, its own trace context on its entry, its
own error. Duplicate ids in one coalesced batch make one entry; a batch refused by backpressure fails
each of its callers; a message with an empty id fails alone, before anything is queued."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from wolfpack.stream import ProtoStreamConsumer, ProtoStreamProducer, StreamBackpressureError
from wolfpack.v1.common_pb2 import GameRef
from wolfpack.v1.trajectory_pb2 import Trajectory


def traj(i: int | str) -> Trajectory:
    return Trajectory(trajectory_id=f"t-{i}", episode_id=f"e-{i}", game=GameRef(game_id="werewolf_v1"))


def producer(client: aioredis.Redis, key: str, **kw: float) -> ProtoStreamProducer[Trajectory]:
    return ProtoStreamProducer(client, key, id_of=lambda t: t.trajectory_id, **kw)  # type: ignore[arg-type]


async def entries(client: aioredis.Redis, key: str) -> dict[str, dict[bytes, bytes]]:
    """Entry id -> fields of every entry on the stream."""
    return {e.decode(): f for e, f in await client.xrange(key)}


async def test_concurrent_appends_coalesce_and_each_gets_its_own_entry(
    redis_client: aioredis.Redis, stream_key: str
) -> None:
    await redis_client.xgroup_create(stream_key, "trainer", id="0", mkstream=True)  # the trainer's group
    p = producer(redis_client, stream_key)
    msgs = [traj(i) for i in range(200)]
    ids = await asyncio.gather(*(p.append(m) for m in msgs))
    assert p.flushes < 20, p.flushes  # 200 concurrent appends, a handful of round trips
    on_stream = await entries(redis_client, stream_key)
    assert len(set(ids)) == 200 and set(ids) == set(on_stream)
    for m, entry_id in zip(msgs, ids, strict=True):  # each caller's id is its own message's entry
        fields = on_stream[entry_id]
        assert fields[b"id"] == m.trajectory_id.encode()
        assert Trajectory.FromString(fields[b"data"]) == m
    # one at a time, nothing to coalesce: one script call each, as before
    before = p.flushes
    for i in range(3):
        await p.append(traj(f"alone-{i}"))
    assert p.flushes == before + 3


async def test_duplicate_ids_in_one_batch_make_one_entry(
    redis_client: aioredis.Redis, stream_key: str
) -> None:
    p = producer(redis_client, stream_key)
    first, again, other = await asyncio.gather(p.append(traj(1)), p.append(traj(1)), p.append(traj(2)))
    assert first == again != other
    assert len(await entries(redis_client, stream_key)) == 2
    assert await p.append(traj(1)) == first  # and a later retry too


async def test_an_empty_id_fails_alone(redis_client: aioredis.Redis, stream_key: str) -> None:
    p = producer(redis_client, stream_key)
    results = await asyncio.gather(
        p.append(traj(1)), p.append(Trajectory()), p.append(traj(2)), return_exceptions=True
    )
    assert isinstance(results[1], ValueError) and "empty id" in str(results[1])
    assert all(isinstance(r, str) for r in (results[0], results[2]))
    assert len(await entries(redis_client, stream_key)) == 2


async def test_backpressure_fails_every_caller_of_the_refused_batch(
    redis_client: aioredis.Redis, stream_key: str
) -> None:
    await redis_client.xgroup_create(stream_key, "trainer", id="0", mkstream=True)
    p = producer(redis_client, stream_key, maxlen=2, backpressure_timeout_s=0.2)
    await p.append_many([traj("a"), traj("b")])  # the backlog is at the bound; nobody consumes
    results = await asyncio.gather(*(p.append(traj(i)) for i in range(5)), return_exceptions=True)
    assert all(isinstance(r, StreamBackpressureError) for r in results), results
    assert len(await entries(redis_client, stream_key)) == 2  # nothing was written
    p2 = producer(redis_client, stream_key, maxlen=0)  # the same producer type, unbounded: appends go on
    assert await asyncio.gather(*(p2.append(traj(i)) for i in range(5)))


@pytest.mark.tracing_sdk
async def test_each_coalesced_append_carries_its_own_trace_context(
    redis_client: aioredis.Redis, stream_key: str, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("test")
    p = producer(redis_client, stream_key)
    c: ProtoStreamConsumer[Trajectory] = ProtoStreamConsumer(
        redis_client, stream_key, "trainer", "c", Trajectory, block_ms=10
    )
    await c.ensure_group()

    async def episode(i: int) -> trace.SpanContext:
        with tracer.start_as_current_span(f"episode-{i}") as span:
            await p.append(traj(i))
            return span.get_span_context()

    async def untraced() -> None:
        await p.append(traj("untraced"))

    producing = await asyncio.gather(*(episode(i) for i in range(8)))
    await asyncio.gather(*(episode(i) for i in range(8, 10)), untraced())
    assert p.flushes <= 4  # they did coalesce, across traces
    deliveries = {d.message.trajectory_id: d for d in await c.read()}
    assert len(deliveries) == 11
    for i, ctx in enumerate(producing):
        parent = trace.get_current_span(deliveries[f"t-{i}"].context).get_span_context()
        assert (parent.trace_id, parent.span_id) == (ctx.trace_id, ctx.span_id)
    untraced_parent = trace.get_current_span(deliveries["t-untraced"].context).get_span_context()
    assert not untraced_parent.is_valid
