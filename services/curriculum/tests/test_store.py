"""``CurriculumStore`` on a real Redis: seed counters, whole groups, the first state of a fresh store,
what one outcome writes (weights, failure history, league), and eval outcomes moving nothing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from wolfpack.v1 import curriculum_service_pb2 as pb
from wolfpack_curriculum.aiw import Failure
from wolfpack_curriculum.config import CurriculumConfig
from wolfpack_curriculum.league import Entry
from wolfpack_curriculum.store import CurriculumStore

BUCKET = "werewolf_v1/6p"


def new_store(client: aioredis.Redis, **overrides: object) -> CurriculumStore:
    cfg = CurriculumConfig.model_validate(
        {
            "key_prefix": f"test:store:{uuid.uuid4().hex}", "group_size": 2, "replay_ratio": 0.0,
            "buckets": [{"game_id": "werewolf_v1", "variant": "6p", "seats": {"trainee_seats": [3]}}],
            **overrides,
        }
    )  # fmt: skip
    return CurriculumStore(client, cfg)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def store(client: aioredis.Redis) -> CurriculumStore:
    return new_store(client)


def outcome(
    seed: int, success: bool, fingerprint: str = "", opponent: str = "self:learner"
) -> pb.TaskOutcome:
    return pb.TaskOutcome(
        task_id=f"{BUCKET}#{seed}/g", bucket=BUCKET, trajectory_id=uuid.uuid4().hex, success=success,
        score=1.0 if success else 0.0, opponent_id=opponent, opponent_kind=pb.OPPONENT_KIND_SCRIPTED,
        fingerprint=fingerprint,
    )  # fmt: skip


async def test_a_fresh_store_reports_zeros_and_an_unrated_trainee(store: CurriculumStore) -> None:
    stats = await store.stats()
    assert (stats.outcomes, stats.stream_outcomes, stats.failure_history) == (0, 0, 0)
    [b] = stats.buckets
    assert (b.scheduled, b.finished, b.failures, b.tasks) == (0, 0, 0, 0)
    assert (b.success_rate, b.mean_task_weight) == (0.0, 1.0)
    trainee, opponents = await store.league()
    assert trainee == Entry("trainee", 1000.0, 0, 0, 0, 0) and opponents == []


async def test_whole_groups_and_seed_counters_from_zero_and_from_the_eval_offset(
    store: CurriculumStore,
) -> None:
    # group_size 2: 4 tasks are exactly two groups, 3 round up to two groups, 1 to one.
    assert [len(await store.next_tasks(n, "train")) for n in (4, 3, 1)] == [4, 4, 2]
    train = await store.next_tasks(2, "train")
    eval_ = await store.next_tasks(4, "eval")
    # fresh train seeds count 0, 1, 2, ... (5 groups so far: 0..4); eval seeds start at the offset
    assert train[0].seed == 5
    offset = store.cfg.eval_seed_offset
    assert [t.seed for t in eval_] == [offset, offset, offset + 1, offset + 1]
    assert (await store.stats()).buckets[0].scheduled == 4 + 4 + 2 + 2 + 4


async def test_an_rpc_outcome_is_not_counted_as_a_stream_outcome(store: CurriculumStore) -> None:
    assert await store.record([outcome(0, True)]) == 1
    stats = await store.stats()
    assert (stats.outcomes, stats.stream_outcomes) == (1, 0)
    assert await store.record([outcome(1, True)], from_stream=True) == 1
    stats = await store.stats()
    assert (stats.outcomes, stats.stream_outcomes) == (2, 1)


async def test_a_failure_boosts_a_neighbour_anywhere_in_the_history(store: CurriculumStore) -> None:
    """Four failures; the last one's only similar past failure is the newest of the three before it."""
    for seed, fp in enumerate(["alpha", "beta", "gamma", "delta epsilon"]):
        await store.record([outcome(seed, False, fp)])
    await store.record([outcome(4, False, "delta epsilon")])
    history = await store.failures()
    assert [f.task_key for f in history] == [f"{BUCKET}#{s}" for s in range(5)]
    assert history[-1] == Failure(f"{BUCKET}#4", "delta epsilon")
    # each failed task: 1.0 + self_boost 1.0 = 2.0; seed 3 (similarity 1) also gains boost 0.5 x 1 = 0.5
    assert await store.weights(BUCKET) == {
        f"{BUCKET}#0": 2.0, f"{BUCKET}#1": 2.0, f"{BUCKET}#2": 2.0, f"{BUCKET}#3": 2.5, f"{BUCKET}#4": 2.0,
    }  # fmt: skip


async def test_eval_outcomes_move_no_weight_and_leave_no_failure(store: CurriculumStore) -> None:
    offset = store.cfg.eval_seed_offset
    for seed in (offset, offset + 5):
        await store.record([outcome(seed, False, "red wolf")])
    assert await store.weights(BUCKET) == {} and await store.failures() == []
    await store.record([outcome(offset - 1, False, "red wolf")])  # the last train seed is reweighted
    assert await store.weights(BUCKET) == {f"{BUCKET}#{offset - 1}": 2.0}


async def test_a_first_loss_to_a_scripted_bot_rates_both_sides(store: CurriculumStore) -> None:
    await store.record([outcome(0, False, opponent="scripted:heuristic")])
    trainee, [(entry, proto)] = await store.league()
    # 1000 vs 1000: E = 1/2, a loss moves 32 * (0 - 1/2) = -16
    assert trainee == Entry("trainee", 984.0, 1, 0, 1, 0)
    assert entry == Entry("scripted:heuristic", 1016.0, 1, 1, 0, 0)
    assert (proto.kind, proto.bot) == (pb.OPPONENT_KIND_SCRIPTED, "heuristic")
    await store.record([outcome(1, True, opponent="self:learner")])  # self-play: no rating change
    assert (await store.league())[0] == trainee


async def test_a_count_of_zero_is_rejected(store: CurriculumStore) -> None:
    for count in (0, -1):
        with pytest.raises(ValueError, match="count"):
            await store.next_tasks(count, "train")


async def test_replay_draws_a_seed_that_has_a_weight_else_a_fresh_one(client: aioredis.Redis) -> None:
    store = new_store(client, replay_ratio=1.0)
    # nothing weighted yet: even at replay_ratio 1 the seed is fresh (0)
    assert {t.seed for t in await store.next_tasks(2, "train")} == {0}
    await store.record([outcome(7, False, "red wolf")])  # the only weighted task: seed 7
    assert {t.seed for t in await store.next_tasks(6, "train")} == {7}
    # eval never replays
    assert {t.seed for t in await store.next_tasks(2, "eval")} == {store.cfg.eval_seed_offset}


async def test_the_success_rate_is_over_the_last_recent_window_outcomes(client: aioredis.Redis) -> None:
    store = new_store(client, recent_window=3)
    for seed, success in enumerate([True, True, False, False]):
        await store.record([outcome(seed, success)])
    # the window keeps the last 3 of [1, 1, 0, 0]: [1, 0, 0] -> 1/3
    [bucket] = (await store.stats()).buckets
    assert bucket.success_rate == pytest.approx(1 / 3)
    assert (bucket.finished, bucket.failures) == (4, 2)
