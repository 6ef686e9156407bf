"""The ``conversation`` prompt mode in the trainer's local mode: real Werewolf 6p engines, the real tiny-model
tokenizer (ChatML), rewards from the reward library; a scripted policy function in place of the model where
a test needs exact answers, the tiny model itself in the ``wolfpack train`` run.

What it shows: each of a seat's prompts extends its previous prompt + answer token for token and decodes to
the chat template over the whole conversation (re-prompted invalid answers included); ``batch.layout:
episode`` then makes one sample per seat-game; ``max_prompt_tokens`` is the conversation's budget, past
which ``context_overflow`` starts the conversation again (``compress``) or ends the episode (``truncate``),
never losing it; and a local ``wolfpack train`` run with ``rollout.prompt: conversation`` trains fewer
samples than turns.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers", reason="the trainer extra is not installed")

from transformers import AutoTokenizer

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_games import get_game
from wolfpack_inference.models import tiny_model
from wolfpack_rollout.client import RolloutConfig, SamplingConfig
from wolfpack_rollout.prompts import memory_text, new_lines
from wolfpack_trainer import train as train_module
from wolfpack_trainer.batch import BatchConfig, BuildStats, build_samples, trainee_turns
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.local_rollout import Generated, Task, TokenizerCodec, local_driver, rollout_config
from wolfpack_trainer.train import run_training, service_task
from wolfpack_trainer.warmstart import WarmStartConfig, bot_pairs, bot_turns, warmstart_config

ANSWERS = ["pass", "vote 2", "REJEPT", "inspect 3", "kill 2", "", "I think Player 4 is a wolf."]
"""Legal and illegal Werewolf answers alike: an invalid one is re-prompted and stays in the conversation."""

WIDE = BatchConfig(layout="episode", max_prompt_len=1 << 16, max_response_len=1 << 16)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model(tmp_path_factory.mktemp("models")))


@pytest.fixture(scope="module")
def tokenizer(tiny: str) -> Any:
    return AutoTokenizer.from_pretrained(tiny)


def scripted(tokenizer: Any, *, stop_every: int = 1) -> Any:
    """Answers ``ANSWERS`` in turn, as token ids; every ``stop_every``-th answer ends with EOS (finish STOP),
    the others are cut without it (finish LENGTH), so the template's end-of-turn tokens must be added."""
    calls = itertools.count()
    eos = int(tokenizer.eos_token_id)

    def policy(policy_id: str, prompts: list[list[int]], sampling: Any) -> list[Generated]:
        out = []
        for _ in prompts:
            i = next(calls)
            ids = list(tokenizer(ANSWERS[i % len(ANSWERS)], add_special_tokens=False)["input_ids"])
            if i % stop_every == 0 or not ids:  # a model answers at least one token
                out.append(Generated([*ids, eos], [-1.0] * (len(ids) + 1), common_pb2.FINISH_REASON_STOP))
            else:
                out.append(Generated(ids, [-1.0] * len(ids), common_pb2.FINISH_REASON_LENGTH))
        return out

    return policy


async def play(
    tokenizer: Any, seeds: Sequence[int], **config: Any
) -> tuple[list[trajectory_pb2.Trajectory], Any]:
    driver = local_driver(
        RolloutConfig(
            sampling=SamplingConfig(max_tokens=16), max_turns=400, prompt_mode="conversation", **config
        ),
        tokenizer, scripted(tokenizer, stop_every=2), lambda: {"p": 0},
    )  # fmt: skip
    tasks = [service_task(Task("werewolf_v1", "6p", seed, {0: "p"}), i) for i, seed in enumerate(seeds)]
    trajs = await driver.play(tasks)
    assert driver.stats.episodes_failed == 0, driver.stats.recent_failures
    assert len(trajs) == len(seeds)  # nothing lost
    return trajs, driver


def conversation(turns: Sequence[trajectory_pb2.Turn]) -> list[dict[str, str]]:
    """The chat a seat's turns make: the first observation, then each answer and what is new after it."""
    messages = [{"role": "user", "content": turns[0].observation_text}]
    for prev, turn in itertools.pairwise(turns):
        messages.append({"role": "assistant", "content": prev.response_text})
        messages.append({"role": "user", "content": new_lines(prev.observation_text, turn.observation_text)})
    return messages


async def test_each_prompt_extends_the_previous_prompt_and_answer(tokenizer: Any) -> None:
    trajs, _ = await play(tokenizer, [1, 2, 3])
    codec = TokenizerCodec(tokenizer)
    checked = reprompted = cut = 0
    for traj in trajs:
        turns = trainee_turns(traj)[0]
        assert len(turns) > 1
        for prev, turn in itertools.pairwise(turns):
            context = [*prev.prompt_token_ids, *prev.response_token_ids]
            assert list(turn.prompt_token_ids[: len(context)]) == context  # token for token
            reprompted += turn.attempt > 0
            cut += prev.finish_reason == common_pb2.FINISH_REASON_LENGTH
            checked += 1
        # the last prompt is the template over the whole conversation (answers as the model gave them)
        want = codec.render(conversation(turns), True)
        assert tokenizer.decode(list(turns[-1].prompt_token_ids)) == want
    assert checked > 10 and reprompted and cut  # invalid answers and answers cut without EOS were among them


STRICT_CHATML = (
    "{% for message in messages %}"
    "{% if loop.previtem is defined and loop.previtem['role'] == message['role'] %}"
    "{{ raise_exception('roles must alternate user/assistant') }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML that refuses two messages of one role in a row, as many models' templates do."""


async def test_the_conversation_alternates_user_and_assistant(tiny: str) -> None:
    """The messages the suffix is cut from hold every answer, so a template that checks turns accepts them."""
    strict = AutoTokenizer.from_pretrained(tiny)
    strict.chat_template = STRICT_CHATML
    trajs, _ = await play(strict, [1, 2])  # no episode failed (prompt_template)
    for traj in trajs:
        turns = trainee_turns(traj)[0]
        assert len(turns) > 1
        want = TokenizerCodec(strict).render(conversation(turns), True)
        assert strict.decode(list(turns[-1].prompt_token_ids)) == want


async def test_the_episode_layout_makes_one_sample_per_seat_game(tokenizer: Any) -> None:
    trajs, _ = await play(tokenizer, [1, 2])
    stats = BuildStats()
    samples = build_samples(trajs, WIDE, stats)
    assert stats.split_sequences == 0
    assert len(samples) == len(trajs) < stats.turns
    for traj, sample in zip(trajs, samples, strict=True):
        turns = trainee_turns(traj)[0]
        # the sample is the last prompt and answer: the observations between answers masked out
        assert [*sample.prompt, *sample.response] == [
            *turns[-1].prompt_token_ids,
            *turns[-1].response_token_ids,
        ]
        assert sum(sample.response_mask) == sum(len(t.response_token_ids) for t in turns)


async def test_past_the_budget_the_seat_starts_a_new_conversation(tokenizer: Any) -> None:
    budget = 1200  # seed 3 is a long game: its seat's conversation passes this several times
    whole, _ = await play(tokenizer, [3, 4])
    assert max(len(t.prompt_token_ids) for traj in whole for t in traj.turns) > 3 * budget
    trajs, driver = await play(tokenizer, [3, 4], max_prompt_tokens=budget)
    codec = TokenizerCodec(tokenizer)
    assert max(len(t.prompt_token_ids) for traj in trajs for t in traj.turns) <= budget
    restarts = extended = 0
    for traj in trajs:
        seat_turns = trainee_turns(traj)[0]
        restarted = False
        for k, (prev, turn) in enumerate(itertools.pairwise(seat_turns), start=1):
            context = [*prev.prompt_token_ids, *prev.response_token_ids]
            if list(turn.prompt_token_ids[: len(context)]) == context:
                extended += restarted  # a new conversation goes on as one
                continue
            # a new conversation from the memory-mode view (opening context, the last 2 steps)
            restarts += 1
            restarted = True
            past = [t.observation_text for t in seat_turns[:k]]
            opening = codec.render(
                [{"role": "user", "content": memory_text(past, turn.observation_text, 2)}], True
            )
            assert list(turn.prompt_token_ids) == codec.encode(opening)[-budget:]
    assert restarts and extended and driver.stats.compressed_prompts == restarts
    stats = BuildStats()
    samples = build_samples(trajs, WIDE, stats)
    # a restart starts a new sample; between restarts the turns still make one sequence
    assert stats.split_sequences == restarts
    assert len(trajs) < len(samples) < stats.turns


async def test_truncate_ends_the_episode_at_the_budget_and_keeps_it(tokenizer: Any) -> None:
    whole, _ = await play(tokenizer, [3])
    budget = 1200
    (traj,), _ = await play(tokenizer, [3], max_prompt_tokens=budget, context_overflow="truncate")
    assert traj.metadata["truncated"] == "context_overflow"
    assert 0 < len(traj.turns) < len(whole[0].turns)
    assert max(len(t.prompt_token_ids) for t in traj.turns) <= budget


async def test_conversation_needs_the_policys_tokenizer(tokenizer: Any) -> None:
    driver = local_driver(
        RolloutConfig(prompt_mode="conversation"), tokenizer, scripted(tokenizer), lambda: {"p": 0}
    )
    driver.chat_codec = None  # as the rollout service would be, with no tokenizer of the policy
    with pytest.raises(ValueError, match=r"conversation.*tokenizer"):
        await driver.play([service_task(Task("werewolf_v1", "6p", 1, {0: "p"}), 0)])


def test_the_train_config_maps_the_prompt_mode() -> None:
    data: dict[str, Any] = {
        "name": "conv",
        "game": {"id": "werewolf_v1", "variant": "6p"},
        "policies": [{"id": "p", "seats": [0], "model": "tiny"}],
        "rollout": {"prompt": "conversation", "max_prompt_tokens": 2048},
    }
    config = rollout_config(TrainConfig.model_validate(data))
    assert (config.prompt_mode, config.max_prompt_tokens) == ("conversation", 2048)
    warm = warmstart_config(
        TrainConfig.model_validate({**data, "warmstart": {"bot": "heuristic", "steps": 10}})
    )
    assert warm is not None and (warm.prompt_mode, warm.max_prompt_tokens) == ("conversation", 2048)


@pytest.mark.parametrize("budget", [0, 1500])
def test_the_clone_learns_on_the_conversations_a_run_sends(tokenizer: Any, budget: int) -> None:
    """The warm start's (prompt, answer) pairs in the conversation mode: a seat's k-th prompt is its
    (k-1)-th prompt + the bot's answer ids + the continuation, and decodes to the chat template over the
    conversation with the bot's answers as the assistant turns, as the driver would send it had the policy
    answered as the bot; over a budget the conversation starts again (shorter prompts, never over it)."""
    cfg = WarmStartConfig(
        game_id="werewolf_v1", variant="6p", seats=(0, 1), bot="heuristic", episodes=2, steps=1,
        prompt_mode="conversation", max_prompt_tokens=budget,
    )  # fmt: skip
    pairs = iter(bot_pairs(cfg, tokenizer))
    codec = TokenizerCodec(tokenizer)
    bot = get_game("werewolf_v1").bots["heuristic"]
    chains = restarts = 0
    for game in range(cfg.episodes):
        last: dict[int, tuple[list[int], list[int]]] = {}
        history: dict[int, list[dict[str, str]]] = {}
        for turn in bot_turns(cfg, cfg.seed_offset + game, bot):
            prompt, response = next(pairs)
            seat = turn.seat
            if budget:
                assert len(prompt) <= budget
            if seat in last and prompt[: sum(map(len, last[seat]))] == [*last[seat][0], *last[seat][1]]:
                chains += 1
                history[seat] += [
                    {
                        "role": "assistant",
                        "content": tokenizer.decode(last[seat][1], skip_special_tokens=True),
                    },
                    {"role": "user", "content": new_lines(turn.past[-1], turn.observation)},
                ]
            else:  # a seat's first decision (the whole observation), or a restart over the budget
                restarts += seat in last
                view = memory_text(list(turn.past), turn.observation, 2) if seat in last else turn.observation
                history[seat] = [{"role": "user", "content": view}]
            if not budget:
                assert tokenizer.decode(prompt) == codec.render(history[seat], True)
            last[seat] = (prompt, response)
    assert next(pairs, None) is None
    assert chains > 8
    assert (restarts > 0) == bool(budget)


def test_a_local_train_run_trains_one_sample_per_seat_game(
    tmp_path: Path, tiny: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wolfpack train``'s run (``run_training``) with the tiny model sampling: the batch builder is
    spied on (it still builds the batch) to count turns and samples."""
    seen: list[BuildStats] = []
    real: Callable[..., Any] = build_samples  # what train.py calls

    def spy(trajectories: Any, config: BatchConfig, stats: BuildStats | None = None) -> Any:
        stats = stats if stats is not None else BuildStats()
        out = real(trajectories, config, stats)
        seen.append(stats)
        return out

    monkeypatch.setattr(train_module, "build_samples", spy)
    cfg = TrainConfig.model_validate(
        {
            "name": "conversation",
            "game": {"id": "werewolf_v1", "variant": "6p", "bot": "heuristic"},
            "policies": [{"id": "p", "seats": [0], "model": tiny, "lr": 1e-3}],
            "rollout": {"episodes_per_update": 4, "group_size": 2, "max_tokens": 8, "prompt": "conversation"},
            "batch": {"layout": "episode", "max_prompt_len": 8192, "max_response_len": 8192},
            "stream": {"name": f"wolfpack:test:conversation:{tmp_path.name}"},
            "train": {"updates": 1},
            "eval": {"every": 100, "episodes": 2},
        }
    )
    trainer, _ = run_training(cfg, tmp_path / "run", redis_url, tmp_path / "models")
    assert trainer.state.step == 1
    (stats,) = seen
    print(f"conversation run: {stats.turns} turns -> {stats.samples} samples, {stats.split_sequences} splits")
    assert stats.split_sequences == 0
    assert stats.samples == 4 < stats.turns  # one per seat-game: 4 games, seat 0 each
    (row,) = [r for r in trainer.metrics.rows() if "batch/samples" in r]
    assert (row["batch/turns"], row["batch/samples"], row["batch/split_sequences"]) == (stats.turns, 4, 0)
