"""The ``conversation`` prompt mode's token continuation (``prompts.continuation_ids``) with a real tokenizer:
the tiny model's byte-level BPE with its ChatML template, and the same tokenizer under a template that
adds a default system prompt when none is given (as SmolLM2's does) and one that rewrites earlier turns."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers", reason="the trainer extra is not installed")

from transformers import AutoTokenizer

from wolfpack_rollout.config import RolloutConfig
from wolfpack_rollout.prompts import (
    TemplateError,
    TokenizerCodec,
    continuation_ids,
    new_lines,
    opening_ids,
    opening_messages,
    render_messages,
)

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
SMOLLM2_LIKE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML that injects a default system message when the chat has none (SmolLM2-Instruct's behaviour)."""
FORGETFUL = (
    "{% for message in messages %}"
    "{% if message['role'] != 'assistant' or loop.last %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""A template that drops earlier answers (as reasoning templates drop earlier thinking): it cannot append."""

HEAD = "Rules: six players.\nYou are the seer."
LOG = "Log:\nnight 1 falls\nPlayer 3 is good.\nday 1: Player 2 says hi"
OBSERVATIONS = [
    f"{HEAD}\nLog:\nnight 1 falls\nNow: inspect someone",
    f"{HEAD}\n{LOG}\nNow: vote",
    f"{HEAD}\n{LOG}\nPlayer 4 was voted out\nNow: inspect",
]
ANSWERS = ["inspect 3", "vote 4", "inspect 2"]


@pytest.fixture(scope="module")
def chatml(tiny_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_dir)


def tokenizer_with(tiny_dir: Path, template: str) -> Any:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.chat_template = template
    return tok


def play(
    codec: TokenizerCodec, *, stop: Sequence[bool], system_prompt: str = ""
) -> tuple[list[list[int]], list[list[int]], list[Mapping[str, str]]]:
    """A seat's three decisions as the driver builds them: (prompts, answers, the whole conversation's
    messages). ``stop[i]``: answer i ends with ``<|im_end|>`` (finish STOP), else it was cut (LENGTH)."""
    eos = codec.tokenizer.convert_tokens_to_ids("<|im_end|>")
    history = opening_messages(OBSERVATIONS[0], system_prompt)
    prompts = [opening_ids(codec, history)]
    answers: list[list[int]] = []
    conversation = list(history)
    for i, answer in enumerate(ANSWERS):
        ids = codec.encode(answer) + ([eos] if stop[i] else [])
        answers.append(ids)
        conversation.append({"role": "assistant", "content": answer})
        if i + 1 == len(ANSWERS):
            break
        user = new_lines(OBSERVATIONS[i], OBSERVATIONS[i + 1])
        prompts.append([*prompts[-1], *ids, *continuation_ids(codec, history, ids, user)])
        history = [*history, {"role": "assistant", "content": answer}, {"role": "user", "content": user}]
        conversation.append({"role": "user", "content": user})
    return prompts, answers, conversation


@pytest.mark.parametrize("stop", [(True, True, True), (False, False, True), (True, False, True)])
def test_each_prompt_extends_the_last_and_is_the_template_over_the_conversation(
    chatml: Any, stop: tuple[bool, ...]
) -> None:
    codec = TokenizerCodec(chatml)
    prompts, answers, conversation = play(codec, stop=stop, system_prompt="Answer with one action.")
    for k in range(1, len(prompts)):
        assert prompts[k][: len(prompts[k - 1]) + len(answers[k - 1])] == [*prompts[k - 1], *answers[k - 1]]
    # an answer cut before <|im_end|> gets it added; one that stopped on it does not get a second one
    text = codec.render(conversation[:-1], True)
    assert chatml.decode(prompts[-1]) == text
    assert text.count("<|im_end|>") == len(conversation) - 1
    # ChatML's boundaries are special tokens: the ids are those of tokenising the whole text at once
    assert prompts[-1] == codec.encode(text)


def test_a_default_system_prompt_appears_once(tiny_dir: Path) -> None:
    """Templating only the new messages would add the default system prompt again before each of them."""
    codec = TokenizerCodec(tokenizer_with(tiny_dir, SMOLLM2_LIKE))
    prompts, answers, conversation = play(codec, stop=(True, False, True))
    whole = codec.tokenizer.decode(prompts[-1])
    assert whole == codec.render(conversation[:-1], True)
    assert whole.count(DEFAULT_SYSTEM) == 1
    for k in range(1, len(prompts)):
        assert prompts[k][: len(prompts[k - 1]) + len(answers[k - 1])] == [*prompts[k - 1], *answers[k - 1]]


def test_a_template_that_rewrites_earlier_turns_is_refused(tiny_dir: Path) -> None:
    codec = TokenizerCodec(tokenizer_with(tiny_dir, FORGETFUL))
    history = opening_messages(OBSERVATIONS[0])
    history += [{"role": "assistant", "content": "inspect 3"}, {"role": "user", "content": "Now: vote"}]
    with pytest.raises(TemplateError, match="does not extend a conversation"):
        continuation_ids(codec, history, codec.encode("vote 4"), "Now: inspect")


def test_the_new_user_message_is_what_is_new() -> None:
    assert (
        new_lines(OBSERVATIONS[0], OBSERVATIONS[1]) == "Player 3 is good.\nday 1: Player 2 says hi\nNow: vote"
    )
    assert new_lines(OBSERVATIONS[1], OBSERVATIONS[2]) == "Player 4 was voted out\nNow: inspect"
    # an unchanged view (nothing new): the instruction again, never an empty message
    assert new_lines(OBSERVATIONS[2], OBSERVATIONS[2]) == "Now: inspect"
    # ... also where the view ends with a newline, as every Werewolf observation does (its last line is empty)
    assert new_lines(OBSERVATIONS[2] + "\n", OBSERVATIONS[2] + "\n") == "Now: inspect"
    # nothing shared: all of it
    assert new_lines("other\ntext", OBSERVATIONS[0]) == OBSERVATIONS[0]


def test_the_mode_is_configurable_and_not_a_per_turn_render() -> None:
    assert RolloutConfig(prompt_mode="conversation").prompt_mode == "conversation"
    with pytest.raises(ValueError, match="'full', 'memory' or 'conversation'"):
        RolloutConfig(prompt_mode="chat")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="conversation prompts extend"):
        render_messages(OBSERVATIONS[0], [], [], mode="conversation", k=2)
