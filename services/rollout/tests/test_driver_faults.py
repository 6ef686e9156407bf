"""The driver's failure rules over real gRPC, one rule per test: retries of a transient inference failure
(per item and for the whole call) counted against the server's own call count, failure reasons named
after the service and status the service really returned, context overflow (compress / truncate /
cannot fit), attempt numbering of re-prompts and the counters against what inference really sent."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from wolfpack import rpc
from wolfpack.errors import ServiceError
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack.v1 import inference_service_pb2 as inf_pb
from wolfpack.v1 import reward_service_pb2 as rew_pb
from wolfpack.v1 import reward_service_pb2_grpc as rew_grpc
from wolfpack_environment.client import EnvironmentClient
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.policies import PolicyRegistry
from wolfpack_rollout.driver import RolloutConfig, RolloutDriver, SamplingConfig

from .conftest import POLICY, SpyInference, bargaining_task, werewolf_task

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


class FlakyInference(SpyInference):
    """The real servicer, except that its first ``failing`` GenerateBatch calls fail: every item with
    UNAVAILABLE (``mode="items"``: what a restarting backend's requests get) or the whole call with
    RESOURCE_EXHAUSTED (``mode="call"``: a full queue; the channel's own retry policy retries only
    UNAVAILABLE, so these reach the driver). ``calls`` counts every GenerateBatch that reached it: a call
    of its own, or a batch of the driver's GenerateBatchStream (which runs each through GenerateBatch)."""

    def __init__(self, registry: PolicyRegistry, failing: int, mode: str) -> None:
        super().__init__(registry)
        self.failing, self.mode, self.calls = failing, mode, 0

    async def GenerateBatch(
        self, request: inf_pb.GenerateBatchRequest, context: Any
    ) -> AsyncIterator[inf_pb.GenerateBatchResponse]:  # type: ignore[override]
        self.calls += 1
        if self.failing > 0:
            self.failing -= 1
            if self.mode == "call":  # the status the call ends with (each item's, over the batch stream)
                raise ServiceError("queue full", grpc.StatusCode.RESOURCE_EXHAUSTED)
            msg = inf_pb.GenerateBatchResponse()
            for i in range(len(request.requests)):
                item = msg.results.add(index=i)
                item.error.code, item.error.message = UNAVAILABLE.value[0], "backend restarting"
            yield msg
            return
        async for msg in super().GenerateBatch(request, context):
            yield msg


async def _play(stack: Any, config: RolloutConfig, work: list[Any], inference: str = "") -> RolloutDriver:
    async with (
        EnvironmentClient(stack.environment, stack.settings) as env,
        rpc.channel(inference or stack.inference, stack.settings) as inf,
        rpc.channel(stack.reward, stack.settings) as reward,
    ):
        driver = RolloutDriver(config, environment=env, inference_channel=inf, reward_channel=reward)
        driver.trajectories = await driver.play(work)
        await driver.close()
    return driver


@pytest.mark.parametrize("mode", ["items", "call"])
@pytest.mark.parametrize(("retries", "ok"), [(2, True), (1, False)])
async def test_transient_inference_failures_are_retried_exactly_retries_times(
    stack: Any, tiny_dir: Path, tmp_path: Path, mode: str, retries: int, ok: bool
) -> None:
    """One episode, one policy seat: its first decision meets 2 failed GenerateBatch calls. With 2 retries
    the third call succeeds and the episode completes; with 1 the episode fails after 2 calls."""
    cfg = PolicyConfig(policy_id=POLICY, model=str(tiny_dir), device="cpu", dtype="float32")
    registry = PolicyRegistry.from_configs([cfg], tmp_path)
    flaky = FlakyInference(registry, failing=2, mode=mode)
    from wolfpack_inference.server import register

    server = await rpc.start_server("inference", lambda s: register(s, flaky), stack.settings, "127.0.0.1:0")
    try:
        config = RolloutConfig(
            concurrency=1, retries=retries, backoff_s=0.01, sampling=SamplingConfig(max_tokens=8)
        )
        driver = await _play(stack, config, [werewolf_task(61)], f"127.0.0.1:{server.port}")
    finally:
        await server.stop(0)
        await registry.close()
    if ok:
        assert driver.stats.failures == {} and len(driver.trajectories) == 1
        assert driver.stats.retries == 2, "two failed calls, two retries"
        first = driver.trajectories[0].turns[0]
        assert flaky.sent[f"{driver.trajectories[0].trajectory_id}:{first.seat}:{first.turn_id}:0"], (
            "the retried request kept its request id (attempt 0: a retry is not a re-prompt)"
        )
    else:
        assert driver.stats.failures == {"inference_unavailable": 1} and driver.trajectories == []
        assert flaky.calls == 2 and driver.stats.retries == 1, "1 + retries calls, then the episode fails"


async def test_non_transient_failures_are_named_after_the_service_and_status(stack: Any) -> None:
    """No retry for a status that will not change; the reason is ``<service>_<status>`` of the status the
    service really returned (asked directly here), or ``context_overflow`` for a prompt that cannot fit."""
    fast = dict(concurrency=2, retries=3, backoff_s=0.01)
    unknown = werewolf_task(62)
    unknown.seats[0].policy.policy_id = "no-such-policy"
    driver = await _play(stack, RolloutConfig(**fast, sampling=SamplingConfig(max_tokens=8)), [unknown])  # type: ignore[arg-type]
    assert driver.stats.retries == 0 and len(driver.stats.failures) == 1
    (reason,) = driver.stats.failures
    assert reason.startswith("inference_") and reason != "inference_unavailable", reason

    probe = trajectory_pb2.Trajectory(trajectory_id="probe")  # what Score answers for this spec
    probe.game.game_id = "bargaining_v1"
    async with rpc.channel(stack.reward, stack.settings) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as direct:
            await rew_grpc.RewardServiceStub(ch).Score(
                rew_pb.ScoreRequest(trajectory=probe, spec="no_such_spec")
            )
    assert "no_such_spec" in (direct.value.details() or ""), "refused for its spec"
    bad_spec = RolloutConfig(**fast, reward_spec="no_such_spec", sampling=SamplingConfig(max_tokens=8))  # type: ignore[arg-type]
    driver = await _play(stack, bad_spec, [bargaining_task(63)])
    assert driver.stats.failures == {f"reward_{direct.value.code().name.lower()}": 1}
    assert driver.stats.retries == 0 and driver.stats.turns > 0, "played, then refused without retries"

    # the tiny model has 512 positions: 600 new tokens leave no room for any prompt
    driver = await _play(
        stack, RolloutConfig(**fast, sampling=SamplingConfig(max_tokens=600)), [werewolf_task(64)]
    )  # type: ignore[arg-type]
    assert driver.stats.failures == {"context_overflow": 1} and driver.stats.retries == 0


async def test_context_overflow_compress_counts_and_truncate_ends(stack: Any) -> None:
    """The tiny model's 512 positions are less than any prompt plus 8 new tokens, so inference compresses
    every prompt (its responses say so). ``compress`` plays on and counts each; ``truncate`` ends each
    episode at its first policy turn: kept when the game has turns (the scripted seller spoke first),
    failed as ``no_turns`` when nothing was played."""
    work = [bargaining_task(2), werewolf_task(65)]  # seed 2: the scripted seat 1 opens the bargaining
    driver = await _play(stack, RolloutConfig(concurrency=2, sampling=SamplingConfig(max_tokens=8)), work)
    assert driver.stats.failures == {} and len(driver.trajectories) == 2
    flags = [r.prompt_compressed for r in stack.spy.sent.values()]
    assert all(flags) and driver.stats.compressed_prompts == len(flags) == driver.stats.turns
    assert not any(t.metadata.get("truncated") for t in driver.trajectories)

    stack.spy.sent.clear()
    cut = RolloutConfig(concurrency=2, context_overflow="truncate", sampling=SamplingConfig(max_tokens=8))
    driver = await _play(stack, cut, work)
    assert len(stack.spy.sent) == 2, "one generation per episode, then it ends"
    assert driver.stats.compressed_prompts == 0 and driver.stats.turns == 0, "the cut turn is not recorded"
    assert driver.stats.failures == {"no_turns": 1} and driver.stats.truncated_episodes == 1
    (kept,) = driver.trajectories
    assert kept.game.game_id == "bargaining_v1" and kept.metadata["truncated"] == "context_overflow"
    assert [t.seat for t in kept.turns] == [1] and not kept.turns[0].response_token_ids


async def test_counters_and_attempt_numbers_match_what_inference_sent(stack: Any) -> None:
    """Counters against the spy's record of every response; a re-prompted turn's attempts are 0, 1, 2, ...
    in order (the random tiny model writes unparsable moves, so Werewolf re-prompts it)."""
    work = [werewolf_task(s) for s in (66, 67, 68)]
    driver = await _play(stack, RolloutConfig(concurrency=3, sampling=SamplingConfig(max_tokens=8)), work)
    assert driver.stats.failures == {} and len(driver.trajectories) == 3
    sent = list(stack.spy.sent.values())
    assert driver.stats.turns == len(sent)
    assert driver.stats.generated_tokens == sum(len(r.completions[0].token_ids) for r in sent)
    length = common_pb2.FINISH_REASON_LENGTH
    assert driver.stats.truncated_responses == sum(r.completions[0].finish_reason == length for r in sent)
    reprompted = 0
    for traj in driver.trajectories:
        attempts: dict[tuple[int, int], list[int]] = {}
        for turn in traj.turns:
            attempts.setdefault((turn.seat, turn.turn_id), []).append(turn.attempt)
        for seq in attempts.values():
            assert seq == list(range(len(seq))), seq
            reprompted += len(seq) > 1
    assert reprompted > 0, "some turn was re-prompted"


async def test_play_stream_routes_late_and_foreign_results(stack: Any) -> None:
    """The PlaySeats reader on hand-made server messages (a real stream to the environment underneath):
    a result for an episode this stream does not know, and a late result for a turn the seat has moved
    past (the environment timed it out and sent the next decision), are skipped without breaking the
    stream or the results after them in the same message; the last seat's final observation ends the
    episode."""
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    from wolfpack.v1 import environment_service_pb2 as env_pb
    from wolfpack.v1 import environment_service_pb2_grpc as env_grpc
    from wolfpack_environment.client import PlayStream
    from wolfpack_rollout.driver import RolloutStats, _Episode, _PlayStream
    from wolfpack_rollout.trajectory import TurnRecord

    loop = asyncio.get_running_loop()
    ep = _Episode(werewolf_task(69), "tr", trace.INVALID_SPAN, otel_context.Context(), common_pb2.TraceContext(),
                  loop.create_future(), episode_id="ep", seat_tokens={3: "t3", 4: "t4"})  # fmt: skip
    for seat, turn in ((3, 8), (4, 2)):
        ep.last[seat] = TurnRecord(
            seat=seat, turn_id=turn, phase="day", round=1, observation_text="", prompt_token_ids=[],
            response_token_ids=[], response_logprobs=[], response_text="x", finish_reason=0,
            policy=common_pb2.PolicyRef(), sampling=common_pb2.SamplingParams(),
        )  # fmt: skip
        ep.by_turn[(seat, turn)] = ep.last[seat]  # what the driver's _record keeps for the results
    decided: list[Any] = []
    stats = RolloutStats()
    async with rpc.channel(stack.environment, stack.settings) as ch:
        transport = PlayStream(env_grpc.EnvironmentServiceStub(ch))
        stream = _PlayStream(transport, {"ep": ep}, decided.extend, stats)
        try:
            msg = env_pb.PlaySeatsResponse()
            msg.results.add(episode_id="ghost", seat=3, turn_id=8, accepted=True)
            msg.results.add(episode_id="ep", seat=3, turn_id=7, accepted=False, reason="late")  # moved past
            msg.results.add(episode_id="ep", seat=3, turn_id=8, accepted=False, reason="malformed")
            stale = msg.results.add(episode_id="ep", seat=4, turn_id=2)
            stale.error.code, stale.error.message = grpc.StatusCode.FAILED_PRECONDITION.value[0], "turn over"
            msg.decisions.add(episode_id="ep", seat=3, turn_id=9, your_turn=True)
            msg.decisions.add(episode_id="ep", seat=4, done=True)
            stream._handle(msg)
            rec3, rec4 = ep.last[3], ep.last[4]
            assert (rec3.valid, rec3.defaulted, rec3.invalid_reason) == (False, False, "malformed")
            assert (rec4.valid, rec4.defaulted) == (False, True) and rec4.invalid_reason.startswith(
                "FAILED_PRECONDITION"
            )
            assert stats.stale_acts == 1 and not ep.closed
            assert [(e is ep, o.seat, o.turn_id) for e, o in decided] == [(True, 3, 9)]
            done = env_pb.PlaySeatsResponse()
            done.decisions.add(episode_id="ep", seat=3, done=True)
            done.results.add(episode_id="ep", seat=3, turn_id=8, accepted=True)  # after the end: ignored
            stream._handle(done)
            assert ep.closed and ep.failure is None and not ep.truncated
            assert rec3.invalid_reason == "malformed", "a closed episode's records are final"
            assert not stream.broken
        finally:
            await stream.close()


async def test_an_unexpected_error_fails_its_episode_not_the_run(stack: Any, redis_client: Any) -> None:
    """A sink error the driver has no rule for (the stream's Redis is gone for longer than the stream's
    retry window: not backpressure) fails each episode as ``internal:<type>``; ``run`` itself returns its
    summary."""
    import redis.asyncio as aioredis

    from wolfpack.stream import ProtoStreamProducer, RetryPolicy, StreamUnavailableError
    from wolfpack_curriculum.client import CurriculumClient
    from wolfpack_curriculum.config import CurriculumConfig
    from wolfpack_curriculum.server import CurriculumServicer, register
    from wolfpack_curriculum.store import CurriculumStore

    cfg = CurriculumConfig.model_validate({"policy_id": POLICY, "key_prefix": f"test:int:{uuid.uuid4().hex}"})
    cur_server = await rpc.start_server(
        "curriculum", lambda s: register(s, CurriculumServicer(CurriculumStore(redis_client, cfg))),
        stack.settings, "127.0.0.1:0",
    )  # fmt: skip
    held = socket.socket()  # bound, never listening: refuses connections, and no one else takes the port
    held.bind(("127.0.0.1", 0))
    gone = aioredis.Redis.from_url(f"redis://127.0.0.1:{held.getsockname()[1]}")
    producer: ProtoStreamProducer[trajectory_pb2.Trajectory] = ProtoStreamProducer(
        gone, "test:gone", id_of=lambda t: t.trajectory_id, retry=RetryPolicy(timeout_s=0.2)
    )
    try:
        async with (
            EnvironmentClient(stack.environment, stack.settings) as env,
            rpc.channel(stack.inference, stack.settings) as inference,
            rpc.channel(stack.reward, stack.settings) as reward,
            CurriculumClient(f"127.0.0.1:{cur_server.port}", stack.settings) as curriculum,
        ):
            driver = RolloutDriver(
                RolloutConfig(concurrency=2, sampling=SamplingConfig(max_tokens=8)), environment=env,
                inference_channel=inference, reward_channel=reward, curriculum=curriculum, producer=producer,
            )  # fmt: skip
            summary = await driver.run(2)
    finally:
        await cur_server.stop(0)
        await gone.aclose()
        held.close()
    assert summary.episodes == 0 and summary.failed == driver.stats.episodes_started >= 2
    assert list(summary.failures) == [f"internal:{StreamUnavailableError.__name__}"], summary.failures
    assert driver.stats.in_flight == 0


async def test_a_failed_write_fails_the_stream_s_episodes_at_once(stack: Any) -> None:
    """The PlaySeats transport (the environment client's ``PlayStream``) cannot send: the read side says
    why at once (the episodes fail ``environment_stream``) instead of waiting for a server message that
    can never come."""
    from wolfpack.v1 import environment_service_pb2_grpc as env_grpc
    from wolfpack_environment.client import PlayStream

    async with rpc.channel(stack.environment, stack.settings) as ch:
        stream = PlayStream(env_grpc.EnvironmentServiceStub(ch))

        async def refuse(message: Any) -> None:
            raise RuntimeError("cannot write")

        stream.call.write = refuse  # before the writer's first message
        try:
            with pytest.raises(RuntimeError, match="cannot write"):
                await asyncio.wait_for(stream.read(), timeout=10)
        finally:
            await stream.close()
