"""Outcomes from the trajectory stream: the curriculum's own consumer group reads every scored
trajectory, turns it into a ``TaskOutcome`` (``client.outcome_of``, the same function rollout would use
over RPC) and records it; the entry is acked only after it was recorded, so a crash re-delivers it and
the ``seen`` set makes the second delivery a no-op."""

from __future__ import annotations

import asyncio
import logging

from wolfpack.stream import ProtoStreamConsumer
from wolfpack.v1 import trajectory_pb2
from wolfpack_curriculum.client import outcome_of
from wolfpack_curriculum.store import CurriculumStore

log = logging.getLogger(__name__)


async def consume(
    store: CurriculumStore,
    consumer: ProtoStreamConsumer[trajectory_pb2.Trajectory],
    stop: asyncio.Event,
) -> int:
    """Record outcomes from the stream until ``stop`` is set; returns how many entries were handled."""
    await consumer.ensure_group()
    handled = 0
    while not stop.is_set():
        try:
            deliveries = await consumer.read()
        except Exception:  # Redis away: the stream's own retries gave up; try again shortly
            log.exception("reading the trajectory stream failed")
            await asyncio.sleep(1.0)
            continue
        if not deliveries:
            continue
        await store.record([outcome_of(d.message) for d in deliveries], from_stream=True)
        await consumer.ack(deliveries)
        handled += len(deliveries)
    return handled
