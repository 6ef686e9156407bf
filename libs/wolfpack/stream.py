"""Protobuf messages over Redis Streams with consumer groups: at-least-once, idempotent, bounded.

Why each piece exists:
- *Consumer groups + acks*: a trajectory is removed from a consumer's pending list only after the
  trainer used it, so a crash between read and ack loses nothing.
- *Reclaim*: entries pending longer than ``claim_idle_ms`` on any consumer (typically one that died)
  are claimed (``XPENDING … IDLE`` + ``XCLAIM``) by whoever reads next.
- *Dead letters*: an entry delivered more than ``max_deliveries`` times, or one that does not parse, is
  copied to ``<stream>:dead`` with the reason and acked, so one poison message cannot stall a learner.
- *Idempotency*: each message carries its own id (e.g. ``Trajectory.trajectory_id``); acking records it
  in a per-group set, and an entry whose id is already there (a producer retry, a duplicate append)
  is acked without being handed out again.
- *Bounded length*: ``XADD MAXLEN ~`` keeps memory flat when nobody consumes.
- *Tracing*: the producer's W3C trace context travels in the entry, so the consumer's span joins the
  episode's trace across the queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import redis.asyncio as aioredis
from google.protobuf.message import DecodeError, Message
from opentelemetry.context import Context
from redis.exceptions import ResponseError

from wolfpack import telemetry

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

F_DATA = b"data"
F_ID = b"id"
F_TRACEPARENT = b"traceparent"
F_TRACESTATE = b"tracestate"


def dead_letter_key(stream: str) -> str:
    return f"{stream}:dead"


def done_key(stream: str, group: str, message_id: str) -> str:
    return f"{stream}:done:{group}:{message_id}"


@dataclass(slots=True)
class Delivery(Generic[M]):
    """One entry handed to a consumer. ``context`` is the producer's trace context (use as parent)."""

    entry_id: str
    message_id: str
    message: M
    deliveries: int
    context: Context


class ProtoStreamProducer(Generic[M]):
    """Appends protobuf messages, each with its own id and the current trace context."""

    def __init__(
        self,
        client: aioredis.Redis,
        stream: str,
        id_of: Callable[[M], str],
        maxlen: int = 100_000,
    ) -> None:
        self.client = client
        self.stream = stream
        self.id_of = id_of
        self.maxlen = maxlen

    async def append(self, message: M) -> str:
        fields: dict[bytes, bytes] = {F_DATA: message.SerializeToString(), F_ID: self.id_of(message).encode()}
        carrier = telemetry.inject_carrier()
        if "traceparent" in carrier:
            fields[F_TRACEPARENT] = carrier["traceparent"].encode()
        if "tracestate" in carrier:
            fields[F_TRACESTATE] = carrier["tracestate"].encode()
        entry_id = await self.client.xadd(self.stream, fields, maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    async def append_many(self, messages: Sequence[M]) -> list[str]:
        return [await self.append(m) for m in messages]


class ProtoStreamConsumer(Generic[M]):
    """One consumer of a consumer group. Call ``read()`` in a loop and ``ack()`` what you processed."""

    def __init__(
        self,
        client: aioredis.Redis,
        stream: str,
        group: str,
        consumer: str,
        message_type: type[M],
        *,
        batch: int = 64,
        block_ms: int = 1000,
        claim_idle_ms: int = 60_000,
        max_deliveries: int = 5,
        done_ttl_s: int = 7 * 24 * 3600,
    ) -> None:
        self.client = client
        self.stream = stream
        self.group = group
        self.done_ttl_s = done_ttl_s
        self.consumer = consumer
        self.message_type = message_type
        self.batch = batch
        self.block_ms = block_ms
        self.claim_idle_ms = claim_idle_ms
        self.max_deliveries = max_deliveries
        self.dead_lettered = 0
        self.duplicates_skipped = 0

    async def ensure_group(self) -> None:
        """Create the group (and the stream) if missing; starting from the beginning loses nothing."""
        try:
            await self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read(self) -> list[Delivery[M]]:
        """Reclaimed idle entries first, then new ones; poison and duplicate entries are filtered out."""
        out = await self._reclaim()
        room = self.batch - len(out)
        if room > 0:
            resp = await self.client.xreadgroup(
                self.group,
                self.consumer,
                {self.stream: ">"},
                count=room,
                block=None if out else self.block_ms,
            )
            for _stream, entries in resp or []:
                out.extend(await self._accept(entries, {}))
        return out

    async def _reclaim(self) -> list[Delivery[M]]:
        pending = await self.client.xpending_range(
            self.stream, self.group, min="-", max="+", count=self.batch, idle=self.claim_idle_ms
        )
        if not pending:
            return []
        counts = {_s(p["message_id"]): int(p["times_delivered"]) + 1 for p in pending}
        claimed = await self.client.xclaim(
            self.stream, self.group, self.consumer, self.claim_idle_ms, list(counts)
        )
        return await self._accept(claimed, counts)

    async def _accept(
        self, entries: Sequence[tuple[bytes, Mapping[bytes, bytes]]], counts: Mapping[str, int]
    ) -> list[Delivery[M]]:
        out: list[Delivery[M]] = []
        for raw_id, fields in entries:
            entry_id = _s(raw_id)
            if not fields:  # trimmed away by MAXLEN while pending: nothing left to process
                await self.client.xack(self.stream, self.group, entry_id)
                continue
            deliveries = counts.get(entry_id, 1)
            message_id = _s(fields.get(F_ID, b""))
            if deliveries > self.max_deliveries:
                await self._dead_letter(entry_id, fields, f"delivered {deliveries} times without ack")
                continue
            if message_id and await self.client.exists(done_key(self.stream, self.group, message_id)):
                self.duplicates_skipped += 1
                await self.client.xack(self.stream, self.group, entry_id)
                continue
            message = self.message_type()
            try:
                message.ParseFromString(fields.get(F_DATA, b""))
            except DecodeError as exc:
                await self._dead_letter(entry_id, fields, f"undecodable {self.message_type.__name__}: {exc}")
                continue
            carrier = {k.decode(): _s(fields[k]) for k in (F_TRACEPARENT, F_TRACESTATE) if k in fields}
            out.append(
                Delivery(entry_id, message_id, message, deliveries, telemetry.extract_carrier(carrier))
            )
        return out

    async def _dead_letter(self, entry_id: str, fields: Mapping[bytes, bytes], reason: str) -> None:
        log.warning(
            "dead-lettering stream entry", extra={"stream": self.stream, "entry": entry_id, "reason": reason}
        )
        dead = dict(fields)
        dead[b"reason"] = reason.encode()
        dead[b"source_entry"] = entry_id.encode()
        dead[b"group"] = self.group.encode()
        pipe = self.client.pipeline(transaction=True)
        pipe.xadd(dead_letter_key(self.stream), dead, maxlen=100_000, approximate=True)  # type: ignore[arg-type]
        pipe.xack(self.stream, self.group, entry_id)
        await pipe.execute()
        self.dead_lettered += 1

    async def ack(self, deliveries: Sequence[Delivery[M]]) -> int:
        """Ack processed entries and remember their message ids (atomically) for idempotency."""
        if not deliveries:
            return 0
        pipe = self.client.pipeline(transaction=True)
        for d in deliveries:
            if d.message_id:
                pipe.set(done_key(self.stream, self.group, d.message_id), b"1", ex=self.done_ttl_s)
        pipe.xack(self.stream, self.group, *[d.entry_id for d in deliveries])
        results = await pipe.execute()
        return int(results[-1])

    async def pending_count(self) -> int:
        info = await self.client.xpending(self.stream, self.group)
        return int(info["pending"])


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
