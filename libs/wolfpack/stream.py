"""Protobuf messages over Redis Streams with consumer groups: at-least-once, lossless, idempotent, bounded.

Why each piece exists:
- *Consumer groups + acks*: a trajectory leaves a consumer's pending list only after the trainer used it
  (``ack`` after its update is committed, or ``ack_in`` the same Redis transaction as the commit), so a
  crash between read and ack loses nothing.
- *Trim only what every group acked*: each append trims the stream below the oldest entry some group
  still needs (its oldest pending entry, else just past its last-delivered one; ``XTRIM MINID``). No
  group ever loses an entry it has not acked; with no group at all nothing is trimmed. A group that does
  not exist yet protects nothing, so producers first create the ``required_groups``
  (``WOLFPACK_STREAM_REQUIRED_GROUPS``, default the trainer's) from the stream's start: a rollout run
  before any trainer leaves its trajectories for the trainer instead of losing them to another group's acks.
- *Backpressure*: what is left is the backlog (entries some group has not acked). Past ``maxlen`` an
  append waits for consumers, up to ``backpressure_timeout_s``, then raises ``StreamBackpressureError``:
  memory stays bounded and a lagging trainer slows the producers down instead of losing data.
- *Coalesced single appends*: ``append`` (one message, the rollout driver's call, from many episodes at
  once) queues its message; one flush in flight at a time sends everything queued as one script call, so
  N concurrent appends cost about one round trip and one script run instead of N (an append that finds
  nothing in flight sends its own message at once, as a lone append always did). Each caller still gets
  its own entry id or its own error, and its own trace context travels with its own entry.
- *Idempotent appends*: one Lua script per batch (one round trip) appends each message only if its id
  (``id_of(message)``, e.g. ``Trajectory.trajectory_id``) was not appended within the last
  ``dedup_ttl_s`` (to 2x that: ids are kept in per-period hashes, two periods at a time); so a
  producer retrying after a lost reply (or a rollout re-sending a trajectory) never creates a duplicate
  entry, and consumers need no per-entry check. What remains is at-least-once redelivery of an entry whose
  consumer died before acking: a consumer that must not apply it twice commits and acks atomically
  (``ack_in``) or dedups by ``Delivery.message_id`` in its own committed state.
- *Retries*: producers and consumers retry ``ConnectionError``/``TimeoutError`` with exponential backoff
  for ``retry_timeout_s`` (a Redis restart); a consumer whose group vanished recreates it and resumes.
- *Reclaim on its own cadence*: every ``reclaim_interval_ms`` a consumer lists entries idle longer than
  ``claim_idle_ms`` on any consumer (typically one that died) with their per-entry delivery counts.
  Entries delivered once are claimed as a batch; entries delivered twice or more are suspects and are
  handed out alone, so a message that crashes its consumer takes no neighbour down with it.
- *Dead letters*: an entry not acked after ``max_deliveries`` deliveries, or one that is malformed (no
  ``data`` field, or bytes that do not parse), is moved to ``<stream>:dead`` with the reason, atomically
  with its ack.
- *Tracing*: the producer's W3C trace context travels in the entry, so the consumer's span joins the
  episode's trace across the queue (extracted lazily: a consumer that does not trace pays nothing). A
  process that never loaded OpenTelemetry (the trainer's local mode) has no trace context to send and
  loads none of it (``wolfpack.tracing``); nor does it register the backlog gauge, which is registered
  with the first producer made once OpenTelemetry is loaded (every service process loads it).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import sys
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import redis.asyncio as aioredis
from google.protobuf.message import DecodeError, Message
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from wolfpack import tracing
from wolfpack.settings import Settings

if TYPE_CHECKING:
    from opentelemetry import metrics
    from opentelemetry.context import Context

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
T = TypeVar("T")

F_DATA = b"data"
F_ID = b"id"
F_TRACEPARENT = b"traceparent"
F_TRACESTATE = b"tracestate"
DEAD_LETTER_MAXLEN = 100_000
APPEND_CHUNK = 1000  # messages per append script call (Lua's unpack() limit is ~8000 values)

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError, OSError)


class StreamError(RuntimeError):
    """Base class of the stream library's own errors."""


class StreamBackpressureError(StreamError):
    """The backlog stayed at or above the bound for the whole backpressure timeout: consumers lag."""

    def __init__(self, stream: str, backlog: int, bound: int, waited_s: float) -> None:
        super().__init__(
            f"stream {stream!r}: backlog {backlog} entries not yet acked by every consumer group is at the "
            f"bound {bound} after waiting {waited_s:.1f}s; the slowest group must catch up (or be deleted "
            "with XGROUP DESTROY if it is abandoned)"
        )
        self.stream = stream
        self.backlog = backlog
        self.bound = bound


class StreamUnavailableError(StreamError):
    """Redis stayed unreachable for the whole retry window."""


def dead_letter_key(stream: str) -> str:
    return f"{stream}:dead"


def ids_key(stream: str, bucket: int) -> str:
    """Hash of message id -> entry id for messages appended in time bucket ``bucket`` (of
    ``dedup_ttl_s`` seconds), so a retried append is a no-op; it expires two buckets after its last write."""
    return f"{stream}:ids:{bucket}"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long and how often transient Redis errors (connection lost, server restarting) are retried."""

    timeout_s: float = 30.0
    initial_backoff_s: float = 0.02
    max_backoff_s: float = 1.0


async def retrying(op: Callable[[], Awaitable[T]], policy: RetryPolicy, what: str) -> T:
    """Run ``op`` until it succeeds, retrying transient errors with jittered exponential backoff."""
    deadline = time.monotonic() + policy.timeout_s
    backoff = policy.initial_backoff_s
    while True:
        try:
            return await op()
        except TRANSIENT_ERRORS as exc:
            if time.monotonic() + backoff > deadline:
                raise StreamUnavailableError(
                    f"{what}: Redis unreachable for {policy.timeout_s}s: {exc}"
                ) from exc
            log.debug("transient redis error, retrying", extra={"op": what, "error": str(exc)})
            await asyncio.sleep(backoff * (0.5 + random.random() / 2))
            backoff = min(backoff * 2, policy.max_backoff_s)


class _Script:
    """A Lua script called by EVALSHA (falls back to EVAL once after a restart flushed the script cache)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, client: aioredis.Redis, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await client.eval(self.source, len(keys), *keys, *args)


# Shared by the scripts: the lowest entry id any group still needs, and trimming below it.
_TRIM_LUA = """
local function id_lt(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if #am ~= #bm then return #am < #bm end
  if am ~= bm then return am < bm end
  if #as ~= #bs then return #as < #bs end
  return as < bs
end
local function successor(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if #seq > 15 then return id end
  return ms .. '-' .. string.format('%d', tonumber(seq) + 1)
end
-- Trim entries every group has acked; return the backlog (entries left).
local function trim(stream)
  if redis.call('EXISTS', stream) == 0 then return 0 end
  local groups = redis.call('XINFO', 'GROUPS', stream)
  if #groups == 0 then return redis.call('XLEN', stream) end
  local floor = nil
  for _, g in ipairs(groups) do
    local name, pending, last
    for k = 1, #g, 2 do
      local key = g[k]
      if key == 'name' then name = g[k + 1]
      elseif key == 'pending' then pending = g[k + 1]
      elseif key == 'last-delivered-id' then last = g[k + 1] end
    end
    local keep
    if pending > 0 then keep = redis.call('XPENDING', stream, name)[2] else keep = successor(last) end
    if floor == nil or id_lt(keep, floor) then floor = keep end
  end
  redis.call('XTRIM', stream, 'MINID', floor)
  return redis.call('XLEN', stream)
end
"""

# KEYS: stream, message-id hash of the current time bucket, of the previous one. ARGV: bound (0: none),
# bucket length s, n extra field pairs, the pairs, then data and message id per message; or, with n = -1,
# data, message id, traceparent and tracestate per message ('' for none: coalesced appends from different
# traces). Returns
# {admitted (0/1), backlog, entry id per message..., duplicates}; nothing is written unless admitted.
# A message whose id is in either hash (or earlier in the batch) is not appended: its first entry id is
# returned. Two redis.calls per batch for the ids (HMGET, HSET), not two per message.
_APPEND = _Script(
    _TRIM_LUA
    + """
local stream = KEYS[1]
local bound = tonumber(ARGV[1])
local nextra = tonumber(ARGV[3])
local per = nextra < 0
local stride = 2
local base = 3 + 2 * nextra
if per then stride, base = 4, 3 end
local n = (#ARGV - base) / stride
local ids = {}
for i = 1, n do ids[i] = ARGV[base + stride * (i - 1) + 2] end
local cur = redis.call('HMGET', KEYS[2], unpack(ids))
local prev = redis.call('HMGET', KEYS[3], unpack(ids))
local fresh = 0
for i = 1, n do
  if not (cur[i] or prev[i]) then fresh = fresh + 1 end
end
local backlog = trim(stream)
if fresh > 0 and bound > 0 and backlog >= bound then return {0, backlog} end
local out = {1, 0}
local fields = {'data', false, 'id', false}
if not per then
  for j = 1, 2 * nextra do fields[4 + j] = ARGV[3 + j] end
end
local xadd = redis.call
local seen = {}
local written = {}
local dups = 0
for i = 1, n do
  local known = cur[i] or prev[i] or seen[ids[i]]
  if known then
    out[i + 2] = known
    dups = dups + 1
  else
    local id
    local at = base + stride * (i - 1) + 1
    if per then
      local tp, ts = ARGV[at + 2], ARGV[at + 3]
      if tp == '' then
        id = xadd('XADD', stream, '*', 'data', ARGV[at], 'id', ids[i])
      elseif ts == '' then
        id = xadd('XADD', stream, '*', 'data', ARGV[at], 'id', ids[i], 'traceparent', tp)
      else
        id = xadd('XADD', stream, '*', 'data', ARGV[at], 'id', ids[i], 'traceparent', tp, 'tracestate', ts)
      end
    elseif nextra == 0 then
      id = xadd('XADD', stream, '*', 'data', ARGV[at], 'id', ids[i])
    else
      fields[2] = ARGV[at]
      fields[4] = ids[i]
      id = xadd('XADD', stream, '*', unpack(fields))
    end
    seen[ids[i]] = id
    written[#written + 1] = ids[i]
    written[#written + 1] = id
    out[i + 2] = id
  end
end
if #written > 0 then
  redis.call('HSET', KEYS[2], unpack(written))
  redis.call('EXPIRE', KEYS[2], 2 * tonumber(ARGV[2]))
end
out[2] = backlog + n - dups
out[n + 3] = dups
return out
"""
)

_BACKLOG = _Script(_TRIM_LUA + "\nreturn trim(KEYS[1])\n")

# KEYS: stream, dead-letter stream. ARGV: group, consumer, min idle ms, max deliveries, dead maxlen, ids.
# Claims each id still idle for min idle ms (another consumer may have taken it meanwhile), reads its
# delivery count, and dead-letters it (atomically with its ack) if that exceeds max deliveries.
# Returns {dead-lettered, {{id, fields, count}...}}.
_CLAIM = _Script(
    """
local stream, group = KEYS[1], ARGV[1]
local max = tonumber(ARGV[4])
local out = {}
local dead = 0
for i = 6, #ARGV do
  local id = ARGV[i]
  local c = redis.call('XCLAIM', stream, group, ARGV[2], ARGV[3], id)
  local e = c[1]
  if e and e[2] then
    local count = redis.call('XPENDING', stream, group, id, id, 1)[1][4]
    if count > max then
      local f = e[2]
      f[#f + 1] = 'reason'
      f[#f + 1] = 'not acknowledged after ' .. (count - 1) .. ' deliveries (max_deliveries=' .. max .. ')'
      f[#f + 1] = 'source_entry'
      f[#f + 1] = id
      f[#f + 1] = 'group'
      f[#f + 1] = group
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', unpack(f))
      redis.call('XACK', stream, group, id)
      dead = dead + 1
    else
      out[#out + 1] = {id, e[2], count}
    end
  elseif e == false then
    redis.call('XACK', stream, group, id)
  end
end
return {dead, out}
"""
)


# KEYS: stream, dead-letter stream. ARGV: group, dead maxlen, entry id, then the dead entry's field pairs.
# Dead-letters only an entry still pending (acked now, atomically), so a retry never copies it twice.
_DEAD = _Script(
    """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[3]) == 0 then return 0 end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 4))
return 1
"""
)


_PRODUCERS: weakref.WeakSet[ProtoStreamProducer[Any]] = weakref.WeakSet()


def _observe_backlog(_options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
    from opentelemetry import metrics

    for producer in list(_PRODUCERS):
        yield metrics.Observation(producer.last_backlog, {"stream": producer.stream})


_gauge_registered = False


def _register_backlog_gauge() -> None:
    """Register the ``wolfpack.stream.backlog`` gauge (over every producer) once OpenTelemetry is loaded:
    without it no meter provider can have been set, so nobody could collect it (see the module docstring)."""
    global _gauge_registered
    if _gauge_registered or "opentelemetry" not in sys.modules:
        return
    from opentelemetry import metrics

    _gauge_registered = True
    metrics.get_meter("wolfpack.stream").create_observable_gauge(
        "wolfpack.stream.backlog",
        callbacks=[_observe_backlog],
        unit="{entry}",
        description="Entries not yet acked by every consumer group, as of each producer's last append.",
    )


class Delivery(Generic[M]):
    """One entry handed to a consumer. ``context`` is the producer's trace context (use as parent).

    Ids are decoded and the trace context extracted on first access: a consumer reading thousands of
    entries a second pays only for what it uses.
    """

    __slots__ = ("_context", "_entry_id", "_fields", "_message_id", "_raw_id", "deliveries", "message")

    def __init__(
        self, entry_id: str, message_id: str, message: M, deliveries: int, context: Context | None = None
    ) -> None:
        self._entry_id: str | None = entry_id
        self._raw_id = entry_id.encode()
        self._message_id: str | None = message_id
        self.message = message
        self.deliveries = deliveries
        self._context: Context | None = context
        self._fields: Sequence[bytes] = ()

    @classmethod
    def _of_entry(cls, raw_id: bytes, fields: Sequence[bytes], message: M, deliveries: int) -> Delivery[M]:
        d = cls.__new__(cls)
        d._raw_id = raw_id
        d._fields = fields
        d.message = message
        d.deliveries = deliveries
        d._entry_id = d._message_id = d._context = None
        return d

    @property
    def entry_id(self) -> str:
        if self._entry_id is None:
            self._entry_id = self._raw_id.decode()
        return self._entry_id

    @property
    def message_id(self) -> str:
        if self._message_id is None:
            mid = _field(self._fields, F_ID)
            self._message_id = mid.decode() if mid else ""
        return self._message_id

    @property
    def context(self) -> Context:
        if self._context is None:
            carrier = {}
            for key in (F_TRACEPARENT, F_TRACESTATE):
                value = _field(self._fields, key)
                if value is not None:
                    carrier[key.decode()] = value.decode()
            self._context = tracing.extract_carrier(carrier)
        return self._context

    def __repr__(self) -> str:
        return f"Delivery(entry_id={self.entry_id!r}, message_id={self.message_id!r}, deliveries={self.deliveries})"


def required_groups(settings: Settings) -> tuple[str, ...]:
    """The consumer groups of ``WOLFPACK_STREAM_REQUIRED_GROUPS`` (comma-separated; blanks dropped)."""
    return tuple(g.strip() for g in settings.stream_required_groups.split(",") if g.strip())


class ProtoStreamProducer(Generic[M]):
    """Appends protobuf messages, each with its own id and the current trace context.

    ``maxlen`` bounds the backlog (entries some consumer group has not acked): past it, appends wait up
    to ``backpressure_timeout_s`` for consumers, then raise ``StreamBackpressureError``. A batch is
    admitted whole while the backlog is under the bound, so it may overshoot by one batch. ``0``: no bound.
    ``required_groups`` are created before the first append (``ensure_required_groups``), so entries wait
    for those consumers even when they have not started yet.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        stream: str,
        id_of: Callable[[M], str],
        maxlen: int = 100_000,
        *,
        backpressure_timeout_s: float = 60.0,
        dedup_ttl_s: int = 7 * 24 * 3600,
        retry: RetryPolicy = RetryPolicy(),
        required_groups: Sequence[str] = (),
    ) -> None:
        if dedup_ttl_s < 1 or maxlen < 0:
            raise ValueError("dedup_ttl_s must be >= 1 and maxlen >= 0")
        self.required_groups = tuple(g for g in required_groups if g)
        self._groups_ready = not self.required_groups
        self.client = client
        self.stream = stream
        self.id_of = id_of
        self.maxlen = maxlen
        self.backpressure_timeout_s = backpressure_timeout_s
        self.dedup_ttl_s = dedup_ttl_s
        self.retry = retry
        self.last_backlog = 0
        self.duplicates = 0
        self.backpressure_waits = 0
        self.flushes = 0  # script calls made for ``append`` (fewer than appends when they coalesce)
        # Single appends waiting for the flush in flight: (data, message id, traceparent, tracestate, waiter).
        self._queued: list[tuple[bytes, bytes, str, str, asyncio.Future[str]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._sending = False  # an ``append`` is sending its own message (nothing was in flight)
        _PRODUCERS.add(self)
        _register_backlog_gauge()

    @classmethod
    def from_settings(
        cls, client: aioredis.Redis, settings: Settings, id_of: Callable[[M], str], stream: str | None = None
    ) -> ProtoStreamProducer[M]:
        """A producer on ``stream`` (default: the trajectory stream) with the ``WOLFPACK_STREAM_*`` bounds."""
        return cls(
            client,
            stream or settings.stream_trajectories,
            id_of,
            settings.stream_maxlen,
            backpressure_timeout_s=settings.stream_backpressure_timeout_s,
            retry=RetryPolicy(timeout_s=settings.stream_retry_timeout_s),
            required_groups=required_groups(settings),
        )

    async def ensure_required_groups(self) -> None:
        """Create every ``required_groups`` group from the stream's start (``XGROUP CREATE … 0 MKSTREAM``)
        unless it exists; an existing group keeps its position. Done once, before the first append:
        trimming only protects groups that exist, so without this a stream whose only group so far is,
        say, the curriculum's would be trimmed of entries the trainer has not yet read."""
        for group in self.required_groups:

            async def create(group: str = group) -> None:
                try:
                    await self.client.xgroup_create(self.stream, group, id="0", mkstream=True)
                except ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise

            await retrying(create, self.retry, f"create group {group} on {self.stream}")
        self._groups_ready = True

    async def append(self, message: M) -> str:
        """Append one message; returns its entry id (the earlier entry's for an id already appended).

        Concurrent calls coalesce (see the module docstring): the message is serialized now and queued,
        and the flush in flight, or a new one, sends every queued message in one script call. Its result
        is this call's alone: its entry id, or the error of the script call that carried it
        (``StreamBackpressureError``, ``StreamUnavailableError``, …; a retry is safe, appends are
        idempotent). A bad message (empty id) fails here, before anything is queued. A caller cancelled
        while waiting may still have its message appended (at-least-once, as with any lost reply)."""
        message_id = self.id_of(message)
        if not message_id:
            raise ValueError("id_of(message) returned an empty id; every message needs its own id")
        data = message.SerializeToString()
        carrier = tracing.inject_carrier()
        tp, ts = carrier.get("traceparent", ""), carrier.get("tracestate", "")
        if self._flusher is None and not self._sending:
            # Nothing in flight: this call sends its own message (no task to start, no wake-up to wait
            # for); appends arriving meanwhile queue, and go together once it returns.
            self._sending = True
            self.flushes += 1
            try:
                return (await self._send(self._script_args([(data, message_id.encode(), tp, ts)])))[0]
            finally:
                self._sending = False
                if self._queued and self._flusher is None:
                    self._flusher = asyncio.ensure_future(self._flush_queued())
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._queued.append((data, message_id.encode(), tp, ts, waiter))
        return await waiter

    def _script_args(self, batch: Sequence[tuple[bytes, bytes, str, str]]) -> list[bytes | str | int]:
        """The append script's arguments for (data, message id, traceparent, tracestate) per message: the
        shared-fields form when they all have one trace context (or none), else per-message fields."""
        args: list[bytes | str | int] = [self.maxlen, self.dedup_ttl_s]
        contexts = {(tp, ts) for _d, _i, tp, ts in batch}
        if len(contexts) == 1:
            tp, ts = next(iter(contexts))
            extra = [(k, v) for k, v in (("traceparent", tp), ("tracestate", ts)) if v]
            args.append(len(extra))
            for k, v in extra:
                args += (k, v)
            for data, mid, _tp, _ts in batch:
                args += (data, mid)
        else:
            args.append(-1)
            for data, mid, tp, ts in batch:
                args += (data, mid, tp, ts)
        return args

    async def _flush_queued(self) -> None:
        """Send queued single appends, ``APPEND_CHUNK`` at a time, until none is left; settle each waiter."""
        batch: list[tuple[bytes, bytes, str, str, asyncio.Future[str]]] = []
        try:
            while self._queued:
                batch, self._queued = self._queued[:APPEND_CHUNK], self._queued[APPEND_CHUNK:]
                args = self._script_args([(data, mid, tp, ts) for data, mid, tp, ts, _w in batch])
                self.flushes += 1
                try:
                    ids = await self._send(args)
                except Exception as exc:
                    for *_rest, waiter in batch:
                        if not waiter.done():
                            waiter.set_exception(exc)
                    continue
                for (*_rest, waiter), entry_id in zip(batch, ids, strict=True):
                    if not waiter.done():
                        waiter.set_result(entry_id)
        finally:
            self._flusher = None
            # Cancelled (the loop is shutting down): nobody is left to send these; their callers learn it.
            left, self._queued = [*batch, *self._queued], []
            for *_rest, waiter in left:
                if not waiter.done():
                    waiter.cancel()

    async def append_many(self, messages: Sequence[M]) -> list[str]:
        """Append in one round trip per ``APPEND_CHUNK`` messages; returns the entry ids (a message whose
        id was already appended gets the earlier entry's id and is not appended again)."""
        out: list[str] = []
        for start in range(0, len(messages), APPEND_CHUNK):
            out += await self._append_chunk(messages[start : start + APPEND_CHUNK])
        return out

    async def _append_chunk(self, messages: Sequence[M]) -> list[str]:
        if not messages:
            return []
        args: list[bytes | str | int] = [self.maxlen, self.dedup_ttl_s]
        carrier = tracing.inject_carrier()
        extra = [(k, carrier[k]) for k in ("traceparent", "tracestate") if k in carrier]
        args.append(len(extra))
        for k, v in extra:
            args += (k, v)
        for m in messages:
            message_id = self.id_of(m)
            if not message_id:
                raise ValueError("id_of(message) returned an empty id; every message needs its own id")
            args += (m.SerializeToString(), message_id.encode())
        return await self._send(args)

    async def _send(self, args: list[bytes | str | int]) -> list[str]:
        """Run the append script with ``args`` (bound, bucket length, messages; see ``_APPEND``), waiting
        out backpressure; returns the entry ids."""
        if not self._groups_ready:
            await self.ensure_required_groups()
        bucket = int(time.time()) // self.dedup_ttl_s
        keys = [self.stream, ids_key(self.stream, bucket), ids_key(self.stream, bucket - 1)]
        started = time.monotonic()
        wait = 0.01
        blocked = False
        while True:
            reply = await retrying(
                lambda: _APPEND(self.client, keys, args), self.retry, f"append to {self.stream}"
            )
            self.last_backlog = int(reply[1])
            if int(reply[0]):
                self.duplicates += int(reply[-1])
                return [_s(e) for e in reply[2:-1]]
            waited = time.monotonic() - started
            if waited >= self.backpressure_timeout_s:
                raise StreamBackpressureError(self.stream, self.last_backlog, self.maxlen, waited)
            if not blocked:
                blocked = True
                self.backpressure_waits += 1
            await asyncio.sleep(min(wait, max(self.backpressure_timeout_s - waited, 0.0)))
            wait = min(wait * 2, 0.25)

    async def backlog(self) -> int:
        """Entries not yet acked by every consumer group (after trimming the acked ones)."""
        self.last_backlog = int(
            await retrying(lambda: _BACKLOG(self.client, [self.stream], []), self.retry, "backlog")
        )
        return self.last_backlog


class ProtoStreamConsumer(Generic[M]):
    """One consumer of a consumer group. Call ``read()`` in a loop and ``ack()`` what you processed.

    ``read()`` returns either reclaimed entries (from dead consumers; an entry delivered twice or more
    comes alone) or new ones, at most ``batch``; it blocks up to ``block_ms`` when there is nothing.
    ``done_ttl_s`` is accepted for compatibility and unused: duplicates are stopped at append time.
    """

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
        done_ttl_s: int = 0,
        reclaim_interval_ms: int | None = None,
        retry: RetryPolicy = RetryPolicy(),
    ) -> None:
        self.client = client
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.message_type = message_type
        self.batch = batch
        self.block_ms = block_ms
        self.claim_idle_ms = claim_idle_ms
        self.max_deliveries = max_deliveries
        self.reclaim_interval_s = (
            reclaim_interval_ms if reclaim_interval_ms is not None else min(claim_idle_ms // 2, 10_000)
        ) / 1000
        self.retry = retry
        self.dead_lettered = 0
        self.reclaimed = 0
        self._next_reclaim = 0.0
        self._claim_batch: list[str] = []
        self._claim_alone: deque[str] = deque()
        self._dead = dead_letter_key(stream)

    @classmethod
    def from_settings(
        cls,
        client: aioredis.Redis,
        settings: Settings,
        group: str,
        consumer: str,
        message_type: type[M],
        stream: str | None = None,
        **kwargs: Any,
    ) -> ProtoStreamConsumer[M]:
        """A consumer of ``stream`` (default: the trajectory stream) with the ``WOLFPACK_STREAM_*``
        reclaim, dead-letter and retry settings; ``kwargs`` (``batch``, ``block_ms``, …) pass through."""
        return cls(
            client,
            stream or settings.stream_trajectories,
            group,
            consumer,
            message_type,
            claim_idle_ms=settings.stream_claim_idle_ms,
            max_deliveries=settings.stream_max_deliveries,
            retry=RetryPolicy(timeout_s=settings.stream_retry_timeout_s),
            **kwargs,
        )

    async def ensure_group(self) -> None:
        """Create the group (and the stream) if missing; starting from the beginning loses nothing."""
        try:
            await self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _call(self, op: Callable[[], Awaitable[T]], what: str) -> T:
        """``op`` with transient errors retried and a vanished group (Redis restarted empty) recreated."""

        async def attempt() -> T:
            try:
                return await op()
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                log.warning("consumer group missing; recreating it", extra={"stream": self.stream})
                await self.ensure_group()
                return await op()

        return await retrying(attempt, self.retry, f"{what} on {self.stream}")

    async def read(self) -> list[Delivery[M]]:
        """Reclaimed entries first (on the reclaim cadence), then new ones (blocking up to ``block_ms``);
        malformed entries go to the dead-letter stream instead."""
        if time.monotonic() >= self._next_reclaim:
            await self._call(self._scan_idle, "reclaim scan")
        while self._claim_batch or self._claim_alone:
            if self._claim_batch:
                ids, self._claim_batch = self._claim_batch, []
            else:
                ids = [self._claim_alone.popleft()]
            claimed = await self._claim(ids)
            if claimed:
                return claimed
        # Spelled as bytes, the command name matches none of redis-py's reply callbacks: the reply stays
        # flat ([id, [field, value, ...]] per entry) and no dict is built per entry (~1 us each).
        resp = await self._call(
            lambda: self.client.execute_command(
                b"XREADGROUP", b"GROUP", self.group, self.consumer, b"COUNT", self.batch,
                b"BLOCK", self.block_ms, b"STREAMS", self.stream, b">",
            ),
            "read",
        )  # fmt: skip
        if not resp:
            return []
        return await self._accept(_flat_entries(resp), None)

    async def _scan_idle(self) -> None:
        """List entries idle past ``claim_idle_ms`` (any consumer's, ours too) with their delivery counts."""
        pending = await self.client.xpending_range(
            self.stream, self.group, min="-", max="+", count=self.batch, idle=self.claim_idle_ms
        )
        batch: list[str] = []
        alone: deque[str] = deque()
        for p in pending:
            count = int(p["times_delivered"])
            (alone if 2 <= count <= self.max_deliveries else batch).append(_s(p["message_id"]))
        self._claim_batch, self._claim_alone = batch, alone
        # A full page means more may be idle: scan again on the next read instead of waiting.
        self._next_reclaim = time.monotonic() + (0 if len(pending) >= self.batch else self.reclaim_interval_s)

    async def _claim(self, ids: list[str]) -> list[Delivery[M]]:
        args = [self.group, self.consumer, self.claim_idle_ms, self.max_deliveries, DEAD_LETTER_MAXLEN, *ids]
        reply = await self._call(lambda: _CLAIM(self.client, [self.stream, self._dead], args), "claim")
        if int(reply[0]):
            self.dead_lettered += int(reply[0])
            log.warning(
                "dead-lettered entries not acked after max deliveries",
                extra={"stream": self.stream, "count": int(reply[0]), "max_deliveries": self.max_deliveries},
            )
        entries = reply[1]
        self.reclaimed += len(entries)
        return await self._accept(
            [(e[0], e[1]) for e in entries],
            [int(e[2]) for e in entries],
        )

    async def _accept(
        self, entries: Sequence[Sequence[Any]], counts: Sequence[int] | None
    ) -> list[Delivery[M]]:
        """Entries as ``(entry id, [field, value, ...])`` to deliveries; malformed ones dead-lettered."""
        out: list[Delivery[M]] = []
        bad: list[tuple[bytes, Sequence[bytes], str]] = []
        parse = self.message_type.FromString
        make = Delivery[M]._of_entry
        for i, (raw_id, fields) in enumerate(entries):
            # The producer writes data first; anything else (a hand-written entry) is searched.
            data = fields[1] if fields and fields[0] == F_DATA else _field(fields, F_DATA)
            if data is None:
                bad.append((raw_id, fields, "malformed entry: no data field"))
                continue
            try:
                message = parse(data)
            except DecodeError as exc:
                bad.append((raw_id, fields, f"undecodable {self.message_type.__name__}: {exc}"))
                continue
            out.append(make(raw_id, fields, message, counts[i] if counts else 1))
        if bad:
            await self._dead_letter_raw(bad)
        return out

    async def _dead_letter_raw(self, bad: Sequence[tuple[bytes, Sequence[bytes], str]]) -> None:
        for raw_id, fields, reason in bad:
            log.warning(
                "dead-lettering stream entry",
                extra={"stream": self.stream, "entry": _s(raw_id), "reason": reason},
            )
            dead = [
                *fields,
                b"reason",
                reason.encode(),
                b"source_entry",
                raw_id,
                b"group",
                self.group.encode(),
            ]
            args = [self.group, DEAD_LETTER_MAXLEN, raw_id, *dead]
            moved = await self._call(
                partial(_DEAD, self.client, [self.stream, self._dead], args), "dead-letter"
            )
            self.dead_lettered += int(moved)

    async def dead_letter(self, delivery: Delivery[M], reason: str) -> None:
        """Move an entry the caller rejects (e.g. fails validation) to the dead-letter stream, acked."""
        fields = [F_DATA, delivery.message.SerializeToString(), F_ID, delivery.message_id.encode()]
        await self._dead_letter_raw([(delivery.entry_id.encode(), fields, reason)])

    async def keep_alive(self, deliveries: Sequence[Delivery[M]]) -> None:
        """Reset the idle time of entries still being worked on (no delivery counted), so nobody reclaims
        them: call it when holding entries longer than ``claim_idle_ms`` between read and ack."""
        if deliveries:
            ids = [d._raw_id for d in deliveries]
            await self._call(
                lambda: self.client.xclaim(self.stream, self.group, self.consumer, 0, ids, justid=True),
                "keep alive",
            )

    def ack_in(self, pipe: aioredis.client.Pipeline, deliveries: Sequence[Delivery[M]]) -> None:
        """Queue the ack of ``deliveries`` on the caller's pipeline (``transaction=True``), so a commit the
        caller writes to Redis and the ack succeed or fail together (exactly-once processing)."""
        if deliveries:
            pipe.xack(self.stream, self.group, *[d._raw_id for d in deliveries])

    async def ack(self, deliveries: Sequence[Delivery[M]]) -> int:
        """Ack processed entries in one round trip; returns how many were still pending."""
        if not deliveries:
            return 0
        ids = [d._raw_id for d in deliveries]
        return int(await self._call(lambda: self.client.xack(self.stream, self.group, *ids), "ack"))

    async def pending_count(self) -> int:
        info = await self._call(lambda: self.client.xpending(self.stream, self.group), "pending")
        return int(info["pending"])


def _field(flat: Sequence[bytes], name: bytes) -> bytes | None:
    """The value of ``name`` in a flat ``[field, value, ...]`` list."""
    for k in range(0, len(flat) - 1, 2):
        if flat[k] == name:
            return flat[k + 1]
    return None


def _flat_entries(resp: Any) -> list[tuple[bytes, Sequence[bytes]]]:
    """The entries of a one-stream XREADGROUP reply as ``(id, [field, value, ...])``, whether it came back
    raw (the usual case, see ``read``) or parsed by a client-side callback, RESP2 (a list of streams)
    or RESP3 (a map of streams, parsed values wrapped in a list)."""
    entries = next(iter(resp.values())) if isinstance(resp, dict) else resp[0][1]
    if entries and isinstance(entries[0][0], list | tuple):  # RESP3 parsed: [[entries]]
        entries = entries[0]
    if entries and isinstance(entries[0][1], dict):
        return [(e, [x for kv in f.items() for x in kv]) for e, f in entries]
    return entries  # type: ignore[no-any-return]


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
