"""Prompt rendering for policy turns: pure functions of the observations a seat has received.

Two modes (``RolloutConfig.prompt_mode``):

* ``full`` — the environment's own rendered observation (rules, role, every visible event so far,
  the instruction), as chat messages. Prompts grow with the game; the inference service compresses
  over-budget ones.
* ``memory`` — step-independent (as verl-agent/GiGPO train): the *opening context* (the lines the seat's
  first observation and the current one share from the top: rules, role, briefing), a marker for what is
  left out, then only the lines that are new since the seat's k-th last decision (recent events and the
  current instruction). Line-based and game agnostic: it relies only on observations being rendered as
  "stable header, growing log, instruction", which every Wolfpack game does.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    """Chat messages for one policy turn."""
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
