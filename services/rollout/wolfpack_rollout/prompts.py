"""Prompt rendering for policy turns: pure functions of the observations a seat has received.

Three modes (``RolloutConfig.prompt_mode``):

* ``full`` — the environment's own rendered observation (rules, role, every visible event so far,
  the instruction), as chat messages. Prompts grow with the game; the inference service compresses
  over-budget ones.
* ``memory`` — step-independent (as verl-agent/GiGPO train): the *opening context* (the lines the seat's
  first observation and the current one share from the top: rules, role, briefing), a marker for what is
  left out, then only the lines that are new since the seat's k-th last decision (recent events and the
  current instruction). Line-based and game agnostic: it relies only on observations being rendered as
  "stable header, growing log, instruction", which every Wolfpack game does.
* ``conversation`` — one growing chat per (episode, seat), as verl's agent loop trains: the first
  decision is prompted with the whole observation, each later one with the previous prompt, the answer
  as sampled, and a user message of only the lines new since the seat's previous observation. The ids
  are built by appending (``continuation_ids``), so turn k's prompt starts with turn k-1's prompt and
  answer token for token and the trainer's ``batch.layout: episode`` makes one sample of the seat's game.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from wolfpack.v1 import common_pb2

OMITTED = "[... {n} earlier lines omitted ...]"


def common_prefix_lines(a: Sequence[str], b: Sequence[str]) -> int:
    """Number of leading lines ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def memory_text(past: Sequence[str], current: str, k: int) -> str:
    """The ``memory``-mode observation text. ``past`` are this seat's earlier observation texts (oldest
    first, one per earlier decision), ``current`` the one to answer now, ``k >= 1`` the memory length.
    With fewer than ``k`` earlier decisions everything since the start is recent, so ``current`` is
    returned whole."""
    if not past or k > len(past):
        return current
    cur = current.split("\n")
    head = common_prefix_lines(past[0].split("\n"), cur)
    start = max(head, common_prefix_lines(past[-k].split("\n"), cur))
    lines = cur[:head]
    if start > head:
        lines.append(OMITTED.format(n=start - head))
    lines.extend(cur[start:])
    return "\n".join(lines)


def render_messages(
    observation_text: str,
    env_messages: Sequence[common_pb2.ChatMessage],
    past: Sequence[str],
    *,
    mode: str,
    k: int,
    system_prompt: str = "",
) -> list[common_pb2.ChatMessage]:
    """Chat messages for one policy turn (``full`` or ``memory``; a ``conversation`` prompt is not a
    function of one turn's observations: the driver grows it, see ``continuation_ids``)."""
    if mode == "conversation":
        raise ValueError(
            "conversation prompts extend the seat's previous prompt and answer; render_messages "
            "renders one turn (full or memory)"
        )
    out: list[common_pb2.ChatMessage] = []
    if system_prompt:
        out.append(common_pb2.ChatMessage(role="system", content=system_prompt))
    if mode == "full":
        if env_messages:
            out.extend(env_messages)
        else:
            out.append(common_pb2.ChatMessage(role="user", content=observation_text))
        return out
    out.append(common_pb2.ChatMessage(role="user", content=memory_text(past, observation_text, k)))
    return out


# --- conversation mode ----------------------------------------------------------------------------------

Message = Mapping[str, str]
"""A chat message as the chat template reads it: ``{"role": ..., "content": ...}``."""

ASSISTANT_PLACEHOLDER = "\x1fwolfpack-assistant-turn\x1f"
"""Stands in for an answer when the template is asked where an answer ends and the next message starts:
the sampled answer is never rendered or tokenised again, so its text cannot shift the cut."""


class ChatCodec(Protocol):
    """The policy's chat template and tokenizer, split so that a conversation can grow by appending: the
    ``conversation`` prompt mode templates text (``render``) and tokenises only what is new (``encode``)."""

    def render(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        """The chat template over ``messages`` as text."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of templated text (no special tokens added: the template wrote them)."""
        ...


class TokenizerCodec:
    """``ChatCodec`` over a tokenizer with a chat template (a transformers tokenizer: ``apply_chat_template``
    and ``__call__``): the template as text, and that text's ids with no special tokens added (the template
    wrote them). What the trainer passes the driver, and what the tests template with."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def render(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=False
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer(text, add_special_tokens=False)["input_ids"]]


class TemplateError(ValueError):
    """The chat template does not grow a conversation by appending to it (it rewrites earlier turns)."""


def new_lines(previous: str, current: str) -> str:
    """The user message of a later ``conversation`` turn: the lines of ``current`` after the lines it
    shares from the top with ``previous`` (new events and the instruction). An unchanged view yields its
    last non-blank line (the instruction) rather than nothing, so the policy is still asked something (a
    Werewolf observation ends with a newline: its last line is empty). The verl agent loop's conversations
    (``wolfpack_trainer.learners.verl.agent_loop``) take their user messages from here too, so a policy
    trained there and evaluated in this mode reads the same messages."""
    cur = current.split("\n")
    head = common_prefix_lines(previous.split("\n"), cur)
    if head >= len(cur):
        return next((line for line in reversed(cur) if line.strip()), current)
    return "\n".join(cur[head:])


def opening_messages(observation_text: str, system_prompt: str = "") -> list[Message]:
    """A seat's first ``conversation`` messages: the system prompt if any, then the observation."""
    out: list[Message] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    out.append({"role": "user", "content": observation_text})
    return out


def opening_ids(codec: ChatCodec, messages: Sequence[Message]) -> list[int]:
    """The first prompt of a conversation: the templated messages with the generation prompt."""
    return codec.encode(codec.render(messages, True))


def continuation_ids(
    codec: ChatCodec, history: Sequence[Message], response_ids: Sequence[int], user_text: str
) -> list[int]:
    """What follows ``history``'s prompt ids and the answer's ``response_ids`` so that the result is the
    template over ``history + [assistant answer, user user_text]`` with the generation prompt.

    Why by difference of rendered text: templates add text that depends on the whole message list (a
    default system prompt when none is given, as SmolLM2's does), so the suffix of the conversation is
    the template over the longer list after the placeholder answer, tokenised alone. The answer's own
    ids stay as sampled; the end-of-turn text the template puts after an answer (``<|im_end|>\\n`` in
    ChatML) is split into the ids the answer already ends with (an answer that stopped on
    ``<|im_end|>``) and the ones added. Raises ``TemplateError`` when the template renders earlier turns
    differently once an answer follows (then no prompt can extend the previous one)."""
    answered = [*history, {"role": "assistant", "content": ASSISTANT_PLACEHOLDER}]
    prompt_text = codec.render(history, True)
    closed = codec.render(answered, False)
    longer = codec.render([*answered, {"role": "user", "content": user_text}], True)
    before, found, close = closed.partition(ASSISTANT_PLACEHOLDER)
    before_longer, _, after = longer.partition(ASSISTANT_PLACEHOLDER)
    if not found or before != prompt_text or before_longer != prompt_text or not after.startswith(close):
        raise TemplateError(
            "the chat template does not extend a conversation by appending (the templated prompt of a "
            "seat's earlier turns changes once its answer and a new message follow); the conversation "
            "prompt mode needs a template that appends (ChatML does)"
        )
    close_ids = codec.encode(close) if close else []
    done = 0  # the longest start of the end-of-turn ids the answer already ends with
    for k in range(min(len(close_ids), len(response_ids)), 0, -1):
        if list(response_ids[-k:]) == close_ids[:k]:
            done = k
            break
    return [*close_ids[done:], *codec.encode(after[len(close) :])]


@dataclass(frozen=True)
class SeatChat:
    """A seat's conversation after its latest answer: what its next prompt extends."""

    messages: list[Message]
    """Up to the user message answered last."""
    answer: str
    """The answer's text: its message in the templates the next suffix is cut from (ids: ``response``)."""
    context: list[int]
    """The answered prompt's ids + the answer's ids, as sampled."""
    response: list[int]
    observation: str
    """The observation text answered last (the next user message is what is new after it)."""


def conversation_turn(
    codec: ChatCodec,
    chat: SeatChat | None,
    observation: str,
    past: Sequence[str],
    *,
    budget: int,
    memory_steps: int,
    system_prompt: str = "",
    truncate: bool = False,
) -> tuple[list[Message], list[int], bool] | None:
    """A seat's next ``conversation`` prompt: (messages, prompt ids, restarted). ``chat`` is the seat's
    conversation so far (None before its first decision), ``past`` its earlier observation texts.

    The first decision sends the whole observation; a later one extends ``chat`` (``continuation_ids``).
    Over ``budget`` tokens (0: none) a continued conversation either ends (``truncate``: None) or starts
    again from the ``memory``-mode view of the observation (opening context, what is new since the
    seat's ``memory_steps``-th last decision: short enough to leave the new conversation room), and a first
    prompt keeps its last ``budget`` ids. One function for the rollout driver and the warm start's clone,
    so that a clone learns on exactly the prompts a run sends. Raises what the template or tokenizer raise
    (``TemplateError`` for a template that cannot append)."""
    restarted = False
    if chat is not None:
        user = new_lines(chat.observation, observation)
        messages: list[Message] = [
            *chat.messages,
            {"role": "assistant", "content": chat.answer},
            {"role": "user", "content": user},
        ]
        ids = [*chat.context, *continuation_ids(codec, chat.messages, chat.response, user)]
        if not budget or len(ids) <= budget:
            return messages, ids, False
        if truncate:
            return None
        restarted = True
    text = memory_text(past, observation, memory_steps) if restarted else observation
    messages = opening_messages(text, system_prompt)
    ids = opening_ids(codec, messages)
    return messages, ids[-budget:] if budget else ids, restarted
