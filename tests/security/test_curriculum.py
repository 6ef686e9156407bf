"""Regression tests over the real wire (real Redis, real gRPC) for issue 20's curriculum items.

- The stream consumer survives poison entries (dead-lettered with the reason, logged, the rest counted)
  and a Redis that is SIGKILLed and restarted while outcomes flow (every outcome counted once, the service
  NOT_SERVING while it cannot make progress and SERVING again after).
- Shared state needs the service credential: ReportOutcomes and RegisterOpponent; scores and ratings
  must be finite; an existing opponent's policy is never overwritten.
- Bounded sizes: NextTasks(count), outcomes per call, group_size, the league, bucket names (known
  buckets only), the games and variants of a config (checked at start), the ``seen`` set.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from wolfpack import rpc
from wolfpack.redis_server import EmbeddedRedis
from wolfpack.settings import load_settings
from wolfpack.stream import ProtoStreamConsumer, ProtoStreamProducer, RetryPolicy, dead_letter_key
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack.v1 import curriculum_service_pb2 as pb
from wolfpack.v1 import curriculum_service_pb2_grpc as pb_grpc
from wolfpack_curriculum import consumer as consumer_module
from wolfpack_curriculum.config import CurriculumConfig
from wolfpack_curriculum.consumer import consume
from wolfpack_curriculum.server import CurriculumServicer, register
from wolfpack_curriculum.store import CurriculumStore

from .conftest import SECRET

Trajectory = trajectory_pb2.Trajectory
BUCKET = "werewolf_v1/6p"


def config(**overrides: object) -> CurriculumConfig:
    return CurriculumConfig.model_validate(
        {
            "key_prefix": f"test:sec:cur:{uuid.uuid4().hex}", "group_size": 2, "replay_ratio": 0.0,
            "buckets": [{"game_id": "werewolf_v1", "variant": "6p", "seats": {"trainee_seats": [3]}}],
            **overrides,
        }
    )  # fmt: skip


def scored(seed: int, *, trajectory_id: str | None = None, won: bool = True) -> Trajectory:
    traj = Trajectory(
        trajectory_id=uuid.uuid4().hex if trajectory_id is None else trajectory_id,
        task_id=f"{BUCKET}#{seed}/g",
        seed=seed,
    )
    traj.metadata.update({"bucket": BUCKET, "opponent_id": "self:learner"})
    traj.trainee_seats.append(0)
    kind = common_pb2.OUTCOME_KIND_WIN if won else common_pb2.OUTCOME_KIND_LOSS
    traj.outcomes.add(seat=0, outcome=kind, final_reward=1.0 if won else -1.0)
    return traj


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(redis_url)
    yield c
    await c.aclose()


async def until(what: str, check: object, timeout_s: float = 60.0) -> None:
    """Poll the async ``check`` until it is true (bounded: the bound only catches a hang)."""
    deadline = time.monotonic() + timeout_s
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


# --------------------------------------------------------------------------- the stream consumer


async def test_a_poison_entry_is_dead_lettered_and_counting_goes_on(
    client: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """One entry with an empty trajectory id used to end the consumer task for good (nothing logged, the
    group no longer acked, the backlog grew until backpressure stalled rollout)."""
    cfg = config()
    store = CurriculumStore(client, cfg)
    stream = f"test:sec:cur:stream:{uuid.uuid4().hex}"
    # The producer needs an id per message; the trajectory inside has none (what a buggy writer sends).
    producer: ProtoStreamProducer[Trajectory] = ProtoStreamProducer(
        client, stream, id_of=lambda t: t.trajectory_id or uuid.uuid4().hex
    )
    nan = scored(3)
    nan.outcomes[0].final_reward = math.nan
    await producer.append_many([scored(1), scored(2, trajectory_id=""), nan, scored(4)])
    consumer = ProtoStreamConsumer(client, stream, cfg.stream_group, "c1", Trajectory, block_ms=20)
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING):
        reader = asyncio.create_task(consume(store, consumer, stop))

        async def two_counted() -> bool:
            assert not reader.done(), f"the consumer ended: {reader.exception()!r}"
            return (await store.stats()).stream_outcomes >= 2

        await until("the two good outcomes", two_counted)
        await producer.append_many([scored(5)])  # and it keeps going
        await until("the outcome after the poison", lambda: _stream_outcomes_at_least(store, 3))
        stop.set()
        await asyncio.wait_for(reader, 30)
    assert await consumer.pending_count() == 0, "every entry acked (or dead-lettered)"
    dead = await client.xrange(dead_letter_key(stream))
    reasons = sorted(fields[b"reason"].decode() for _, fields in dead)
    assert len(reasons) == 2, reasons
    assert any("trajectory_id" in r for r in reasons) and any("finite" in r for r in reasons), reasons
    assert any("dead-letter" in r.message for r in caplog.records), "a log line says what was dropped"
    stats = await store.stats()
    assert stats.outcomes == stats.stream_outcomes == 3


async def _stream_outcomes_at_least(store: CurriculumStore, n: int) -> bool:
    return (await store.stats()).stream_outcomes >= n


async def test_redis_sigkilled_under_flowing_outcomes_every_one_is_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis restart while outcomes flowed used to stop counting for good (1,987 of 8,720)."""
    server = EmbeddedRedis(tmp_path / "redis", appendfsync="always").start()
    client = aioredis.Redis.from_url(server.url, socket_timeout=5)
    try:
        cfg = config()
        store = CurriculumStore(client, cfg)
        stream = f"test:sec:cur:restart:{uuid.uuid4().hex}"
        producer: ProtoStreamProducer[Trajectory] = ProtoStreamProducer(
            client, stream, id_of=lambda t: t.trajectory_id, retry=RetryPolicy(timeout_s=60)
        )
        # A short retry window: the stream's own retries give up while Redis is down, so the loop's
        # recovery (not only the library's) is what keeps counting.
        consumer = ProtoStreamConsumer(
            client, stream, cfg.stream_group, "c1", Trajectory, block_ms=20, claim_idle_ms=300,
            retry=RetryPolicy(timeout_s=0.3),
        )  # fmt: skip
        health = consumer_module.ConsumerHealth(stall_after_s=0.5)
        total = 600
        trajs = [scored(i) for i in range(total)]

        async def produce() -> None:
            for start in range(0, total, 5):
                await producer.append_many(trajs[start : start + 5])
                await asyncio.sleep(0.005)

        stop = asyncio.Event()
        with caplog.at_level(logging.WARNING):
            reader = asyncio.create_task(consume(store, consumer, stop, health))
            producing = asyncio.create_task(produce())
            await until("outcomes flowing", lambda: _stream_outcomes_at_least(store, 100))
            assert not producing.done(), "still producing when Redis dies"
            server.kill()
            for _ in range(300):  # bounded (3 s): the consumer notices it cannot make progress
                if health.stalled():
                    break
                await asyncio.sleep(0.01)
            assert health.stalled(), "no progress while Redis is down is reported"
            await asyncio.sleep(1.0)
            server.start()
            await asyncio.wait_for(producing, 120)

            async def all_counted() -> bool:
                assert not reader.done(), f"the consumer ended: {reader.exception()!r}"
                return (await store.stats()).stream_outcomes >= total

            await until("every outcome counted", all_counted, 120)
            await until("healthy again", lambda: _healthy(health), 30)
            stop.set()
            await asyncio.wait_for(reader, 30)
        stats = await store.stats()
        assert stats.outcomes == stats.stream_outcomes == total, "each counted exactly once"
        assert stats.buckets[0].finished == total
        assert await consumer.pending_count() == 0
        assert any(r.name == consumer_module.__name__ for r in caplog.records), "the outage is logged"
    finally:
        await client.aclose()
        server.stop()


async def _healthy(health: consumer_module.ConsumerHealth) -> bool:
    return not health.stalled()


async def test_health_is_not_serving_while_the_consumer_cannot_progress(tmp_path: Path) -> None:
    """The service's gRPC health follows its stream consumer: NOT_SERVING while Redis is away (NextTasks
    fails then too), SERVING once outcomes flow again."""
    from wolfpack_curriculum.server import start

    server = EmbeddedRedis(tmp_path / "redis", appendfsync="always").start()
    settings = load_settings(
        redis_url=server.url, stream_trajectories=f"test:sec:cur:health:{uuid.uuid4().hex}",
        stream_retry_timeout_s=0.3,
    )  # fmt: skip
    running = await start(settings, "127.0.0.1:0", config(), stall_after_s=0.5)
    target = f"127.0.0.1:{running.server.port}"
    try:
        assert await rpc.check_health(target) == "SERVING"
        server.kill()
        await until("NOT_SERVING", lambda: _status_is(target, "NOT_SERVING"), 30)
        server.start()
        await until("SERVING again", lambda: _status_is(target, "SERVING"), 30)
        assert not running.reader.done()
    finally:
        await running.stop(0)
        server.stop()


async def _status_is(target: str, status: str) -> bool:
    return await rpc.check_health(target, timeout_s=1.0) == status


# --------------------------------------------------------------------------- credentials and validation


@pytest.fixture
async def served(client: aioredis.Redis) -> AsyncIterator[tuple[str, CurriculumStore]]:
    """A curriculum server that requires the service credential (loopback, secret set)."""
    store = CurriculumStore(client, config())
    settings = load_settings(admin_secret=SECRET)
    running = await rpc.start_server(
        "curriculum", lambda s: register(s, CurriculumServicer(store)), settings, "127.0.0.1:0"
    )
    yield f"127.0.0.1:{running.port}", store
    await running.stop(0)


def stub_for(target: str, secret: str = "") -> tuple[grpc.aio.Channel, pb_grpc.CurriculumServiceStub]:
    channel = rpc.channel(target, load_settings(admin_secret=secret))
    return channel, pb_grpc.CurriculumServiceStub(channel)


async def code_of(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code(), err.value.details() or ""


def outcome(score: float = 1.0, **kw: object) -> pb.TaskOutcome:
    fields: dict[str, object] = {
        "task_id": f"{BUCKET}#0/g", "bucket": BUCKET, "trajectory_id": uuid.uuid4().hex, "success": score == 1.0,
        "score": score, "opponent_id": "scripted:heuristic", "opponent_kind": pb.OPPONENT_KIND_SCRIPTED,
        "fingerprint": "you are the seer",
    }  # fmt: skip
    fields.update(kw)
    return pb.TaskOutcome(**fields)  # type: ignore[arg-type]


def checkpoint(opponent_id: str, policy: str, version: int) -> pb.Opponent:
    o = pb.Opponent(opponent_id=opponent_id, kind=pb.OPPONENT_KIND_CHECKPOINT)
    o.policy.policy_id, o.policy.version = policy, version
    return o


async def test_outcomes_and_registrations_need_the_credential(
    served: tuple[str, CurriculumStore],
) -> None:
    target, store = served
    ch, anon = stub_for(target)
    ch2, wrong = stub_for(target, "not-the-secret")
    ch3, admin = stub_for(target, SECRET)
    async with ch, ch2, ch3:
        report = pb.ReportOutcomesRequest(outcomes=[outcome()])
        reg = pb.RegisterOpponentRequest(opponent=checkpoint("checkpoint:x@1", "x", 1))
        assert (await code_of(anon.ReportOutcomes(report)))[0] == grpc.StatusCode.UNAUTHENTICATED
        assert (await code_of(wrong.ReportOutcomes(report)))[0] == grpc.StatusCode.PERMISSION_DENIED
        assert (await code_of(anon.RegisterOpponent(reg)))[0] == grpc.StatusCode.UNAUTHENTICATED
        assert (await code_of(wrong.RegisterOpponent(reg)))[0] == grpc.StatusCode.PERMISSION_DENIED
        assert (await store.stats()).outcomes == 0 and (await store.league())[1] == [], "nothing applied"
        # reads stay open; the writes go through with the credential
        assert len((await anon.NextTasks(pb.NextTasksRequest(count=1))).tasks) == 2
        await anon.GetStats(pb.GetStatsRequest())
        await anon.ListOpponents(pb.ListOpponentsRequest())
        assert (await admin.ReportOutcomes(report)).recorded == 1
        assert (await admin.RegisterOpponent(reg)).created


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"score": math.nan}, "score"),
        ({"score": math.inf}, "score"),
        ({"score": -1.0}, "score"),
        ({"score": 2.0}, "score"),
        ({"mean_reward": math.nan}, "mean_reward"),
        ({"mean_reward": -math.inf}, "mean_reward"),
        ({"trajectory_id": ""}, "trajectory_id"),
        ({"trajectory_id": "t" * 300}, "trajectory_id"),
        ({"opponent_id": "o" * 300}, "opponent_id"),
        ({"bucket": "invented/bucket"}, "bucket"),
        ({"bucket": ""}, "bucket"),
        ({"opponent_kind": 77}, "opponent_kind"),
    ],
)
async def test_bad_outcomes_are_invalid_argument_and_change_nothing(
    served: tuple[str, CurriculumStore], fields: dict[str, object], named: str
) -> None:
    """``score=NaN`` used to make the trainee's and that opponent's Elo NaN for good."""
    target, store = served
    keys_before = set(await store.r.keys(f"{store.p}:*"))
    ch, admin = stub_for(target, SECRET)
    async with ch:
        good = outcome()
        code, details = await code_of(
            admin.ReportOutcomes(pb.ReportOutcomesRequest(outcomes=[good, outcome(**fields)]))
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT and named in details, details
        assert "outcomes[1]" in details
        stats = await store.stats()
        assert stats.outcomes == 0, "the good outcome beside it was not applied either (whole call refused)"
        assert set(await store.r.keys(f"{store.p}:*")) == keys_before, "no key added"
        assert (await admin.ReportOutcomes(pb.ReportOutcomesRequest(outcomes=[good]))).recorded == 1
        table = await admin.ListOpponents(pb.ListOpponentsRequest())
        assert math.isfinite(table.trainee_rating) and all(math.isfinite(o.rating) for o in table.opponents)


async def test_too_many_outcomes_in_one_call_are_refused(served: tuple[str, CurriculumStore]) -> None:
    from wolfpack_curriculum.store import MAX_OUTCOMES_PER_CALL

    target, store = served
    ch, admin = stub_for(target, SECRET)
    async with ch:
        many = pb.ReportOutcomesRequest(outcomes=[outcome() for _ in range(MAX_OUTCOMES_PER_CALL + 1)])
        code, details = await code_of(admin.ReportOutcomes(many))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and str(MAX_OUTCOMES_PER_CALL) in details
    assert (await store.stats()).outcomes == 0


async def test_an_existing_opponents_policy_is_never_overwritten(served: tuple[str, CurriculumStore]) -> None:
    target, store = served
    ch, admin = stub_for(target, SECRET)
    async with ch:
        first = await admin.RegisterOpponent(
            pb.RegisterOpponentRequest(opponent=checkpoint("checkpoint:learner@3", "learner", 3))
        )
        assert first.created
        await store.record(
            [outcome(0.0, opponent_id="checkpoint:learner@3", opponent_kind=pb.OPPONENT_KIND_CHECKPOINT)]
        )
        rated = (await admin.ListOpponents(pb.ListOpponentsRequest())).opponents[0]
        assert rated.games == 1
        # the same registration again: accepted, nothing changes (idempotent)
        again = await admin.RegisterOpponent(
            pb.RegisterOpponentRequest(opponent=checkpoint("checkpoint:learner@3", "learner", 3))
        )
        assert not again.created and again.opponent == rated
        # another policy under the same id: refused, the stored one untouched
        code, details = await code_of(
            admin.RegisterOpponent(
                pb.RegisterOpponentRequest(opponent=checkpoint("checkpoint:learner@3", "evil", 9))
            )
        )
        assert code == grpc.StatusCode.ALREADY_EXISTS and "learner@3" in details, details
        assert (await admin.ListOpponents(pb.ListOpponentsRequest())).opponents[0] == rated
        # a client cannot set a record or a non-finite rating
        forged = checkpoint("checkpoint:learner@4", "learner", 4)
        forged.games, forged.wins = 10**12, 10**12
        stored = (await admin.RegisterOpponent(pb.RegisterOpponentRequest(opponent=forged))).opponent
        assert (stored.games, stored.wins) == (0, 0)
        for bad, named in [
            (checkpoint("checkpoint:nan", "learner", 5), "rating"),
            (pb.Opponent(opponent_id="x", kind=pb.OPPONENT_KIND_CHECKPOINT), "policy_id"),
            (pb.Opponent(opponent_id="x", kind=pb.OPPONENT_KIND_SCRIPTED), "bot"),
            (pb.Opponent(opponent_id="x", bot="heuristic"), "kind"),
            (pb.Opponent(opponent_id="x" * 300, kind=pb.OPPONENT_KIND_SCRIPTED, bot="b"), "opponent_id"),
            (pb.Opponent(opponent_id="a\nb", kind=pb.OPPONENT_KIND_SCRIPTED, bot="b"), "opponent_id"),
        ]:
            if named == "rating":
                bad.rating = math.nan
            code, details = await code_of(admin.RegisterOpponent(pb.RegisterOpponentRequest(opponent=bad)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and named in details, (named, details)


# --------------------------------------------------------------------------- bounds


async def test_next_tasks_count_is_bounded(served: tuple[str, CurriculumStore]) -> None:
    """``count=2^31-1`` used to grow the service ~190 MB per 25 s until the deadline."""
    from wolfpack_curriculum.store import MAX_TASKS_PER_CALL

    target, _ = served
    ch, anon = stub_for(target)
    async with ch:
        for count in (2**31 - 1, MAX_TASKS_PER_CALL + 1, 0, -5):
            code, details = await code_of(anon.NextTasks(pb.NextTasksRequest(count=count), timeout=10))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "count" in details
        code, details = await code_of(anon.NextTasks(pb.NextTasksRequest(count=1, split="x" * 10_000)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and len(details) < 200
        tasks = (await anon.NextTasks(pb.NextTasksRequest(count=MAX_TASKS_PER_CALL), timeout=60)).tasks
        assert MAX_TASKS_PER_CALL <= len(tasks) < MAX_TASKS_PER_CALL + 2


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"group_size": 2_000_000}, "group_size"),
        ({"buckets": [{"game_id": "nonexistent_v1"}]}, "nonexistent_v1"),
        ({"buckets": [{"game_id": "werewolf_v1", "variant": "99p"}]}, "99p"),
        (
            {"buckets": [{"game_id": "werewolf_v1", "variant": "6p", "seats": {"trainee_seats": [6]}}]},
            "trainee_seats",
        ),
        (
            {"buckets": [{"game_id": "werewolf_v1", "variant": "6p", "seats": {"trainee_seats": 7}}]},
            "trainee_seats",
        ),
        ({"buckets": [{"game_id": "werewolf_v1", "name": "a#b"}]}, "#"),
        ({"league": {"max_opponents": 0}}, "max_opponents"),
        ({"recorded_window": 0}, "recorded_window"),
    ],
)
def test_a_config_that_would_fail_later_is_refused_at_start(overrides: dict[str, object], named: str) -> None:
    """An unknown game or variant used to be accepted at start and fail every NextTasks later;
    ``group_size: 2000000`` blocked the service 32 s and grew it to 3 GB."""
    with pytest.raises(ValidationError, match=named.replace("#", "'#'") if named == "#" else named):
        config(**overrides)


async def test_the_league_is_bounded(client: aioredis.Redis) -> None:
    """20k league entries made NextTasks 200x slower: the league holds at most ``max_opponents``, new ids
    past it are refused (RegisterOpponent) or left unrated (outcomes)."""
    from wolfpack_curriculum.store import LeagueFull

    store = CurriculumStore(client, config(league={"max_opponents": 3}))
    for i in range(3):
        _, created = await store.register(checkpoint(f"checkpoint:p@{i}", "p", i))
        assert created
    with pytest.raises(LeagueFull, match="max_opponents"):
        await store.register(checkpoint("checkpoint:p@9", "p", 9))
    assert not (await store.register(checkpoint("checkpoint:p@0", "p", 0)))[1], "existing ids still confirm"
    assert await store.record([outcome(opponent_id="scripted:invented")]) == 1, "the outcome still counts"
    _, opponents = await store.league()
    assert [e.opponent_id for e, _ in opponents] == ["checkpoint:p@0", "checkpoint:p@1", "checkpoint:p@2"]


async def test_the_recorded_set_is_trimmed_and_recent_duplicates_still_stopped(
    client: aioredis.Redis,
) -> None:
    """The ``seen`` set grew by one id per outcome forever."""
    store = CurriculumStore(client, config(recorded_window=10))
    outcomes = [outcome() for _ in range(25)]
    for o in outcomes:
        assert await store.record([o]) == 1
    assert await client.zcard(store.k("recorded")) == 10
    assert await store.record(outcomes[-10:]) == 0, "the newest ids are still remembered"
    assert not await client.exists(store.k("seen")), "the old unbounded set is not written"


async def test_a_stream_outcome_of_another_bucket_is_acked_and_counted_without_new_keys(
    client: aioredis.Redis,
) -> None:
    """Invented bucket names used to add Redis keys without bound."""
    cfg = config()
    store = CurriculumStore(client, cfg)
    stream = f"test:sec:cur:foreign:{uuid.uuid4().hex}"
    producer: ProtoStreamProducer[Trajectory] = ProtoStreamProducer(
        client, stream, id_of=lambda t: t.trajectory_id
    )
    foreign = [scored(i) for i in range(50)]
    for i, t in enumerate(foreign):
        t.metadata["bucket"] = f"invented-{i}"
    await producer.append_many([*foreign, scored(99)])
    consumer = ProtoStreamConsumer(client, stream, cfg.stream_group, "c1", Trajectory, block_ms=20)
    stop = asyncio.Event()
    reader = asyncio.create_task(consume(store, consumer, stop))
    await until("the outcome of our bucket", lambda: _stream_outcomes_at_least(store, 1))
    stop.set()
    await asyncio.wait_for(reader, 30)
    assert await consumer.pending_count() == 0
    counters = await client.hgetall(store.k("counters"))
    assert int(counters[b"ignored_outcomes"]) == 50
    keys = {k.decode() for k in await client.keys(f"{store.p}:*")}
    assert not [k for k in keys if "invented" in k], keys


async def test_worst_case_legal_next_tasks_beside_normal_traffic(client: aioredis.Redis) -> None:
    """A normal NextTasks' latency while the largest legal ones run (1,024 tasks of 12-seat groups, every
    seat drawn from a full league of 1,000 by PFSP), as a ratio to an idle run; generous, since the suite
    shares two cores. The league is read once per second, its PFSP pools built once per read: before, each
    seat passed over the whole league (15 s for such a call) and every call decoded it."""
    from wolfpack_curriculum.store import MAX_TASKS_PER_CALL

    cfg = config(
        group_size=1, replay_ratio=0.5, league={"max_opponents": 1000},
        buckets=[{"game_id": "werewolf_v1", "variant": "12p",
                  "seats": {"trainee_seats": 1, "mix": {"league": 1.0}, "mix_per": "seat"}}],
    )  # fmt: skip
    store = CurriculumStore(client, cfg)
    for i in range(cfg.league.max_opponents):
        await store.register(checkpoint(f"checkpoint:p@{i}", "p", i))
    running = await rpc.start_server(
        "curriculum", lambda s: register(s, CurriculumServicer(store)), load_settings(), "127.0.0.1:0"
    )
    ch, stub = stub_for(f"127.0.0.1:{running.port}")
    try:
        async with ch:

            async def latencies(n: int) -> list[float]:
                out = []
                for _ in range(n):
                    t = time.perf_counter()
                    await stub.NextTasks(pb.NextTasksRequest(count=1))
                    out.append(time.perf_counter() - t)
                return out

            await latencies(2)
            idle = sorted(await latencies(9))[4]
            heavy = pb.NextTasksRequest(count=MAX_TASKS_PER_CALL)
            # the deadline is the bound on the heavy calls themselves (before: 15 s each, alone)
            abusers = [asyncio.ensure_future(stub.NextTasks(heavy, timeout=30)) for _ in range(3)]
            await asyncio.sleep(0.2)  # the heavy calls are running
            busy = sorted(await latencies(9))[4]
            assert not all(a.done() for a in abusers), "measured while the heavy calls ran"
            done = await asyncio.gather(*abusers)
        assert all(len(d.tasks) == MAX_TASKS_PER_CALL for d in done)
        assert busy / idle < 40, (idle, busy)
    finally:
        await running.stop(0)


async def test_weighted_tasks_per_bucket_are_bounded_and_odd_seeds_reweight_nothing(
    client: aioredis.Redis,
) -> None:
    """One weight per distinct seed grew each bucket's hash without bound (every replay read all of it);
    a seed past uint64 (or a non-ASCII digit) in a task id used to make every later replay fail."""
    store = CurriculumStore(client, config(aiw={"max_tasks": 10}, replay_ratio=1.0))
    for seed in range(30):
        await store.record([outcome(0.0, task_id=f"{BUCKET}#{seed}/g", success=False)])
    weights = await store.weights(BUCKET)
    assert 9 <= len(weights) <= 10, weights
    assert all(w >= 2.0 for w in weights.values()), "failed tasks kept"
    for odd in ("99999999999999999999999", "²", "-3", "1e9"):
        assert await store.record([outcome(0.0, task_id=f"{BUCKET}#{odd}/g", success=False)]) == 1
    assert set(await store.weights(BUCKET)) <= set(weights) | {f"{BUCKET}#{s}" for s in range(30)}
    tasks = await store.next_tasks(8, "train")  # replays only valid seeds
    assert all(0 <= t.seed < 30 for t in tasks)
