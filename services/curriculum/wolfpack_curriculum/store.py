"""The curriculum's state in Redis, so a restart (or a second replica) loses nothing.

Keys (all under ``key_prefix``):

| key | type | what |
|---|---|---|
| ``seed:<bucket>`` / ``evalseed:<bucket>`` | counter | next fresh train / eval seed of a bucket |
| ``weights:<bucket>`` | hash | AIW weight by task key |
| ``failures`` | list | failure history (JSON ``{task_key, fingerprint}``), newest last, capped |
| ``stats:<bucket>`` | hash | ``scheduled``, ``finished``, ``failures`` |
| ``recent:<bucket>`` | list | last outcomes (``1``/``0``), capped at ``recent_window`` |
| ``league`` | hash | opponent id → ``Opponent`` proto (base64; rating, games, ...), at most ``league.max_opponents`` |
| ``trainee`` | hash | the trainee's ``rating``, ``games``, ``wins``, ``losses``, ``draws`` |
| ``recorded`` | sorted set | trajectory ids already recorded (idempotency across RPC and stream), the newest ``recorded_window`` |
| ``counters`` | hash | ``outcomes``, ``stream_outcomes``, ``ignored_outcomes``, ``calls``, ``recorded_seq`` |

``<bucket>`` is always a bucket of the config: an outcome naming another bucket is refused (RPC:
INVALID_ARGUMENT) or, from the stream, counted in ``ignored_outcomes`` and not applied, so no caller can
add keys. (Before: a ``seen`` set that grew by one id per outcome forever; it is no longer read.)

Why a Lua script for outcomes: an outcome's effects (weights, history, stats, ratings, the ``recorded``
marker) are computed in Python from state read just before, then applied in one script that first adds
the trajectory id to ``recorded`` and applies nothing when it was already there: a duplicate (the stream
redelivering, an RPC report of the same trajectory) changes nothing, and a crash leaves either all of
an outcome or none of it. The set keeps the newest ``recorded_window`` ids (scored by a sequence number):
duplicates arrive within minutes (a redelivery, an RPC report beside the stream), not 200,000 outcomes
later. One asyncio lock per process orders read-compute-apply.

What an outcome must be (``check_outcome``; the RPC refuses the whole call, the stream consumer
dead-letters the entry): a trajectory id, ids of at most ``MAX_ID_CHARS``, a finite score from 0 to 1 and
a finite mean reward (one NaN score used to make the trainee's and an opponent's Elo NaN for good), a
bucket of the config.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import random
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from wolfpack.errors import ServiceError
from wolfpack.v1 import curriculum_service_pb2 as pb
from wolfpack_curriculum import aiw, scheduler
from wolfpack_curriculum.config import CurriculumConfig
from wolfpack_curriculum.league import Entry, rate

MAX_TASKS_PER_CALL = 1024
"""Most tasks one NextTasks may ask for (whole groups: the answer holds up to ``group_size - 1`` more).
``count=2^31-1`` used to grow the service ~190 MB per 25 s until the deadline."""

MAX_OUTCOMES_PER_CALL = 256
"""Most outcomes one ReportOutcomes may carry: each is a few Redis round trips and up to ~20 ms of AIW
similarity work (a failure against a full history), so a call stays within seconds."""

MAX_ID_CHARS = 256
"""Longest trajectory, task and opponent id (they become Redis members and league keys)."""

LEAGUE_VIEW_TTL_S = 1.0
"""How long NextTasks reuses one read of the league (see ``CurriculumStore._league_view``)."""


class InvalidRequest(ServiceError, ValueError):
    """A request the caller must fix (INVALID_ARGUMENT)."""

    code = "INVALID_ARGUMENT"


class InvalidOutcome(InvalidRequest):
    """An outcome that cannot be recorded (the stream consumer dead-letters it with this message)."""


class UnknownBucket(InvalidOutcome):
    """An outcome of a bucket this curriculum does not schedule."""


class OpponentConflict(ServiceError):
    """A registration that would change an existing opponent's policy (ALREADY_EXISTS)."""

    code = "ALREADY_EXISTS"


class LeagueFull(ServiceError):
    """The league already holds ``league.max_opponents`` opponents (RESOURCE_EXHAUSTED)."""

    code = "RESOURCE_EXHAUSTED"


# KEYS: recorded (sorted set), counters. ARGV: trajectory id, ops (JSON), recorded_window.
_APPLY = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local seq = redis.call('HINCRBY', KEYS[2], 'recorded_seq', 1)
redis.call('ZADD', KEYS[1], seq, ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[3]) + 1))
local ops = cjson.decode(ARGV[2])
for _, op in ipairs(ops) do redis.call(unpack(op)) end
return 1
"""

TRAINEE_ID = "trainee"


class CurriculumStore:
    """Scheduling and learning over Redis state (see the module docstring)."""

    def __init__(self, client: aioredis.Redis, config: CurriculumConfig) -> None:
        self.r = client
        self.cfg = config
        self.p = config.key_prefix
        self.lock = asyncio.Lock()
        self._apply = client.register_script(_APPLY)
        self._buckets = {b.key for b in config.buckets}
        self._view: scheduler.LeagueView | None = None
        self._view_at = 0.0

    def k(self, *parts: str) -> str:
        return ":".join([self.p, *parts])

    # ------------------------------------------------------------------ league
    async def trainee(self) -> Entry:
        raw = await self.r.hgetall(self.k("trainee"))
        t = {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in raw.items()}
        return Entry(
            TRAINEE_ID, t.get("rating", self.cfg.league.initial_rating), int(t.get("games", 0)),
            int(t.get("wins", 0)), int(t.get("losses", 0)), int(t.get("draws", 0)),
        )  # fmt: skip

    async def league(self) -> tuple[Entry, list[tuple[Entry, pb.Opponent]]]:
        trainee = await self.trainee()
        out = []
        for blob in (await self.r.hgetall(self.k("league"))).values():
            o = _opponent(blob)
            out.append((_entry(o), o))
        out.sort(key=lambda eo: (-eo[0].rating, eo[0].opponent_id))
        return trainee, out

    async def register(self, opponent: pb.Opponent) -> tuple[pb.Opponent, bool]:
        """Add ``opponent`` (its record starts empty; a rating, if given, must be finite), or confirm an
        existing one with the same kind, policy and bot (its rating and record are kept). A different
        policy under an existing id is refused (ALREADY_EXISTS): the id's rating belongs to the policy it
        was earned with; register the new policy under a new id. An entry that joined from an outcome
        without a policy or bot (a placeholder) may be completed once. A full league refuses new ids."""
        _check_opponent(opponent)
        async with self.lock:
            existing = await self.r.hget(self.k("league"), opponent.opponent_id)
            stored = pb.Opponent(
                opponent_id=opponent.opponent_id, kind=opponent.kind, policy=opponent.policy, bot=opponent.bot
            )
            if existing is not None:
                old = _opponent(existing)
                if _identity(old) != _identity(stored) and (old.policy.policy_id or old.bot):
                    raise OpponentConflict(
                        f"opponent {old.opponent_id!r} is already registered as {_describe(old)}, not "
                        f"{_describe(stored)}; register the other policy under a new opponent id"
                    )
                stored.rating, stored.games = old.rating, old.games
                stored.wins, stored.losses, stored.draws = old.wins, old.losses, old.draws
            else:
                if await self.r.hlen(self.k("league")) >= self.cfg.league.max_opponents:
                    raise LeagueFull(
                        f"the league holds {self.cfg.league.max_opponents} opponents (league.max_opponents); "
                        f"{opponent.opponent_id!r} was not added"
                    )
                stored.rating = opponent.rating or self.cfg.league.initial_rating
            await self.r.hset(self.k("league"), opponent.opponent_id, _blob(stored))
            self._view = None  # the next NextTasks sees it
            return stored, existing is None

    # ------------------------------------------------------------------ scheduling
    async def next_tasks(self, count: int, split: str) -> list[pb.Task]:
        if not 0 < count <= MAX_TASKS_PER_CALL:
            raise InvalidRequest(f"count must be from 1 to {MAX_TASKS_PER_CALL}, not {count}")
        split = split or "train"
        if split not in ("train", "eval"):
            raise InvalidRequest(f"split must be 'train' or 'eval', not {split[:64]!r}")
        call = await self.r.hincrby(self.k("counters"), "calls", 1)
        rng = random.Random(f"{self.cfg.seed}:{call}")
        view = await self._league_view()
        out: list[pb.Task] = []
        n = self.cfg.group_size
        scheduled: dict[str, int] = {}
        weights: dict[str, dict[str, float]] = {}  # read once per bucket and call, not once per group
        while len(out) < count:
            bucket = scheduler.pick_bucket(self.cfg, rng)
            seed = await self._seed(bucket.key, split, rng, weights)
            bindings, trainees, kind, opp_id = scheduler.seat_plan(
                bucket, bucket.num_seats, self.cfg, view, rng
            )
            out.extend(scheduler.make_group(bucket, seed, split, bindings, trainees, kind, opp_id, n))
            scheduled[bucket.key] = scheduled.get(bucket.key, 0) + n
        for key, tasks in scheduled.items():
            await self.r.hincrby(self.k("stats", key), "scheduled", tasks)
        return out

    async def _league_view(self) -> scheduler.LeagueView:
        """The league as NextTasks samples it, read at most once per ``LEAGUE_VIEW_TTL_S`` (and after a
        registration here): decoding a full league per call made NextTasks' cost follow the league's
        size. Ratings may lag by that second; PFSP does not need them fresher."""
        now = time.monotonic()
        if self._view is None or now - self._view_at > LEAGUE_VIEW_TTL_S:
            trainee, opponents = await self.league()
            self._view, self._view_at = scheduler.LeagueView(trainee, opponents), now
        return self._view

    async def _seed(
        self, bucket: str, split: str, rng: random.Random, cache: dict[str, dict[str, float]]
    ) -> int:
        if split == "eval":  # held-out seeds, never replayed or reweighted
            return self.cfg.eval_seed_offset + int(await self.r.incr(self.k("evalseed", bucket))) - 1
        if rng.random() < self.cfg.replay_ratio:
            if bucket not in cache:
                cache[bucket] = await self.weights(bucket)
            key = scheduler.pick_replay(cache[bucket], rng)
            if key is not None:
                return scheduler.seed_of(key)
        return int(await self.r.incr(self.k("seed", bucket))) - 1

    async def weights(self, bucket: str) -> dict[str, float]:
        raw = await self.r.hgetall(self.k("weights", bucket))
        return {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in raw.items()}

    async def _weights_of(self, keys: set[str]) -> dict[str, float]:
        """The stored weights of just these task keys (HMGET per bucket, not the whole hash)."""
        by_bucket: dict[str, list[str]] = {}
        for key in sorted(keys):
            by_bucket.setdefault(key.rpartition("#")[0], []).append(key)
        out: dict[str, float] = {}
        for bucket, names in by_bucket.items():
            for name, value in zip(names, await self.r.hmget(self.k("weights", bucket), names), strict=True):
                if value is not None:
                    out[name] = float(value)
        return out

    async def failures(self) -> list[aiw.Failure]:
        raw = await self.r.lrange(self.k("failures"), 0, -1)
        return [aiw.Failure(**json.loads(x)) for x in raw]

    # ------------------------------------------------------------------ outcomes
    def check_outcome(self, o: pb.TaskOutcome) -> None:
        """Raise ``InvalidOutcome`` (``UnknownBucket`` for a bucket not in the config) unless ``o`` can be
        recorded (see the module docstring)."""
        if not o.trajectory_id:
            raise InvalidOutcome("TaskOutcome.trajectory_id is required (outcomes are recorded once per id)")
        for name in ("trajectory_id", "task_id", "opponent_id"):
            if len(getattr(o, name)) > MAX_ID_CHARS:
                raise InvalidOutcome(f"TaskOutcome.{name} is longer than {MAX_ID_CHARS} characters")
        if not (math.isfinite(o.score) and 0.0 <= o.score <= 1.0):
            raise InvalidOutcome(f"TaskOutcome.score must be a finite number from 0 to 1, not {o.score}")
        if not math.isfinite(o.mean_reward):
            raise InvalidOutcome(f"TaskOutcome.mean_reward must be finite, not {o.mean_reward}")
        if o.opponent_kind not in pb.OpponentKind.values():
            raise InvalidOutcome(f"TaskOutcome.opponent_kind {int(o.opponent_kind)} is not an OpponentKind")
        if o.bucket not in self._buckets:
            raise UnknownBucket(
                f"TaskOutcome.bucket {o.bucket[:MAX_ID_CHARS]!r} is not a bucket of this curriculum; "
                f"buckets: {sorted(self._buckets)[:20]}"
            )

    async def record(self, outcomes: Sequence[pb.TaskOutcome], *, from_stream: bool = False) -> int:
        """Apply each outcome once (by trajectory id); returns how many were new. Every outcome is checked
        first: one invalid outcome refuses the whole call and nothing of it is applied."""
        if len(outcomes) > MAX_OUTCOMES_PER_CALL:
            raise InvalidRequest(f"at most {MAX_OUTCOMES_PER_CALL} outcomes per call, not {len(outcomes)}")
        for i, o in enumerate(outcomes):
            try:
                self.check_outcome(o)
            except InvalidOutcome as exc:
                raise type(exc)(f"outcomes[{i}]: {exc}") from None
        recorded = 0
        for o in outcomes:  # the lock per outcome: a long call does not hold the stream consumer back
            async with self.lock:
                ops = await self._ops(o, from_stream)
                recorded += int(
                    await self._apply(
                        keys=[self.k("recorded"), self.k("counters")],
                        args=[o.trajectory_id, json.dumps(ops), self.cfg.recorded_window],
                    )
                )
        async with self.lock:
            for bucket in sorted({o.bucket for o in outcomes}):
                await self._prune_weights(bucket)
        return recorded

    async def _prune_weights(self, bucket: str) -> None:
        """Past ``aiw.max_tasks`` weighted tasks, drop the lowest weights down to 90 % of the bound (one
        pass per 10 % of growth, not one per outcome)."""
        key, bound = self.k("weights", bucket), self.cfg.aiw.max_tasks
        if await self.r.hlen(key) <= bound:
            return
        weights = await self.weights(bucket)
        keep = max(1, bound * 9 // 10)
        drop = sorted(weights, key=lambda t: (weights[t], t))[: len(weights) - keep]
        for start in range(0, len(drop), 1000):
            await self.r.hdel(key, *drop[start : start + 1000])

    async def count_ignored(self, n: int) -> None:
        """Count stream outcomes of buckets this curriculum does not schedule (acked, not applied)."""
        await self.r.hincrby(self.k("counters"), "ignored_outcomes", n)

    async def _ops(self, o: pb.TaskOutcome, from_stream: bool) -> list[list[Any]]:
        ops: list[list[Any]] = [["HINCRBY", self.k("counters"), "outcomes", 1]]
        if from_stream:
            ops.append(["HINCRBY", self.k("counters"), "stream_outcomes", 1])
        bucket = o.bucket
        stats = self.k("stats", bucket)
        ops.append(["HINCRBY", stats, "finished", 1])
        if o.aborted:
            return ops
        success = o.success
        ops.append(["RPUSH", self.k("recent", bucket), "1" if success else "0"])
        ops.append(["LTRIM", self.k("recent", bucket), -self.cfg.recent_window, -1])
        if not success:
            ops.append(["HINCRBY", stats, "failures", 1])
        # AIW (train tasks only: eval seeds are held out)
        seed = _seed_from_task_id(o.task_id)
        if seed is not None and not _is_eval(o.task_id, self.cfg):
            key = scheduler.task_key(bucket, seed)
            history = await self.failures()
            weights = await self._weights_of({key, *(f.task_key for f in history)})
            update = aiw.on_outcome(key, success, o.fingerprint, weights, history, self.cfg.aiw)
            for task, weight in update.weights.items():
                ops.append(["HSET", self.k("weights", task.rpartition("#")[0]), task, repr(weight)])
            if update.failure is not None:
                entry = json.dumps(
                    {"task_key": update.failure.task_key, "fingerprint": update.failure.fingerprint}
                )
                ops.append(["RPUSH", self.k("failures"), entry])
                ops.append(["LTRIM", self.k("failures"), -self.cfg.aiw.max_history, -1])
        # league ratings: only against a single rated opponent (not self-play, not a per-seat mix)
        if o.opponent_id and not o.opponent_id.startswith(("self:", "mix:")):
            await self._rating_ops(o, ops)
        return ops

    async def _rating_ops(self, o: pb.TaskOutcome, ops: list[list[Any]]) -> None:
        blob = await self.r.hget(self.k("league"), o.opponent_id)
        if blob is not None:
            proto = _opponent(blob)
        elif await self.r.hlen(self.k("league")) >= self.cfg.league.max_opponents:
            return  # a full league admits no new opponent from an outcome: the game stays unrated
        else:  # first game against it: it joins the league
            proto = pb.Opponent(
                opponent_id=o.opponent_id, kind=o.opponent_kind, rating=self.cfg.league.initial_rating
            )
            if o.opponent_kind == pb.OPPONENT_KIND_SCRIPTED:
                proto.bot = o.opponent_id.partition(":")[2]
        t, e = rate(await self.trainee(), _entry(proto), o.score, self.cfg.league)
        proto.rating, proto.games, proto.wins, proto.losses, proto.draws = (
            e.rating, e.games, e.wins, e.losses, e.draws,
        )  # fmt: skip
        ops.append(["HSET", self.k("league"), o.opponent_id, _blob(proto)])
        ops.append(
            ["HSET", self.k("trainee"), "rating", repr(t.rating), "games", t.games, "wins", t.wins,
             "losses", t.losses, "draws", t.draws]
        )  # fmt: skip

    # ------------------------------------------------------------------ stats
    async def stats(self) -> pb.GetStatsResponse:
        resp = pb.GetStatsResponse()
        counters = {k.decode(): int(v) for k, v in (await self.r.hgetall(self.k("counters"))).items()}
        resp.outcomes = counters.get("outcomes", 0)
        resp.stream_outcomes = counters.get("stream_outcomes", 0)
        resp.failure_history = int(await self.r.llen(self.k("failures")))
        for b in self.cfg.buckets:
            s = {k.decode(): int(v) for k, v in (await self.r.hgetall(self.k("stats", b.key))).items()}
            recent = [int(x) for x in await self.r.lrange(self.k("recent", b.key), 0, -1)]
            weights = await self.weights(b.key)
            resp.buckets.add(
                bucket=b.key, weight=b.weight, scheduled=s.get("scheduled", 0), finished=s.get("finished", 0),
                success_rate=sum(recent) / len(recent) if recent else 0.0, failures=s.get("failures", 0),
                mean_task_weight=sum(weights.values()) / len(weights) if weights else aiw.INITIAL_WEIGHT,
                tasks=len(weights),
            )  # fmt: skip
        return resp


def _blob(opponent: pb.Opponent) -> str:
    """An ``Opponent`` as stored: base64 of its bytes (the outcome script's JSON cannot carry raw bytes)."""
    return base64.b64encode(opponent.SerializeToString()).decode()


def _opponent(blob: bytes | str) -> pb.Opponent:
    return pb.Opponent.FromString(base64.b64decode(blob))


def _entry(o: pb.Opponent) -> Entry:
    return Entry(o.opponent_id, o.rating, o.games, o.wins, o.losses, o.draws)


def _identity(o: pb.Opponent) -> tuple[int, str, int, str]:
    return int(o.kind), o.policy.policy_id, o.policy.version, o.bot


def _describe(o: pb.Opponent) -> str:
    kind = pb.OpponentKind.Name(o.kind) if o.kind in pb.OpponentKind.values() else str(int(o.kind))
    what = f"policy {o.policy.policy_id}@{o.policy.version}" if o.policy.policy_id else f"bot {o.bot!r}"
    return f"{kind.removeprefix('OPPONENT_KIND_').lower()} {what}"


_NEEDS_POLICY = (pb.OPPONENT_KIND_CHECKPOINT, pb.OPPONENT_KIND_EXTERNAL)


def _check_opponent(o: pb.Opponent) -> None:
    """What a registration must be: an id (printable, at most ``MAX_ID_CHARS``), a known kind with what it
    needs (a policy id for checkpoint and external opponents, a bot for scripted ones), a finite rating."""
    if not o.opponent_id:
        raise InvalidRequest("opponent.opponent_id is required")
    if len(o.opponent_id) > MAX_ID_CHARS or not o.opponent_id.isprintable():
        raise InvalidRequest(f"opponent.opponent_id must be printable and at most {MAX_ID_CHARS} characters")
    if o.kind not in (pb.OPPONENT_KIND_SCRIPTED, *_NEEDS_POLICY):
        raise InvalidRequest(
            "opponent.kind must be OPPONENT_KIND_CHECKPOINT, OPPONENT_KIND_EXTERNAL or OPPONENT_KIND_SCRIPTED"
        )
    if o.kind in _NEEDS_POLICY and not o.policy.policy_id:
        raise InvalidRequest("opponent.policy.policy_id is required for checkpoint and external opponents")
    if o.kind == pb.OPPONENT_KIND_SCRIPTED and not o.bot:
        raise InvalidRequest("opponent.bot is required for scripted opponents")
    if len(o.policy.policy_id) > MAX_ID_CHARS or len(o.bot) > MAX_ID_CHARS:
        raise InvalidRequest(
            f"opponent.policy.policy_id and opponent.bot are at most {MAX_ID_CHARS} characters"
        )
    if not math.isfinite(o.rating):
        raise InvalidRequest(f"opponent.rating must be finite, not {o.rating}")


MAX_SEED = 2**63 - 1
"""Largest seed an outcome may reweight: a replayed seed becomes ``Task.seed`` (uint64) and a CreateEpisode
seed; an outcome naming ``#99999999999999999999999`` used to make every later replay of it fail."""


def _seed_from_task_id(task_id: str) -> int | None:
    """The seed in a scheduler task id ``<bucket>#<seed>/<group>``; None for other ids (ASCII digits only:
    ``'²'.isdigit()`` is true but ``int('²')`` fails) and for seeds past ``MAX_SEED``."""
    if "#" not in task_id:
        return None
    tail = task_id.rpartition("#")[2].split("/")[0]
    if not (tail.isascii() and tail.isdigit()):
        return None
    seed = int(tail)
    return seed if seed <= MAX_SEED else None


def _is_eval(task_id: str, cfg: CurriculumConfig) -> bool:
    seed = _seed_from_task_id(task_id)
    return seed is not None and seed >= cfg.eval_seed_offset
