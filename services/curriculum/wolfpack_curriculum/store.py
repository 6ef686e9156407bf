"""The curriculum's state in Redis, so a restart (or a second replica) loses nothing.

Keys (all under ``key_prefix``):

| key | type | what |
|---|---|---|
| ``seed:<bucket>`` / ``evalseed:<bucket>`` | counter | next fresh train / eval seed of a bucket |
| ``weights:<bucket>`` | hash | AIW weight by task key |
| ``failures`` | list | failure history (JSON ``{task_key, fingerprint}``), newest last, capped |
| ``stats:<bucket>`` | hash | ``scheduled``, ``finished``, ``failures`` |
| ``recent:<bucket>`` | list | last outcomes (``1``/``0``), capped at ``recent_window`` |
| ``league`` | hash | opponent id → ``Opponent`` proto (base64; rating, games, ...) |
| ``trainee`` | hash | the trainee's ``rating``, ``games``, ``wins``, ``losses``, ``draws`` |
| ``seen`` | set | trajectory ids already recorded (idempotency across RPC and stream) |
| ``counters`` | hash | ``outcomes``, ``stream_outcomes``, ``calls`` |

Why a Lua script for outcomes: an outcome's effects (weights, history, stats, ratings, the ``seen``
marker) are computed in Python from state read just before, then applied in one script that first adds
the trajectory id to ``seen`` and applies nothing when it was already there: a duplicate (the stream
redelivering, an RPC report of the same trajectory) changes nothing, and a crash leaves either all of
an outcome or none of it. One asyncio lock per process orders read-compute-apply.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from wolfpack.v1 import curriculum_service_pb2 as pb
from wolfpack_curriculum import aiw, scheduler
from wolfpack_curriculum.config import CurriculumConfig
from wolfpack_curriculum.league import Entry, rate
from wolfpack_games import get_game

_APPLY = """
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
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

    def k(self, *parts: str) -> str:
        return ":".join([self.p, *parts])

    # ------------------------------------------------------------------ league
    async def league(self) -> tuple[Entry, list[tuple[Entry, pb.Opponent]]]:
        raw = await self.r.hgetall(self.k("trainee"))
        t = {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in raw.items()}
        trainee = Entry(
            TRAINEE_ID, t.get("rating", self.cfg.league.initial_rating), int(t.get("games", 0)),
            int(t.get("wins", 0)), int(t.get("losses", 0)), int(t.get("draws", 0)),
        )  # fmt: skip
        out = []
        for blob in (await self.r.hgetall(self.k("league"))).values():
            o = _opponent(blob)
            out.append((Entry(o.opponent_id, o.rating, o.games, o.wins, o.losses, o.draws), o))
        out.sort(key=lambda eo: (-eo[0].rating, eo[0].opponent_id))
        return trainee, out

    async def register(self, opponent: pb.Opponent) -> tuple[pb.Opponent, bool]:
        if not opponent.opponent_id:
            raise ValueError("opponent.opponent_id is required")
        async with self.lock:
            existing = await self.r.hget(self.k("league"), opponent.opponent_id)
            stored = pb.Opponent()
            stored.CopyFrom(opponent)
            if existing is not None:
                old = _opponent(existing)
                stored.rating, stored.games = old.rating, old.games
                stored.wins, stored.losses, stored.draws = old.wins, old.losses, old.draws
            elif not stored.rating:
                stored.rating = self.cfg.league.initial_rating
            await self.r.hset(self.k("league"), opponent.opponent_id, _blob(stored))
            return stored, existing is None

    # ------------------------------------------------------------------ scheduling
    async def next_tasks(self, count: int, split: str) -> list[pb.Task]:
        if count <= 0:
            raise ValueError("count must be > 0")
        split = split or "train"
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
        call = await self.r.hincrby(self.k("counters"), "calls", 1)
        rng = random.Random(f"{self.cfg.seed}:{call}")
        trainee, opponents = await self.league()
        view = scheduler.LeagueView(trainee, opponents)
        out: list[pb.Task] = []
        n = self.cfg.group_size
        while len(out) < count:
            bucket = scheduler.pick_bucket(self.cfg, rng)
            seed = await self._seed(bucket.key, split, rng)
            num_seats = get_game(bucket.game_id).variants[
                bucket.variant or get_game(bucket.game_id).default_variant
            ]
            bindings, trainees, kind, opp_id = scheduler.seat_plan(bucket, num_seats, self.cfg, view, rng)
            out.extend(scheduler.make_group(bucket, seed, split, bindings, trainees, kind, opp_id, n))
            await self.r.hincrby(self.k("stats", bucket.key), "scheduled", n)
        return out

    async def _seed(self, bucket: str, split: str, rng: random.Random) -> int:
        if split == "eval":  # held-out seeds, never replayed or reweighted
            return self.cfg.eval_seed_offset + int(await self.r.incr(self.k("evalseed", bucket))) - 1
        if rng.random() < self.cfg.replay_ratio:
            weights = await self.weights(bucket)
            key = scheduler.pick_replay(weights, rng)
            if key is not None:
                return scheduler.seed_of(key)
        return int(await self.r.incr(self.k("seed", bucket))) - 1

    async def weights(self, bucket: str) -> dict[str, float]:
        raw = await self.r.hgetall(self.k("weights", bucket))
        return {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in raw.items()}

    async def failures(self) -> list[aiw.Failure]:
        raw = await self.r.lrange(self.k("failures"), 0, -1)
        return [aiw.Failure(**json.loads(x)) for x in raw]

    # ------------------------------------------------------------------ outcomes
    async def record(self, outcomes: Sequence[pb.TaskOutcome], *, from_stream: bool = False) -> int:
        """Apply each outcome once (by trajectory id); returns how many were new."""
        recorded = 0
        async with self.lock:
            for o in outcomes:
                if not o.trajectory_id:
                    raise ValueError(
                        "TaskOutcome.trajectory_id is required (outcomes are recorded once per id)"
                    )
                ops = await self._ops(o, from_stream)
                recorded += int(
                    await self._apply(keys=[self.k("seen")], args=[o.trajectory_id, json.dumps(ops)])
                )
        return recorded

    async def _ops(self, o: pb.TaskOutcome, from_stream: bool) -> list[list[Any]]:
        ops: list[list[Any]] = [["HINCRBY", self.k("counters"), "outcomes", 1]]
        if from_stream:
            ops.append(["HINCRBY", self.k("counters"), "stream_outcomes", 1])
        bucket = o.bucket or "unknown"
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
            update = aiw.on_outcome(
                key, success, o.fingerprint, await self.weights(bucket), await self.failures(), self.cfg.aiw
            )
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
        trainee, opponents = await self.league()
        found = next((eo for eo in opponents if eo[0].opponent_id == o.opponent_id), None)
        if found is None:  # first game against it: it joins the league
            proto = pb.Opponent(
                opponent_id=o.opponent_id, kind=o.opponent_kind, rating=self.cfg.league.initial_rating
            )
            if o.opponent_kind == pb.OPPONENT_KIND_SCRIPTED:
                proto.bot = o.opponent_id.partition(":")[2]
            found = (Entry(o.opponent_id, proto.rating), proto)
        t, e = rate(trainee, found[0], o.score, self.cfg.league)
        proto = pb.Opponent()
        proto.CopyFrom(found[1])
        proto.rating, proto.games, proto.wins, proto.losses, proto.draws = (
            e.rating,
            e.games,
            e.wins,
            e.losses,
            e.draws,
        )
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


def _seed_from_task_id(task_id: str) -> int | None:
    """The seed in a scheduler task id ``<bucket>#<seed>/<group>``; None for other ids."""
    if "#" not in task_id:
        return None
    tail = task_id.rpartition("#")[2].split("/")[0]
    return int(tail) if tail.isdigit() else None


def _is_eval(task_id: str, cfg: CurriculumConfig) -> bool:
    seed = _seed_from_task_id(task_id)
    return seed is not None and seed >= cfg.eval_seed_offset
