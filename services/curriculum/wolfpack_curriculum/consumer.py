"""Outcomes from the trajectory stream: the curriculum's own consumer group reads every scored
trajectory, turns it into a ``TaskOutcome`` (``client.outcome_of``, the same function rollout would use
over RPC) and records it; the entry is acked only after it was recorded, so a crash re-delivers it and
the ``recorded`` set makes the second delivery a no-op.

Why the loop never ends on its own: it is the only way stream outcomes reach the curriculum, and while
its group does not ack, the stream's backlog grows until backpressure stalls rollout. So:

* a *poison* entry (no trajectory id, a non-finite reward, anything ``outcome_of`` or the store's
  validation refuses) is moved to the dead-letter stream ``<stream>:dead`` with the reason, atomically
  with its ack, and logged; the rest of its batch is recorded as usual;
* an outcome of a bucket this curriculum does not schedule (another job's trajectories on the same
  stream) is acked and counted (``ignored_outcomes``), not applied;
* any other failure (Redis restarting, a reply lost, the group gone) is logged and retried with
  backoff (0.05 s doubling to 5 s): entries read but not yet acked are held and recorded again first
  (idempotent by trajectory id), entries a lost reply left pending come back through the consumer's
  reclaim, and a vanished group is recreated. The same batch failing ``MAX_BATCH_FAILURES`` times in a
  row for a reason outside Redis (a bug meeting odd data) is recorded entry by entry, and an entry that
  still fails so is dead-lettered with the error: one bad entry cannot hold the group back for good.
  Errors Redis answers (out of memory, read-only replica) are never blamed on an entry;
* ``ConsumerHealth`` says whether the loop made progress within ``stall_after_s``; the server reports
  the service NOT_SERVING while it has not (``server.py``), and a log line marks the stall and the
  recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from wolfpack.stream import Delivery, ProtoStreamConsumer, StreamUnavailableError
from wolfpack.v1 import curriculum_service_pb2 as pb
from wolfpack.v1 import trajectory_pb2
from wolfpack_curriculum.client import outcome_of
from wolfpack_curriculum.store import CurriculumStore, InvalidOutcome, UnknownBucket

log = logging.getLogger(__name__)

REDIS_AWAY: tuple[type[BaseException], ...] = (
    RedisConnectionError, RedisTimeoutError, OSError, StreamUnavailableError,
)  # fmt: skip
"""Failures that mean Redis is (for now) unreachable: retried without limit, never blamed on an entry."""

MAX_BATCH_FAILURES = 3
"""Failures of one batch (Redis reachable) before its entries are recorded one by one."""

BACKOFF_S = (0.05, 5.0)
"""First and longest pause after a failure (doubling)."""


class ConsumerHealth:
    """Progress of the consumer loop, for the health check: ``stalled()`` when the last successful round
    (a read, empty or not, and the recording and ack of what it returned) is older than ``stall_after_s``.
    A read blocks at most ``block_ms``, so a healthy loop completes a round at least that often."""

    def __init__(self, stall_after_s: float = 15.0) -> None:
        self.stall_after_s = stall_after_s
        self.last_progress = time.monotonic()
        self.failures = 0
        self.last_error = ""
        self.dead_lettered = 0
        self.ignored = 0
        self.recorded = 0

    def progressed(self) -> None:
        if self.failures:
            log.warning(
                "trajectory stream consumer recovered",
                extra={
                    "failures": self.failures,
                    "stalled_s": round(time.monotonic() - self.last_progress, 3),
                },
            )
        self.failures = 0
        self.last_error = ""
        self.last_progress = time.monotonic()

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"

    def stalled(self) -> bool:
        return time.monotonic() - self.last_progress > self.stall_after_s


def _backoff(failures: int) -> float:
    first, longest = BACKOFF_S
    return float(min(longest, first * 2 ** max(failures - 1, 0)))


async def _pause(seconds: float) -> None:
    """The pause after a failure (a module function so a test can record it instead of waiting)."""
    await asyncio.sleep(seconds)


async def _read_unless_stopped(
    consumer: ProtoStreamConsumer[trajectory_pb2.Trajectory], stop: asyncio.Event
) -> list[Delivery[trajectory_pb2.Trajectory]]:
    """One read, abandoned when ``stop`` is set meanwhile: a read on an idle stream blocks up to the
    consumer's ``block_ms`` (1 s), which every shutdown of the service (and ``wolfpack up``'s) would wait
    out. Nothing is lost by abandoning it: whatever Redis delivered to the cancelled read stays pending
    for this consumer and comes back through the group's reclaim, as after a crash."""
    read = asyncio.ensure_future(consumer.read())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((read, stopped), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        read.cancel()
        raise
    finally:
        stopped.cancel()
    if read.done():
        return read.result()
    read.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await read
    return []


async def consume(
    store: CurriculumStore,
    consumer: ProtoStreamConsumer[trajectory_pb2.Trajectory],
    stop: asyncio.Event,
    health: ConsumerHealth | None = None,
) -> int:
    """Record outcomes from the stream until ``stop`` is set; returns how many entries were handled
    (recorded, duplicates, ignored or dead-lettered)."""
    health = health if health is not None else ConsumerHealth()
    handled = 0
    held: list[Delivery[trajectory_pb2.Trajectory]] = []  # read, not yet acked
    group_ready = False
    batch_failures = 0
    while not stop.is_set():
        stage = "reading the trajectory stream"
        try:
            if not group_ready:
                stage = "creating the consumer group"
                await consumer.ensure_group()
                group_ready = True
                stage = "reading the trajectory stream"
            if not held:
                held = await _read_unless_stopped(consumer, stop)
            if held:
                stage = "recording stream outcomes"
                handled += await _handle(
                    store, consumer, held, health, one_by_one=batch_failures >= MAX_BATCH_FAILURES
                )
                held = []
            batch_failures = 0
            health.progressed()
        except Exception as exc:  # the loop outlives every failure (not cancellation); each is logged
            health.failed(exc)
            if held and not isinstance(exc, (*REDIS_AWAY, RedisError)):
                batch_failures += 1
            log.error(
                f"{stage} failed",
                exc_info=health.failures == 1 or health.failures % 20 == 0,
                extra={
                    "stream": consumer.stream, "group": consumer.group, "failures": health.failures,
                    "held": len(held), "error": health.last_error, "stalled": health.stalled(),
                },
            )  # fmt: skip
            await _pause(_backoff(health.failures))
    return handled


async def _handle(
    store: CurriculumStore,
    consumer: ProtoStreamConsumer[trajectory_pb2.Trajectory],
    deliveries: Sequence[Delivery[trajectory_pb2.Trajectory]],
    health: ConsumerHealth,
    *,
    one_by_one: bool,
) -> int:
    """Dead-letter the poison, ack the foreign, record the rest and ack them."""
    good: list[tuple[Delivery[trajectory_pb2.Trajectory], pb.TaskOutcome]] = []
    foreign: list[Delivery[trajectory_pb2.Trajectory]] = []
    for d in deliveries:
        try:
            outcome = outcome_of(d.message)
            store.check_outcome(outcome)
        except UnknownBucket:
            foreign.append(d)
            continue
        except Exception as exc:  # whatever makes an entry unusable: dead-lettered
            await _dead_letter(consumer, d, exc, health)
            continue
        good.append((d, outcome))
    if foreign:
        await store.count_ignored(len(foreign))
        await consumer.ack(foreign)
        health.ignored += len(foreign)
        log.info(
            "ignored stream outcomes of buckets this curriculum does not schedule",
            extra={"count": len(foreign), "buckets": sorted({d.message.metadata.get("bucket", "") for d in foreign})[:5]},
        )  # fmt: skip
    if not one_by_one:
        health.recorded += await store.record([o for _, o in good], from_stream=True)
        await consumer.ack([d for d, _ in good])
    else:
        for d, o in good:
            try:
                health.recorded += await store.record([o], from_stream=True)
            except (*REDIS_AWAY, RedisError):
                raise  # Redis itself (away, out of memory, read-only): retried, never blamed on the entry
            except Exception as exc:  # failed alone, not in Redis: the entry is the cause
                await _dead_letter(consumer, d, exc, health)
                continue
            await consumer.ack([d])
    return len(deliveries)


async def _dead_letter(
    consumer: ProtoStreamConsumer[trajectory_pb2.Trajectory],
    delivery: Delivery[trajectory_pb2.Trajectory],
    exc: BaseException,
    health: ConsumerHealth,
) -> None:
    reason = str(exc) if isinstance(exc, InvalidOutcome) else f"{type(exc).__name__}: {exc}"
    log.warning(
        "dead-lettering a trajectory the curriculum cannot record",
        extra={"entry": delivery.entry_id, "trajectory_id": delivery.message.trajectory_id, "reason": reason},
    )
    await consumer.dead_letter(delivery, reason[:1000])
    health.dead_lettered += 1
