"""The trajectory stream vs raw redis-py on the same server: appends/s and reads+acks/s (one table, one run).

Why: rollout appends every trajectory and the trainer reads and acks each one, so the library's cost over
Redis itself bounds both. Each cell moves ``--messages`` Trajectory protos of ~2 KB in batches of
``--batch``, on one embedded redis-server (AOF on, the product's configuration) or ``--url``:

- producer, raw: serialize each message and ``XADD`` it in a redis-py pipeline (one round trip per batch);
- producer, project: ``ProtoStreamProducer.append_many`` (Lua: dedup by message id, trim what every group
  acked, backpressure check, ``XADD``; one round trip per batch);
- consumer, raw: ``XREADGROUP COUNT batch`` + parse each proto (the batch's messages are kept until the
  ack, as a consumer that processes a batch keeps them) + ``XACK`` the batch; "bytes only" skips the
  parse (shown for reference);
- consumer, project: ``ProtoStreamConsumer.read`` + ``ack`` (dedup, malformed check, per-entry counts);
- producer as the rollout driver calls it: ``--producers`` concurrent tasks (episodes finishing at once),
  each appending one message per call and awaiting it, on a stream where the trainer's consumer group
  exists (as in the product: ``WOLFPACK_STREAM_REQUIRED_GROUPS``, the default ``maxlen``). Raw: ``await
  XADD`` per message (redis-py's pool gives each concurrent call its own connection); project:
  ``ProtoStreamProducer.append`` (concurrent calls coalesce into one script call).

Raw and project cells alternate for several rounds (the order flips every round) and each ratio divides a
project cell by the raw cell of the same round, because this machine's CPUs are shared and noisy; the
table shows medians with the range over rounds. Two ratios: wall-clock throughput, and messages per CPU
second of this process plus the Redis server (``INFO cpu``), which other tenants' load disturbs less.
A ratio above 1 means the project path is faster (or cheaper) than raw.

    .venv/bin/python bench/stream/bench_stream.py                 # ~1 minute
    .venv/bin/python bench/stream/bench_stream.py --rounds 3 --messages 5000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import redis.asyncio as aioredis

from wolfpack.redis_server import EmbeddedRedis
from wolfpack.stream import ProtoStreamConsumer, ProtoStreamProducer
from wolfpack.v1.common_pb2 import GameRef
from wolfpack.v1.trajectory_pb2 import Trajectory

GROUP = "bench"
TRAINER = "trainer"


def trajectory(i: int) -> Trajectory:
    """A ~2 KB trajectory: one turn with token ids, logprobs and a short observation."""
    t = Trajectory(trajectory_id=f"{i:08d}-{uuid.uuid4().hex}", episode_id=f"e{i}")
    t.game.CopyFrom(GameRef(game_id="werewolf_v1", variant="6p"))
    turn = t.turns.add(index=0, seat=3, observation_text="Night 1. You are the seer. " * 24)
    turn.prompt_token_ids.extend(range(1000, 1300))
    turn.response_token_ids.extend(range(2000, 2120))
    turn.response_logprobs.extend(-0.5 - j / 1000 for j in range(120))
    return t


async def raw_produce(client: aioredis.Redis, stream: str, *, msgs: list[Trajectory], batch: int) -> None:
    for start in range(0, len(msgs), batch):
        pipe = client.pipeline(transaction=False)
        for m in msgs[start : start + batch]:
            pipe.xadd(stream, {b"data": m.SerializeToString(), b"id": m.trajectory_id.encode()})
        await pipe.execute()


async def project_produce(client: aioredis.Redis, stream: str, *, msgs: list[Trajectory], batch: int) -> None:
    producer: ProtoStreamProducer[Trajectory] = ProtoStreamProducer(
        client, stream, id_of=lambda t: t.trajectory_id, maxlen=0
    )
    for start in range(0, len(msgs), batch):
        await producer.append_many(msgs[start : start + batch])


async def raw_single(client: aioredis.Redis, stream: str, *, msgs: list[Trajectory], producers: int) -> None:
    todo = iter(msgs)  # shared: each task takes the next message when its last append returned

    async def task() -> None:
        for m in todo:
            await client.xadd(stream, {b"data": m.SerializeToString(), b"id": m.trajectory_id.encode()})

    await asyncio.gather(*(task() for _ in range(producers)))


async def project_single(
    client: aioredis.Redis, stream: str, *, msgs: list[Trajectory], producers: int, coalesce: bool = True
) -> None:
    """``append`` per message; ``coalesce=False``: ``append_many([m])``, what ``append`` was before it
    coalesced (one script call per message), shown for reference."""
    producer: ProtoStreamProducer[Trajectory] = ProtoStreamProducer(
        client, stream, id_of=lambda t: t.trajectory_id, required_groups=(TRAINER,)
    )  # the product's defaults: maxlen 100,000, the trainer's group required
    todo = iter(msgs)

    async def task() -> None:
        for m in todo:
            if coalesce:
                await producer.append(m)
            else:
                await producer.append_many([m])

    await asyncio.gather(*(task() for _ in range(producers)))


async def raw_consume(client: aioredis.Redis, stream: str, n: int, batch: int, parse: bool) -> None:
    got = 0
    while got < n:
        resp = await client.xreadgroup(GROUP, "raw", {stream: ">"}, count=batch)
        entries = resp[0][1]
        # The batch is handed to processing, then acked: its messages live until the ack, as with the
        # project consumer's deliveries.
        messages = [Trajectory.FromString(fields[b"data"]) for _e, fields in entries] if parse else []
        await client.xack(stream, GROUP, *[e[0] for e in entries])
        got += len(entries)
        del messages  # processed and acked


async def project_consume(client: aioredis.Redis, stream: str, n: int, batch: int) -> None:
    consumer: ProtoStreamConsumer[Trajectory] = ProtoStreamConsumer(
        client, stream, GROUP, "project", Trajectory, batch=batch, block_ms=100
    )
    got = 0
    while got < n:
        deliveries = await consumer.read()
        await consumer.ack(deliveries)
        got += len(deliveries)


async def server_cpu(client: aioredis.Redis) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def measure(client: aioredis.Redis, op: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process plus the Redis server) of ``op``."""
    server0, cpu0, start = await server_cpu(client), time.process_time(), time.perf_counter()
    await op()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return wall, cpu + await server_cpu(client) - server0


async def fresh_stream(client: aioredis.Redis, msgs: list[Trajectory] | None, batch: int) -> str:
    stream = f"bench:{uuid.uuid4().hex}"
    if msgs is not None:
        await raw_produce(client, stream, msgs=msgs, batch=batch)
        await client.xgroup_create(stream, GROUP, id="0")
    return stream


Rates = dict[str, dict[str, list[float]]]  # cell -> {"wall": msgs/s, "cpu": msgs per CPU second}


async def run(url: str, n: int, batch: int, rounds: int, n_producers: int) -> Rates:
    client = aioredis.Redis.from_url(url)
    rates: Rates = {}

    def record(cell: str, wall_cpu: tuple[float, float]) -> None:
        cells = rates.setdefault(cell, {"wall": [], "cpu": []})
        cells["wall"].append(n / wall_cpu[0])
        cells["cpu"].append(n / wall_cpu[1])

    # Warm-up: scripts loaded, connections open, allocator warm.
    warm = [trajectory(i) for i in range(batch * 4)]
    await project_produce(client, await fresh_stream(client, None, batch), msgs=warm, batch=batch)
    await project_consume(client, await fresh_stream(client, warm, batch), len(warm), batch)
    for r in range(rounds):
        msgs = [trajectory(r * n + i) for i in range(n)]
        producers: list[tuple[str, Callable[[str], Awaitable[None]]]] = [
            ("producer raw", partial(raw_produce, client, msgs=msgs, batch=batch)),
            ("producer project", partial(project_produce, client, msgs=msgs, batch=batch)),
        ]
        consumers: list[tuple[str, Callable[[str], Awaitable[None]]]] = [
            ("consumer raw", lambda s: raw_consume(client, s, n, batch, parse=True)),
            ("consumer project", lambda s: project_consume(client, s, n, batch)),
            ("consumer raw, bytes only", lambda s: raw_consume(client, s, n, batch, parse=False)),
        ]
        singles: list[tuple[str, Callable[[str], Awaitable[None]]]] = [
            ("single raw", partial(raw_single, client, msgs=msgs, producers=n_producers)),
            ("single project", partial(project_single, client, msgs=msgs, producers=n_producers)),
            (
                "single uncoalesced",
                partial(project_single, client, msgs=msgs, producers=n_producers, coalesce=False),
            ),
        ]
        if r % 2:
            producers.reverse()
            consumers.reverse()
            singles.reverse()
        for cell, produce in producers:
            stream = await fresh_stream(client, None, batch)
            record(cell, await measure(client, lambda: produce(stream)))  # noqa: B023
            await client.delete(stream)
        for cell, produce in singles:  # the trainer's group exists, as in the product
            stream = await fresh_stream(client, None, batch)
            await client.xgroup_create(stream, TRAINER, id="0", mkstream=True)
            record(cell, await measure(client, lambda: produce(stream)))  # noqa: B023
            await client.delete(stream)
        for cell, consume in consumers:
            stream = await fresh_stream(client, msgs, batch)
            record(cell, await measure(client, lambda: consume(stream)))  # noqa: B023
            await client.delete(stream)
        await client.flushdb()
        print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    await client.aclose()
    return rates


def table(rates: Rates) -> str:
    def ratio(num: str, den: str, kind: str) -> str:
        rs = [a / b for a, b in zip(rates[num][kind], rates[den][kind], strict=True)]
        return f"{statistics.median(rs):.2f} ({min(rs):.2f}–{max(rs):.2f})"

    rows = [
        ("producer", "raw redis-py pipelined XADD", "producer raw", None),
        ("producer", "ProtoStreamProducer.append_many", "producer project", "producer raw"),
        ("consumer", "raw XREADGROUP + proto parse + XACK", "consumer raw", None),
        ("consumer", "ProtoStreamConsumer.read + ack", "consumer project", "consumer raw"),
        ("consumer", "raw XREADGROUP + XACK, bytes only (reference)", "consumer raw, bytes only", None),
        ("driver pattern", "raw redis-py: await XADD per message, concurrent", "single raw", None),
        (
            "driver pattern",
            "ProtoStreamProducer.append per message, concurrent",
            "single project",
            "single raw",
        ),
        (
            "driver pattern",
            "append_many([message]) per message: one script call each (append before it coalesced)",
            "single uncoalesced",
            "single raw",
        ),
    ]
    out = [
        "| side | path | msgs/s | project / raw, wall | CPU µs/msg (client + server) | project / raw, CPU |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for side, path, cell, den in rows:
        wall = statistics.median(rates[cell]["wall"])
        cpu_us = 1e6 / statistics.median(rates[cell]["cpu"])
        r_wall = ratio(cell, den, "wall") if den else ""
        r_cpu = ratio(cell, den, "cpu") if den else ""
        out.append(f"| {side} | {path} | {wall:,.0f} | {r_wall} | {cpu_us:.1f} | {r_cpu} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="Redis URL (default: an embedded redis-server with AOF, as in production)")
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--producers", type=int, default=64, help="concurrent appenders in the driver-pattern rows"
    )
    args = ap.parse_args()
    size = len(trajectory(0).SerializeToString())
    with tempfile.TemporaryDirectory() as tmp:
        server = None if args.url else EmbeddedRedis(Path(tmp)).start()
        url = args.url or (server.url if server else "")
        try:
            rates = asyncio.run(run(url, args.messages, args.batch, args.rounds, args.producers))
        finally:
            if server:
                server.stop()
    print(
        f"{args.messages} messages of {size} B per cell, batches of {args.batch} (driver pattern: "
        f"{args.producers} concurrent single appends, the trainer's group present), {args.rounds} interleaved "
        f"rounds, {'--url ' + args.url if args.url else 'embedded redis-server (AOF everysec)'}\n"
    )
    print(table(rates))


if __name__ == "__main__":
    main()
