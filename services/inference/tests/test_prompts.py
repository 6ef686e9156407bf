"""Context-budget compression, <think> stripping and incremental text, on the real tiny tokenizer and
over gRPC."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from wolfpack.v1 import common_pb2
from wolfpack.v1 import inference_service_pb2 as pb
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc
from wolfpack_inference.prompts import (
    TRUNCATION_MARKER,
    PromptTooLong,
    TextCodec,
    TextTracker,
    compress_messages,
    render_chat,
    strip_think,
)


def chat_request(messages: list[tuple[str, str]], max_tokens: int = 8) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        policy_id="tiny",
        chat=pb.ChatPrompt(
            messages=[common_pb2.ChatMessage(role=r, content=c) for r, c in messages],
            add_generation_prompt=True,
        ),
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens),
    )


async def test_history_is_dropped_oldest_first(stub: pb_grpc.InferenceServiceStub, tiny_dir: Path) -> None:
    """Budget 200 tokens: old turns go, the system message and the latest user message stay."""
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    history = [("system", "You are player 3, a villager.")]
    for i in range(12):
        history += [
            ("user", f"Round {i}: Alice accuses Bob of lying again."),
            ("assistant", f"I vote {i % 5}."),
        ]
    history.append(("user", "Final vote now. Who is the wolf?"))
    resp = await stub.Generate(chat_request(history, max_tokens=8))
    assert resp.prompt_compressed
    assert len(resp.prompt_token_ids) + 8 <= 200
    text = tok.decode(list(resp.prompt_token_ids))
    assert text.startswith("<|im_start|>system\nYou are player 3, a villager.")
    assert "Final vote now. Who is the wolf?" in text
    assert "Round 0:" not in text and "Round 11:" in text  # newest history kept
    small = await stub.Generate(chat_request(history[:3], max_tokens=8))
    assert not small.prompt_compressed


async def test_long_message_is_cut_in_the_middle(stub: pb_grpc.InferenceServiceStub, tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    body = "START " + "the seer inspects Carol, " * 200 + " END"
    resp = await stub.Generate(chat_request([("system", "Be brief."), ("user", body)], max_tokens=8))
    assert resp.prompt_compressed and len(resp.prompt_token_ids) + 8 <= 200
    text = tok.decode(list(resp.prompt_token_ids))
    assert "Be brief." in text and "START" in text and "END" in text and TRUNCATION_MARKER in text


def test_compression_rule_on_real_tokenizer(tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)

    def count(m: object) -> int:
        return len(render_chat(tok, m))  # type: ignore[arg-type]

    msgs = [
        {"role": "system", "content": "rules " * 5},
        {"role": "user", "content": "old question " * 10},
        {"role": "assistant", "content": "old answer " * 10},
        {"role": "user", "content": "latest question"},
    ]
    kept, changed = compress_messages(msgs, count, count(msgs) - 5)
    assert changed and [m["content"] for m in kept] == [
        msgs[0]["content"],
        msgs[2]["content"],
        msgs[3]["content"],
    ]
    kept, _ = compress_messages(msgs, count, count([msgs[0], msgs[3]]))
    assert kept == [msgs[0], msgs[3]]
    with pytest.raises(PromptTooLong):
        compress_messages(msgs, count, 3)


@pytest.mark.parametrize(
    "body", ["the seer inspects Carol, " * 300, "预言家查验了三号玩家，他是狼人。" * 120]
)
def test_a_long_message_is_cut_in_token_space_with_few_renders(tiny_dir: Path, body: str) -> None:
    """With a codec the cut is made on the message's tokens (one tokenization, a render for the room and
    one to check) instead of a binary search that renders the whole chat at every step; same contract:
    it fits, keeps both ends, marks the cut, and leaves no broken character at the seams."""
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    renders = {"tokens": 0, "chars": 0}

    def counter(kind: str):  # type: ignore[no-untyped-def]
        def count(m: object) -> int:
            renders[kind] += 1
            return len(render_chat(tok, m))  # type: ignore[arg-type]

        return count

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "START " + body + " END"}]
    budget = 150
    by_tokens, changed = compress_messages(msgs, counter("tokens"), budget, TextCodec.of(tok))
    by_chars, _ = compress_messages(msgs, counter("chars"), budget)
    for kept in (by_tokens, by_chars):
        content = kept[1]["content"]
        assert len(render_chat(tok, kept)) <= budget
        assert content.startswith("START") and content.endswith("END") and TRUNCATION_MARKER in content
        assert "\ufffd" not in content and kept[0] == msgs[0]
    assert changed and renders["tokens"] <= 2 + 3  # whole chat twice, room, at most 3 checks
    assert renders["tokens"] < renders["chars"]
    # as much kept as the character search keeps, within a few tokens at the seams
    assert len(render_chat(tok, by_tokens)) >= len(render_chat(tok, by_chars)) - 4


def test_strip_think() -> None:
    assert strip_think("<think>plan: vote 2</think> I vote for Bob.") == "I vote for Bob."
    assert strip_think("reasoning...</think>Answer") == "Answer"  # template opened <think> in the prompt
    assert strip_think("Sure. <think>unfinished") == "Sure. "
    assert strip_think("no tags") == "no tags"


def test_text_tracker_streams_without_retracting(tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    ids = tok.encode("I vote for Carol. STOP and more")
    tracker = TextTracker(lambda t: tok.decode(t, skip_special_tokens=True), stop=("STOP",))
    streamed = ""
    for t in ids:
        stopped = tracker.add(t)
        streamed += tracker.delta(final=stopped)
        if stopped:
            break
    assert tracker.stopped and streamed == tracker.text == "I vote for Carol. "


async def test_thinker_policy_keeps_ids(stub: pb_grpc.InferenceServiceStub) -> None:
    """strip_think changes text only: ids and logprobs are the same as without it."""
    req = chat_request([("user", "Think, then vote.")], max_tokens=10)
    req.sampling.logprobs = True
    plain = await stub.Generate(req)
    req.policy_id = "thinker"
    thinker = await stub.Generate(req)
    assert list(plain.completions[0].token_ids) == list(thinker.completions[0].token_ids)
    assert thinker.completions[0].text == strip_think(plain.completions[0].text)


@pytest.mark.parametrize(
    ("last_role", "flag", "expected"),
    [
        ("user", None, True),  # unset: the assistant answers
        ("user", False, False),  # explicit false is respected (it used to be read as "unset")
        ("assistant", None, False),  # unset after an assistant message: continue it
        ("assistant", True, True),  # explicit true after an assistant message
    ],
)
async def test_add_generation_prompt_has_presence(
    stub: pb_grpc.InferenceServiceStub, tiny_dir: Path, last_role: str, flag: bool | None, expected: bool
) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    msgs = [("user", "Who is the wolf?"), ("assistant", "I think Carol."), (last_role, "Why Carol?")]
    prompt = pb.ChatPrompt(messages=[common_pb2.ChatMessage(role=r, content=c) for r, c in msgs])
    if flag is not None:
        prompt.add_generation_prompt = flag
    assert prompt.HasField("add_generation_prompt") == (flag is not None)
    # same field number and wire type as the old plain bool; an explicit false now travels (tag 0x10, 0)
    assert pb.ChatPrompt(add_generation_prompt=False).SerializeToString() == b"\x10\x00"
    req = pb.GenerateRequest(policy_id="tiny", chat=prompt, sampling=common_pb2.SamplingParams(max_tokens=2))
    resp = await stub.Generate(req)
    as_dicts = [{"role": r, "content": c} for r, c in msgs]
    assert list(resp.prompt_token_ids) == render_chat(tok, as_dicts, expected)
    assert render_chat(tok, as_dicts, True) != render_chat(tok, as_dicts, False)
