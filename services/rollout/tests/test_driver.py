"""RolloutDriver over real gRPC (environment, inference with the tiny model, reward) and a real Redis stream."""

from __future__ import annotations

import random
from typing import Any

import redis.asyncio as aioredis

from wolfpack import rpc
from wolfpack.stream import ProtoStreamConsumer, ProtoStreamProducer
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_curriculum.config import Bucket, CurriculumConfig, SeatPlan
from wolfpack_curriculum.league import Entry
from wolfpack_curriculum.scheduler import LeagueView, make_group, seat_plan
from wolfpack_environment.client import EnvironmentClient
from wolfpack_rollout.driver import RolloutConfig, RolloutDriver, SamplingConfig
from wolfpack_rollout.prompts import memory_text
from wolfpack_rollout.summary import summarize


async def test_werewolf_and_bargaining_concurrently_reach_the_stream_token_exact(
    stack: Any, tasks: dict[str, Any], redis_client: aioredis.Redis, stream_key: str
) -> None:
    """8 Werewolf + 8 bargaining episodes at once; every policy turn on the stream carries exactly the token
    ids, logprobs and finish reason that inference sent for it."""
    work = [tasks["werewolf"](seed) for seed in range(8)] + [tasks["bargaining"](seed) for seed in range(8)]
    producer: ProtoStreamProducer[trajectory_pb2.Trajectory] = ProtoStreamProducer(
        redis_client, stream_key, id_of=lambda t: t.trajectory_id
    )
    consumer = ProtoStreamConsumer(
        redis_client, stream_key, "check", "c0", trajectory_pb2.Trajectory, block_ms=50
    )
    await consumer.ensure_group()
    config = RolloutConfig(concurrency=16, sampling=SamplingConfig(max_tokens=12), retries=1)
    async with (
        EnvironmentClient(stack.environment, stack.settings) as env,
        rpc.channel(stack.inference, stack.settings) as inference,
        rpc.channel(stack.reward, stack.settings) as reward,
    ):
        driver = RolloutDriver(
            config, environment=env, inference_channel=inference, reward_channel=reward, producer=producer
        )
        played = await driver.play(work)
        for traj in played:
            await producer.append(traj)
        await driver.close()
    assert driver.stats.failures == {}, driver.stats.failures
    assert len(played) == 16
    assert stack.spy.streams == 1 and stack.spy.batches > 1, "every batch a message of one stream"
    assert [t.task_id for t in played] == [t.task_id for t in work], "play() keeps task order"
    received: list[trajectory_pb2.Trajectory] = []
    while len(received) < len(played):  # bounded: 16 entries are on the stream already
        batch = await consumer.read()
        assert batch, "every appended trajectory is readable"
        received.extend(d.message for d in batch)
        await consumer.ack(batch)
    assert {t.trajectory_id for t in received} == {t.trajectory_id for t in played}
    policy_turns = 0
    for traj in received:
        assert traj.reward_spec, "scored by the reward service"
        assert traj.group_id and traj.group_size == 1
        # the episode's timing survives scoring and the stream: begun before its first turn, ended after its
        # last answer, and the reward service's scoring time measured
        begun, ended = traj.started_at.ToNanoseconds(), traj.finished_at.ToNanoseconds()
        asked = [t.started_at.ToNanoseconds() for t in traj.turns if t.HasField("started_at")]
        assert asked and begun <= min(asked) and max(asked) <= ended, traj.trajectory_id
        assert traj.score_ms > 0
        assert {o.seat for o in traj.outcomes} == {b.seat for b in traj.seats}
        for turn in traj.turns:
            if turn.seat not in traj.trainee_seats:
                continue
            policy_turns += 1
            if turn.valid or turn.defaulted:  # applied: the environment's parsed action (or default) is kept
                assert turn.action.kind, f"turn {turn.index} of {traj.trajectory_id} has no applied action"
            else:
                assert not turn.action.kind, "a rejected attempt applied nothing"
            sent = stack.spy.sent[f"{traj.trajectory_id}:{turn.seat}:{turn.turn_id}:{turn.attempt}"]
            completion = sent.completions[0]
            assert list(turn.prompt_token_ids) == list(sent.prompt_token_ids)
            assert list(turn.response_token_ids) == list(completion.token_ids)
            assert list(turn.response_logprobs) == list(completion.logprobs)
            assert turn.finish_reason == completion.finish_reason
            assert turn.policy == sent.policy
            assert turn.sampling.max_tokens == 12 and turn.sampling.logprobs
            assert turn.valid or turn.invalid_reason
    assert policy_turns == driver.stats.turns
    games = {t.game.game_id for t in received}
    assert games == {"werewolf_v1", "bargaining_v1"}
    bargaining = [t for t in received if t.game.game_id == "bargaining_v1"]
    for traj in bargaining:  # the scripted seller's messages are in the transcript the reward re-verified
        assert {t.seat for t in traj.turns} == {0, 1}
        assert all(t.outcome != common_pb2.OUTCOME_KIND_UNSPECIFIED for t in traj.outcomes)


async def test_turn_cap_truncates_and_keeps_the_episode(stack: Any, tasks: dict[str, Any]) -> None:
    """An episode past ``max_turns`` policy decisions ends as a truncated, scored trajectory, counted;
    a task repeated in the list is played once per occurrence."""
    config = RolloutConfig(concurrency=2, max_turns=2, sampling=SamplingConfig(max_tokens=8))
    async with (
        EnvironmentClient(stack.environment, stack.settings) as env,
        rpc.channel(stack.inference, stack.settings) as inference,
        rpc.channel(stack.reward, stack.settings) as reward,
    ):
        driver = RolloutDriver(config, environment=env, inference_channel=inference, reward_channel=reward)
        group = tasks["bargaining"](12)  # the same Task object twice: a group of two episodes
        played = await driver.play([tasks["werewolf"](11), group, group])
        await driver.close()
    assert len(played) == 3
    assert played[1].group_id == played[2].group_id and played[1].trajectory_id != played[2].trajectory_id
    for traj in played:
        policy = [t for t in traj.turns if t.response_token_ids]
        assert 1 <= len(policy) <= config.max_turns
        if traj.metadata.get("truncated"):
            assert traj.metadata["truncated"] == "turn_cap"
            assert len(policy) == config.max_turns, "every decision up to the cap is played, none past it"
            if traj.game.game_id == "werewolf_v1":  # scenario outcomes are re-verified from the transcript
                assert all(o.outcome == common_pb2.OUTCOME_KIND_ABORTED for o in traj.outcomes)
    assert driver.stats.truncated_episodes == sum(1 for t in played if t.metadata.get("truncated"))
    assert driver.stats.truncated_episodes >= 1


async def test_memory_prompt_mode_sends_what_the_pure_renderer_gives(
    stack: Any, tasks: dict[str, Any]
) -> None:
    """In ``memory`` mode each prompt is the seat's observation cut to the opening context plus what is new
    since its k-th last decision, exactly as ``prompts.memory_text`` computes it from the recorded turns."""
    config = RolloutConfig(concurrency=2, prompt_mode="memory", memory_steps=1, system_prompt="Be brief.",
                           sampling=SamplingConfig(max_tokens=8))  # fmt: skip
    async with (
        EnvironmentClient(stack.environment, stack.settings) as env,
        rpc.channel(stack.inference, stack.settings) as inference,
        rpc.channel(stack.reward, stack.settings) as reward,
    ):
        driver = RolloutDriver(config, environment=env, inference_channel=inference, reward_channel=reward)
        played = await driver.play([tasks["werewolf"](31), tasks["bargaining"](32)])
        await driver.close()
    cut = 0
    for traj in played:
        past: dict[int, list[str]] = {}
        for turn in traj.turns:
            if not turn.response_token_ids:
                continue
            sent = stack.spy.prompts[f"{traj.trajectory_id}:{turn.seat}:{turn.turn_id}:{turn.attempt}"]
            expected = memory_text(past.get(turn.seat, []), turn.observation_text, 1)
            assert sent == [("system", "Be brief."), ("user", expected)]
            cut += expected != turn.observation_text
            past.setdefault(turn.seat, []).append(turn.observation_text)
    assert cut > 0, "later prompts are shorter than the full observation"


async def test_per_seat_mix_of_trainee_and_external_policies(stack: Any) -> None:
    """A 80/20-style seat plan from the curriculum's scheduler: every policy seat is generated by its own
    policy, trainee seats are the learner's, and the summary counts trainee turns only."""
    plan = SeatPlan(
        trainee_seats=1, mix={"self": 0.5, "external": 0.5}, mix_per="seat", external_policy="strong"
    )
    bucket = Bucket(game_id="werewolf_v1", variant="6p", seats=plan)
    cfg = CurriculumConfig(policy_id="learner")
    rng = random.Random(5)
    work = []
    for seed in (51, 52):
        seats, trainees, kind, opp = seat_plan(bucket, 6, cfg, LeagueView(Entry("trainee", 1000), []), rng)
        work += make_group(bucket, seed, "train", seats, trainees, kind, opp, 1)
    assert {b.policy.policy_id for t in work for b in t.seats} == {"learner", "strong"}
    async with (
        EnvironmentClient(stack.environment, stack.settings) as env,
        rpc.channel(stack.inference, stack.settings) as inference,
        rpc.channel(stack.reward, stack.settings) as reward,
    ):
        driver = RolloutDriver(
            RolloutConfig(concurrency=2, sampling=SamplingConfig(max_tokens=8)),
            environment=env, inference_channel=inference, reward_channel=reward,
        )  # fmt: skip
        played = await driver.play(work)
        await driver.close()
    assert len(played) == 2
    policies_seen = set()
    for traj in played:
        binding = {b.seat: b.policy.policy_id for b in traj.seats}
        trainee_set = set(traj.trainee_seats)
        for turn in traj.turns:
            assert turn.policy.policy_id == binding[turn.seat]
            assert (turn.policy.policy_id == "learner") == (turn.seat in trainee_set)
            policies_seen.add(turn.policy.policy_id)
    assert policies_seen == {"learner", "strong"}
    summary = summarize(played, {}, 1.0)
    assert summary.trainee_turns == sum(
        1 for t in played for turn in t.turns if turn.policy.policy_id == "learner"
    )
