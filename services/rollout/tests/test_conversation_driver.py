"""The ``conversation`` prompt mode through the services: RolloutDriver over real gRPC (environment,
inference with the tiny model, reward), the tiny model's real tokenizer as the driver's ``chat_codec``.

What it shows: the prompts go as token prompts that extend each seat's previous prompt + answer exactly
(what inference saw is what the trajectory records), and ``max_prompt_tokens`` keeps them inside the tiny
model's 512 positions by starting the conversation again, counted, with no episode lost."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from wolfpack import rpc
from wolfpack.models import tiny_model
from wolfpack.v1 import common_pb2
from wolfpack.v1 import inference_service_pb2 as inf_pb
from wolfpack_environment.client import EnvironmentClient
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.policies import PolicyRegistry
from wolfpack_inference.server import register
from wolfpack_rollout.driver import RolloutConfig, RolloutDriver, SamplingConfig
from wolfpack_rollout.prompts import TokenizerCodec
from wolfpack_rollout.summary import summarize

from .conftest import SpyInference

POLICY = "learner"
"""The tiny model's policy id on the test stack (``conftest.POLICY``)."""
BUDGET = 500
"""Prompt tokens: the tiny model's 512 positions less an answer's 8 (inference refuses longer ones)."""


async def test_conversation_prompts_extend_through_the_services(
    stack: Any, tasks: dict[str, Any], tiny_dir: Path
) -> None:
    config = RolloutConfig(concurrency=2, prompt_mode="conversation", max_prompt_tokens=BUDGET,
                           sampling=SamplingConfig(max_tokens=8))  # fmt: skip
    async with (
        EnvironmentClient(stack.environment, stack.settings) as env,
        rpc.channel(stack.inference, stack.settings) as inference,
        rpc.channel(stack.reward, stack.settings) as reward,
    ):
        driver = RolloutDriver(config, environment=env, inference_channel=inference, reward_channel=reward,
                               chat_codec=TokenizerCodec(AutoTokenizer.from_pretrained(tiny_dir)))  # fmt: skip
        played = await driver.play([tasks["ultimatum"](32), tasks["ultimatum"](33)])
        await driver.close()
    assert driver.stats.episodes_failed == 0, driver.stats.recent_failures
    assert len(played) == 2
    extended = restarted = 0
    for traj in played:
        turns = [t for t in traj.turns if t.response_token_ids]
        for turn in turns:
            sent = stack.spy.sent[f"{traj.trajectory_id}:{turn.seat}:{turn.turn_id}:{turn.attempt}"]
            assert list(sent.prompt_token_ids) == list(turn.prompt_token_ids)  # a token prompt, as sent
            assert len(turn.prompt_token_ids) <= BUDGET
        for prev, turn in itertools.pairwise(turns):
            if _extends(turn, prev):
                extended += 1
            else:
                restarted += 1
    assert extended > 0 and restarted > 0  # e.g. 309 -> 447 tokens, then past 500: a new conversation
    assert driver.stats.compressed_prompts == restarted


class HeldAnswers(SpyInference):
    """The real servicer, with some answers held back: ``hold`` maps a request's (seat, turn id) to the
    (seat, turn id) whose request must have arrived (``after_asked``) or been answered (``after_answered``)
    before it is answered, so that an answer arrives after the environment's turn timeout, deterministically.
    ``order`` keeps the request ids in the order they came."""

    def __init__(
        self,
        registry: PolicyRegistry,
        after_answered: dict[tuple[int, int], tuple[int, int]] | None = None,
        after_asked: dict[tuple[int, int], tuple[int, int]] | None = None,
        then_wait_s: float = 0.0,
    ) -> None:
        super().__init__(registry)
        self.after_answered, self.after_asked = after_answered or {}, after_asked or {}
        self.then_wait_s = then_wait_s
        self.order: list[str] = []
        self.asked: dict[tuple[int, int], asyncio.Event] = {}
        self.answered: dict[tuple[int, int], asyncio.Event] = {}

    def _event(self, events: dict[tuple[int, int], asyncio.Event], key: tuple[int, int]) -> asyncio.Event:
        return events.setdefault(key, asyncio.Event())

    async def GenerateBatch(
        self, request: inf_pb.GenerateBatchRequest, context: Any
    ) -> AsyncIterator[inf_pb.GenerateBatchResponse]:  # type: ignore[override]
        keys = []
        for r in request.requests:
            self.order.append(r.request_id)
            _, seat, turn, _ = r.request_id.split(":")
            keys.append((int(seat), int(turn)))
            self._event(self.asked, keys[-1]).set()
        for key in keys:
            if key in self.after_asked:
                await asyncio.wait_for(self._event(self.asked, self.after_asked[key]).wait(), timeout=60)
            if key in self.after_answered:
                await asyncio.wait_for(
                    self._event(self.answered, self.after_answered[key]).wait(), timeout=60
                )
                await asyncio.sleep(self.then_wait_s)
        async for msg in super().GenerateBatch(request, context):
            yield msg
        for key in keys:
            self._event(self.answered, key).set()


LONG_BUDGET = 2040
"""Prompt tokens for ``long_dir``'s 2,048 positions less an answer's 8: room for a bargaining seat's whole
conversation, so that its prompts extend each other instead of starting again."""


@pytest.fixture(scope="module")
def long_dir() -> Path:
    """The tiny model with 2,048 positions (built once per machine, like ``tiny_dir``)."""
    return tiny_model(Path(tempfile.gettempdir()) / "wolfpack-test-models", max_positions=2048)


async def _play_held(
    stack: Any, model: Path, tmp_path: Path, task: Any, **hold: Any
) -> tuple[RolloutDriver, Any, dict[tuple[int, int], Any]]:
    """One conversation-mode episode over the stack's environment and reward, the model served by a
    ``HeldAnswers`` (``hold``: its arguments); a turn timeout of 0.5 s. Returns the driver, the trajectory and
    its answered first attempts by (seat, turn id)."""
    config = RolloutConfig(concurrency=1, prompt_mode="conversation", max_prompt_tokens=LONG_BUDGET, turn_timeout_s=0.5,
                           sampling=SamplingConfig(max_tokens=8))  # fmt: skip
    registry = PolicyRegistry.from_configs(
        [PolicyConfig(policy_id=POLICY, model=str(model), device="cpu", dtype="float32")], tmp_path
    )
    held = HeldAnswers(registry, **hold)
    server = await rpc.start_server("inference", lambda s: register(s, held), stack.settings, "127.0.0.1:0")
    try:
        async with (
            EnvironmentClient(stack.environment, stack.settings) as env,
            rpc.channel(f"127.0.0.1:{server.port}", stack.settings) as channel,
            rpc.channel(stack.reward, stack.settings) as reward,
        ):
            driver = RolloutDriver(config, environment=env, inference_channel=channel, reward_channel=reward,
                                   chat_codec=TokenizerCodec(AutoTokenizer.from_pretrained(model)))  # fmt: skip
            played = await asyncio.wait_for(driver.play([task]), timeout=120)
            await driver.close()
    finally:
        await server.stop(0)
        await registry.close()
    assert driver.stats.episodes_failed == 0, driver.stats.recent_failures
    (traj,) = played
    mine = {(t.seat, t.turn_id): t for t in traj.turns if t.response_token_ids and t.attempt == 0}
    return driver, traj, mine


def _extends(turn: Any, before: Any) -> bool:
    context = [*before.prompt_token_ids, *before.response_token_ids]
    return list(turn.prompt_token_ids[: len(context)]) == context


async def test_a_late_answer_after_the_seat_was_asked_again_does_not_fork_its_conversation(
    stack: Any, tasks: dict[str, Any], long_dir: Path, tmp_path: Path
) -> None:
    """The seat's 2nd answer held until its 4th was answered: by then the environment had defaulted the 2nd
    at its turn timeout and asked the seat twice more. The seat's later prompts go on from its newest prompt
    and answer, none carries the late answer (a move the game never made; before, every prompt after it
    extended the late one's chain, a fork), and the late turn is in its turn's place, marked defaulted."""
    driver, traj, mine = await _play_held(
        stack, long_dir, tmp_path, tasks["bargaining"](41), after_answered={(0, 2): (0, 4)}
    )
    assert max(turn for _, turn in mine) >= 6, f"the game ended too soon to show anything: {sorted(mine)}"
    late = mine[(0, 2)]
    assert late.defaulted and not late.valid and "timed out" in late.invalid_reason, late
    assert driver.stats.stale_acts == 1 and driver.stats.compressed_prompts == 0
    summary = summarize([traj], {}, 1.0, driver.stats)  # what `wolfpack rollout` prints of it
    assert summary.late_answers == 1 and summary.defaulted_moves >= 1
    # in its turn's place: the scenario verifier reads the applied messages in order (the default there)
    order = [t.turn_id for t in traj.turns if t.response_token_ids]
    assert order == sorted(order)
    for turn in range(3, max(t for _, t in mine) + 1):
        assert not _extends(mine[(0, turn)], late), f"turn {turn} goes on from the late answer"
    assert _extends(mine[(0, 3)], mine[(0, 1)])  # asked while the 2nd was out: from the 1st
    for turn in range(5, max(t for _, t in mine) + 1):
        assert _extends(mine[(0, turn)], mine[(0, turn - 1)]), f"turn {turn} does not go on from {turn - 1}"


async def test_a_late_answer_to_a_seat_not_yet_asked_again_is_left_out_of_its_conversation(
    stack: Any, tasks: dict[str, Any], long_dir: Path, tmp_path: Path
) -> None:
    """Self-play bargaining (both seats the policy): the buyer's 2nd answer held until the seller has been
    asked its 2nd (the environment had defaulted the buyer's at its turn timeout), then answered while the
    buyer waits for its 3rd turn (the seller's answer held 0.3 s more). The buyer's 3rd prompt goes on from
    its 1st prompt and answer, not from the late answer the game never applied (before, it did: the chat
    moved on with every answer, applied or not)."""
    task = tasks["bargaining"](42)
    seller = task.seats.add(seat=1, controller=common_pb2.SEAT_CONTROLLER_POLICY)
    seller.policy.policy_id = POLICY
    task.trainee_seats.append(1)
    driver, _, mine = await _play_held(
        stack,
        long_dir,
        tmp_path,
        task,
        after_asked={(0, 2): (1, 2)},
        after_answered={(1, 2): (0, 2)},
        then_wait_s=0.3,
    )
    assert (0, 3) in mine, f"the game ended too soon to show anything: {sorted(mine)}"
    late = mine[(0, 2)]
    assert late.defaulted and not late.valid and "timed out" in late.invalid_reason, late
    assert driver.stats.stale_acts == 1 and driver.stats.compressed_prompts == 0
    assert not _extends(mine[(0, 3)], late), "the buyer's 3rd prompt goes on from its late answer"
    assert _extends(mine[(0, 3)], mine[(0, 1)])
    assert _extends(mine[(1, 2)], mine[(1, 1)])  # the seller's conversation is untouched
