"""Whatever the model answers is a move the game judges, never a lost episode: the driver over the real
stack (environment, reward, inference with the tiny model) where inference's answers are replaced by an
empty, blank, binary or huge text, as a broken or untrained model may send them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from wolfpack import rpc
from wolfpack.v1 import common_pb2
from wolfpack.v1 import inference_service_pb2 as inf_pb
from wolfpack_environment.client import EnvironmentClient
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.policies import PolicyRegistry
from wolfpack_inference.server import register as register_inference
from wolfpack_rollout.driver import RolloutConfig, RolloutDriver, SamplingConfig

from .conftest import POLICY, SpyInference, bargaining_task, werewolf_task


class FixedAnswerInference(SpyInference):
    """The real servicer, except that every completion it sends says ``answer`` (no tokens when empty)."""

    def __init__(self, registry: PolicyRegistry, answer: str) -> None:
        super().__init__(registry)
        self.answer = answer

    async def GenerateBatch(
        self, request: inf_pb.GenerateBatchRequest, context: Any
    ) -> AsyncIterator[inf_pb.GenerateBatchResponse]:  # type: ignore[override]
        async for msg in super().GenerateBatch(request, context):
            for res in msg.results:
                if res.HasField("response"):
                    completion = res.response.completions[0]
                    completion.text = self.answer
                    if not self.answer:
                        del completion.token_ids[:], completion.logprobs[:]
            yield msg


@pytest.mark.parametrize(
    "answer", ["", " \n\t ", "\x00\x01\x7f\ufffd", "x" * 20_000], ids=["empty", "blank", "binary", "huge"]
)
async def test_whatever_the_model_answers_the_episode_is_played_and_scored(
    stack: Any, tiny_dir: Path, tmp_path: Path, answer: str
) -> None:
    cfg = PolicyConfig(policy_id=POLICY, model=str(tiny_dir), device="cpu", dtype="float32", max_batch=8)
    registry = PolicyRegistry.from_configs([cfg], tmp_path)
    servicer = FixedAnswerInference(registry, answer)
    server = await rpc.start_server(
        "inference", lambda s: register_inference(s, servicer), stack.settings, "127.0.0.1:0"
    )
    work = [werewolf_task(5), bargaining_task(5)]
    try:
        async with (
            EnvironmentClient(stack.environment, stack.settings) as env,
            rpc.channel(f"127.0.0.1:{server.port}", stack.settings) as inference,
            rpc.channel(stack.reward, stack.settings) as reward,
        ):
            driver = RolloutDriver(
                RolloutConfig(concurrency=2, sampling=SamplingConfig(max_tokens=4), retries=0),
                environment=env, inference_channel=inference, reward_channel=reward,
            )  # fmt: skip
            played = await driver.play(work)
            await driver.close()
    finally:
        await server.stop(0)
        await registry.close()
    assert driver.stats.failures == {}, driver.stats.failures
    assert len(played) == 2
    for traj in played:
        assert traj.reward_spec, "scored"
        assert "truncated" not in traj.metadata
        assert all(o.outcome != common_pb2.OUTCOME_KIND_ABORTED for o in traj.outcomes), "the game ended"
        trainee = [t for t in traj.turns if t.seat in traj.trainee_seats]
        assert trainee and all(t.response_text == answer for t in trainee), "the answer was sent as it was"
        invalid = [t for t in trainee if not t.valid]
        assert all(t.invalid_reason and t.reward_components["invalid_penalty"] < 0 for t in invalid)
        if len(answer) <= 6_000 and traj.game.game_id != "werewolf_v1":
            assert invalid and any(t.defaulted for t in invalid), "nothing to read: invalid, then defaulted"
    werewolf = played[0]
    if not answer.strip():  # Werewolf takes an empty speech as silence, but never an empty vote
        assert any(not t.valid for t in werewolf.turns), "an empty answer is an invalid move"
