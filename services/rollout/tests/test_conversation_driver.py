"""The ``conversation`` prompt mode through the services: RolloutDriver over real gRPC (environment,
inference with the tiny model, reward), the tiny model's real tokenizer as the driver's ``chat_codec``.

What it shows: the prompts go as token prompts that extend each seat's previous prompt + answer exactly
(what inference saw is what the trajectory records), and ``max_prompt_tokens`` keeps them inside the tiny
model's 512 positions by starting the conversation again, counted, with no episode lost."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from wolfpack import rpc
from wolfpack_environment.client import EnvironmentClient
from wolfpack_rollout.driver import RolloutConfig, RolloutDriver, SamplingConfig
from wolfpack_rollout.prompts import TokenizerCodec

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
            context = [*prev.prompt_token_ids, *prev.response_token_ids]
            if list(turn.prompt_token_ids[: len(context)]) == context:
                extended += 1
            else:
                restarted += 1
    assert extended > 0 and restarted > 0  # e.g. 309 -> 447 tokens, then past 500: a new conversation
    assert driver.stats.compressed_prompts == restarted
