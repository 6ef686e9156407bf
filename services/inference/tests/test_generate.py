"""Generate over real gRPC on a tiny random Qwen2: determinism, logprobs, batching, sampling, streaming."""

from __future__ import annotations

import asyncio

import pytest
import torch

from wolfpack.v1 import common_pb2
from wolfpack.v1 import inference_service_pb2 as pb
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc
from wolfpack_inference.policies import PolicyRegistry


def chat(text: str, policy: str = "tiny", **sampling: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        policy_id=policy,
        chat=pb.ChatPrompt(
            messages=[common_pb2.ChatMessage(role="user", content=text)], add_generation_prompt=True
        ),
        sampling=common_pb2.SamplingParams(**sampling),  # type: ignore[arg-type]
    )


PROMPTS = ["Bob says: vote Carol.", "Who is the seer? " * 3, "Propose a split of 100 coins.", "Trust me."]


async def test_greedy_is_deterministic(stub: pb_grpc.InferenceServiceStub) -> None:
    a = await stub.Generate(chat(PROMPTS[0], max_tokens=12, temperature=0, logprobs=True))
    b = await stub.Generate(chat(PROMPTS[0], max_tokens=12, temperature=0, logprobs=True))
    ca, cb = a.completions[0], b.completions[0]
    assert list(ca.token_ids) == list(cb.token_ids) and len(ca.token_ids) > 0
    assert list(ca.logprobs) == list(cb.logprobs)
    assert a.policy.policy_id == "tiny" and a.policy.version == 0
    assert a.usage.prompt_tokens == len(a.prompt_token_ids)
    assert a.usage.completion_tokens == len(ca.token_ids)
    assert ca.finish_reason in (common_pb2.FINISH_REASON_LENGTH, common_pb2.FINISH_REASON_STOP)


async def test_logprobs_match_teacher_forced_forward(
    stub: pb_grpc.InferenceServiceStub, registry: PolicyRegistry
) -> None:
    """The reported logprob of each sampled token equals log_softmax(logits / T) of a fresh forward pass
    over prompt + response (float32) at the request's temperature (T = 1 for greedy), before top-k: the
    logprob convention of trajectory.proto, over gRPC, for greedy, sampled and batched requests."""
    temps = [0.0, 1.3, 0.7, 1.0]
    reqs = [chat(p, max_tokens=10, temperature=t, top_k=k, seed=3, logprobs=True)
            for p, t, k in zip(PROMPTS, temps, [0, 50, 0, 5], strict=True)]  # fmt: skip
    responses = await asyncio.gather(*[stub.Generate(r) for r in reqs])
    model = registry.get("tiny").backend.torch_model  # type: ignore[attr-defined]
    for resp, t in zip(responses, temps, strict=True):
        c = resp.completions[0]
        ids = torch.tensor([list(resp.prompt_token_ids) + list(c.token_ids)])
        with torch.no_grad():
            logp = (model(ids).logits.float() / (t or 1.0)).log_softmax(-1)[0]
        start = len(resp.prompt_token_ids) - 1
        ref = torch.stack([logp[start + j, t] for j, t in enumerate(c.token_ids)])
        assert len(c.logprobs) == len(c.token_ids)
        assert torch.allclose(ref, torch.tensor(list(c.logprobs)), atol=1e-4), (ref, list(c.logprobs))


async def test_batched_and_single_agree(stub: pb_grpc.InferenceServiceStub) -> None:
    singles = [await stub.Generate(chat(p, max_tokens=10, temperature=0, logprobs=True)) for p in PROMPTS]
    batched = await asyncio.gather(
        *[stub.Generate(chat(p, max_tokens=10, temperature=0, logprobs=True)) for p in PROMPTS]
    )
    for s, b in zip(singles, batched, strict=True):
        assert list(s.completions[0].token_ids) == list(b.completions[0].token_ids)
        assert (
            max(abs(x - y) for x, y in zip(s.completions[0].logprobs, b.completions[0].logprobs, strict=True))
            < 1e-4
        )


async def test_seeded_sampling_is_reproducible_and_n_differs(stub: pb_grpc.InferenceServiceStub) -> None:
    req = chat(PROMPTS[1], max_tokens=12, temperature=1.0, top_p=0.95, seed=42, n=3)
    a, b = await asyncio.gather(stub.Generate(req), stub.Generate(req))
    assert len(a.completions) == 3
    assert [list(c.token_ids) for c in a.completions] == [list(c.token_ids) for c in b.completions]
    assert len({tuple(c.token_ids) for c in a.completions}) > 1  # n samples are distinct draws
    c = await stub.Generate(chat(PROMPTS[1], max_tokens=12, temperature=1.0, top_p=0.95, seed=43, n=3))
    assert [list(x.token_ids) for x in c.completions] != [list(x.token_ids) for x in a.completions]
    assert a.usage.completion_tokens == sum(len(x.token_ids) for x in a.completions)


async def test_token_prompt_equals_chat_prompt(stub: pb_grpc.InferenceServiceStub) -> None:
    a = await stub.Generate(chat(PROMPTS[2], max_tokens=8, temperature=0))
    b = await stub.Generate(
        pb.GenerateRequest(
            policy_id="tiny",
            tokens=pb.TokenPrompt(token_ids=a.prompt_token_ids),
            sampling=common_pb2.SamplingParams(max_tokens=8),
        )
    )
    assert list(b.prompt_token_ids) == list(a.prompt_token_ids)
    assert list(b.completions[0].token_ids) == list(a.completions[0].token_ids)
    assert b.completions[0].text == a.completions[0].text


async def test_stop_string_cuts_text_but_keeps_tokens(stub: pb_grpc.InferenceServiceStub) -> None:
    free = (await stub.Generate(chat(PROMPTS[0], max_tokens=16, temperature=0))).completions[0]
    assert len(free.text) > 4
    stop = free.text[2:4]
    cut = (await stub.Generate(chat(PROMPTS[0], max_tokens=16, temperature=0, stop=[stop]))).completions[0]
    assert cut.finish_reason == common_pb2.FINISH_REASON_STOP
    assert cut.text == free.text[: free.text.find(stop)]
    assert list(free.token_ids[: len(cut.token_ids)]) == list(cut.token_ids)
    assert len(cut.token_ids) < len(free.token_ids)


async def test_stream_matches_unary(stub: pb_grpc.InferenceServiceStub) -> None:
    req = chat(PROMPTS[3], max_tokens=12, temperature=0, logprobs=True)
    unary = await stub.Generate(req)
    chunks = [c async for c in stub.GenerateStream(pb.GenerateStreamRequest(request=req))]
    assert list(chunks[0].prompt_token_ids) == list(unary.prompt_token_ids)
    assert [t for c in chunks for t in c.token_ids] == list(unary.completions[0].token_ids)
    assert "".join(c.text for c in chunks) == unary.completions[0].text
    assert chunks[-1].finish_reason == unary.completions[0].finish_reason
    assert all(c.policy.version == 0 for c in chunks)
    streamed_lp = [x for c in chunks for x in c.logprobs]
    assert max(abs(a - b) for a, b in zip(streamed_lp, unary.completions[0].logprobs, strict=True)) < 1e-4


async def test_list_policies(stub: pb_grpc.InferenceServiceStub) -> None:
    resp = await stub.ListPolicies(pb.ListPoliciesRequest())
    by_id = {p.policy.policy_id: p for p in resp.policies}
    assert set(by_id) == {"tiny", "strict", "thinker"}
    assert by_id["tiny"].backend == "transformers" and by_id["tiny"].context_budget == 200
    assert by_id["strict"].context_budget == 512


async def test_cancelled_calls_do_not_break_the_service(
    stub: pb_grpc.InferenceServiceStub, registry: PolicyRegistry
) -> None:
    """A deadline hit mid-generation and a stream dropped by its client abort their rows; the batcher
    keeps serving. The first call's decode steps are held until its deadline has passed, so it surely
    hits it mid-generation, however fast the machine decodes 400 tokens."""
    import threading

    import grpc

    passed = threading.Event()

    def hold(_module: object, _args: object, kwargs: dict[str, torch.Tensor]) -> None:
        if kwargs["input_ids"].shape[1] == 1:  # decode steps wait (bounded) until the deadline passed
            passed.wait(120)

    model = registry.get("strict").backend.torch_model  # type: ignore[attr-defined]
    handle = model.register_forward_pre_hook(hold, with_kwargs=True)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Generate(chat(PROMPTS[0], "strict", max_tokens=400, temperature=0), timeout=0.5)
    finally:
        passed.set()
        handle.remove()
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    call = stub.GenerateStream(pb.GenerateStreamRequest(request=chat(PROMPTS[1], "strict", max_tokens=400)))
    first = await call.read()
    assert len(first.token_ids) == 1
    call.cancel()
    after = await stub.Generate(chat(PROMPTS[0], max_tokens=4, temperature=0))
    assert len(after.completions[0].token_ids) >= 1
