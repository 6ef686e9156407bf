"""Prompt modes, on hand-made observation texts."""

from __future__ import annotations

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from wolfpack.v1 import common_pb2
from wolfpack_rollout.config import RolloutConfig
from wolfpack_rollout.prompts import OMITTED, common_prefix_lines, memory_text, render_messages

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


def test_memory_when_the_past_observation_is_a_prefix_of_the_current_one() -> None:
    # the log only grew (no instruction line changed): every line of the old observation is shared
    assert memory_text(["rules\nlog 1"], "rules\nlog 1\nlog 2", 1) == "rules\nlog 1\nlog 2"
    # hand-computed: opening context = 1 line ("rules"); the previous observation shares 3 lines, so the
    # 2 lines between them are omitted and only "log 3" is new
    past = ["rules\nnow: A", "rules\nlog 1\nlog 2"]
    assert memory_text(past, "rules\nlog 1\nlog 2\nlog 3", 1) == f"rules\n{OMITTED.format(n=2)}\nlog 3"


@settings(max_examples=300)
@given(
    st.lists(st.sampled_from(["a", "b", "c", ""]), max_size=6),
    st.lists(st.sampled_from(["a", "b", "c", ""]), max_size=6),
)
def test_common_prefix_lines_matches_an_independent_count(a: list[str], b: list[str]) -> None:
    # second implementation, by definition: the longest n with equal n-line heads
    assert common_prefix_lines(a, b) == max(n for n in range(min(len(a), len(b)) + 1) if a[:n] == b[:n])
    assert common_prefix_lines(a, a + b) == len(a), "a sequence shares all of itself with its extension"


def test_full_mode_from_a_yaml_config() -> None:
    """The mode string read from a YAML file is equal to, not the same object as, the literal."""
    cfg = RolloutConfig.from_mapping(yaml.safe_load("prompt_mode: full\nmemory_steps: 1\n"))
    env_msgs = [common_pb2.ChatMessage(role="user", content=OBS[2])]
    out = render_messages(OBS[2], env_msgs, OBS[:2], mode=cfg.prompt_mode, k=cfg.memory_steps)
    assert [(m.role, m.content) for m in out] == [("user", OBS[2])], (
        "the whole observation, not the memory cut"
    )
    mem = RolloutConfig.from_mapping(yaml.safe_load("prompt_mode: memory\nmemory_steps: 1\n"))
    out = render_messages(OBS[2], env_msgs, OBS[:2], mode=mem.prompt_mode, k=mem.memory_steps)
    assert OMITTED.format(n=1) in out[0].content
