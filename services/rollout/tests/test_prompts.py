"""Prompt modes, on hand-made observation texts."""

from __future__ import annotations

from wolfpack.v1 import common_pb2
from wolfpack_rollout.prompts import OMITTED, memory_text, render_messages

HEAD = "Rules: six players.\nYou are the seer."
OBS = [
    f"{HEAD}\nLog:\nnight 1 falls\nNow: inspect someone",
    f"{HEAD}\nLog:\nnight 1 falls\nday 1: seat 2 speaks\nNow: vote",
    f"{HEAD}\nLog:\nnight 1 falls\nday 1: seat 2 speaks\nseat 4 was voted out\nnight 2 falls\nNow: inspect",
]


def test_memory_keeps_the_opening_context_and_what_is_new_since_k_decisions() -> None:
    # k = 1: only what came after the previous observation's shared lines
    assert memory_text(OBS[:2], OBS[2], 1) == (
        f"{HEAD}\nLog:\nnight 1 falls\n{OMITTED.format(n=1)}\nseat 4 was voted out\nnight 2 falls\nNow: inspect"
    )
    # k = 2: since the first decision (the opening context already reaches that far: nothing omitted)
    assert memory_text(OBS[:2], OBS[2], 2) == OBS[2]
    # fewer past decisions than k: the whole observation
    assert memory_text(OBS[:1], OBS[1], 3) == OBS[1]
    assert memory_text([], OBS[0], 1) == OBS[0]


def test_full_mode_uses_the_environment_messages_and_a_system_prompt() -> None:
    env_msgs = [common_pb2.ChatMessage(role="user", content=OBS[2])]
    full = render_messages(OBS[2], env_msgs, OBS[:2], mode="full", k=1, system_prompt="Play well.")
    assert [(m.role, m.content) for m in full] == [("system", "Play well."), ("user", OBS[2])]
    mem = render_messages(OBS[2], env_msgs, OBS[:2], mode="memory", k=1)
    assert [m.role for m in mem] == ["user"] and OMITTED.format(n=1) in mem[0].content
    assert render_messages("obs", [], [], mode="full", k=1)[0].content == "obs"
