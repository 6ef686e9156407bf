"""Bad requests map to gRPC status codes with a message that says what to fix."""

from __future__ import annotations

import grpc
import pytest

from wolfpack.v1 import common_pb2
from wolfpack.v1 import inference_service_pb2 as pb
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc

from .test_generate import chat  # type: ignore[import-not-found]


async def expect(call: object, code: grpc.StatusCode, words: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    assert err.value.code() == code, err.value.details()
    assert words in (err.value.details() or ""), err.value.details()


def tokens(ids: list[int], policy: str = "strict", **sampling: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        policy_id=policy,
        tokens=pb.TokenPrompt(token_ids=ids),
        sampling=common_pb2.SamplingParams(**sampling),  # type: ignore[arg-type]
    )


async def test_unknown_and_missing_policy(stub: pb_grpc.InferenceServiceStub) -> None:
    await expect(
        stub.Generate(chat("hi", "nope", max_tokens=4)), grpc.StatusCode.NOT_FOUND, "unknown policy 'nope'"
    )
    await expect(stub.Generate(chat("hi", "", max_tokens=4)), grpc.StatusCode.INVALID_ARGUMENT, "policy_id")


@pytest.mark.parametrize("max_tokens", [0, -3])
async def test_bad_max_tokens(stub: pb_grpc.InferenceServiceStub, max_tokens: int) -> None:
    await expect(
        stub.Generate(chat("hi", max_tokens=max_tokens)), grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"
    )


async def test_bad_sampling(stub: pb_grpc.InferenceServiceStub) -> None:
    await expect(
        stub.Generate(chat("hi", max_tokens=4, top_p=1.5)), grpc.StatusCode.INVALID_ARGUMENT, "top_p"
    )
    await expect(
        stub.Generate(chat("hi", max_tokens=4, temperature=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "temperature",
    )
    await expect(stub.Generate(chat("hi", max_tokens=4, top_k=-2)), grpc.StatusCode.INVALID_ARGUMENT, "top_k")
    stream = stub.GenerateStream(pb.GenerateStreamRequest(request=chat("hi", max_tokens=4, n=2)))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [c async for c in stream]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "n == 1" in (err.value.details() or "")


async def test_empty_prompts(stub: pb_grpc.InferenceServiceStub) -> None:
    none = pb.GenerateRequest(policy_id="tiny", sampling=common_pb2.SamplingParams(max_tokens=4))
    await expect(stub.Generate(none), grpc.StatusCode.INVALID_ARGUMENT, "prompt is empty")
    await expect(stub.Generate(tokens([], max_tokens=4)), grpc.StatusCode.INVALID_ARGUMENT, "prompt is empty")
    empty_chat = pb.GenerateRequest(
        policy_id="tiny", chat=pb.ChatPrompt(messages=[common_pb2.ChatMessage(role="user", content="")]),
        sampling=common_pb2.SamplingParams(max_tokens=4),
    )  # fmt: skip
    await expect(stub.Generate(empty_chat), grpc.StatusCode.INVALID_ARGUMENT, "prompt is empty")
    bad_role = pb.GenerateRequest(
        policy_id="tiny", chat=pb.ChatPrompt(messages=[common_pb2.ChatMessage(role="wizard", content="x")]),
        sampling=common_pb2.SamplingParams(max_tokens=4),
    )  # fmt: skip
    await expect(stub.Generate(bad_role), grpc.StatusCode.INVALID_ARGUMENT, "role")


async def test_oversized_prompts_without_compression(stub: pb_grpc.InferenceServiceStub) -> None:
    """The "strict" policy has compression off: beyond the model's 512 positions is an error."""
    await expect(
        stub.Generate(tokens([5] * 600, max_tokens=4)), grpc.StatusCode.INVALID_ARGUMENT, "512 positions"
    )
    await expect(
        stub.Generate(tokens([5] * 510, max_tokens=4)), grpc.StatusCode.INVALID_ARGUMENT, "max_tokens (4)"
    )
    long_chat = chat("The seer speaks. " * 400, "strict", max_tokens=4)
    await expect(stub.Generate(long_chat), grpc.StatusCode.INVALID_ARGUMENT, "positions")
    await expect(
        stub.Generate(tokens([10**6], max_tokens=4)), grpc.StatusCode.INVALID_ARGUMENT, "out of range"
    )
    ok = await stub.Generate(tokens([5] * 508, max_tokens=4))  # exactly fits
    assert len(ok.completions[0].token_ids) >= 1


async def test_bad_load_requests(stub: pb_grpc.InferenceServiceStub) -> None:
    await expect(
        stub.LoadPolicy(pb.LoadPolicyRequest(policy_id="brand-new", version=1)),
        grpc.StatusCode.INVALID_ARGUMENT, "needs a model_path",
    )  # fmt: skip
    await expect(stub.PushWeights(iter([])), grpc.StatusCode.INVALID_ARGUMENT, "no chunks")
    await expect(
        stub.PushWeights(iter([pb.PushWeightsRequest(policy_id="ghost", version=1, name="w", dtype="float32", shape=[1], data=b"\0\0\0\0")])),
        grpc.StatusCode.NOT_FOUND, "ghost",
    )  # fmt: skip
