"""The one error mapping (``wolfpack.errors`` + ``rpc.ErrorInterceptor``), over a real server: a
``ServiceError`` ends any kind of call with its own status and message, before or after a stream sent
responses; anything else ends it INTERNAL without its message; batch items get the same code and message
as a ``google.rpc.Status``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from wolfpack import rpc
from wolfpack.errors import MAX_MESSAGE_CHARS, ServiceError, code_of, to_status
from wolfpack.settings import load_settings
from wolfpack.v1 import inference_service_pb2 as inf_pb
from wolfpack.v1 import inference_service_pb2_grpc as inf_grpc
from wolfpack.v1 import reward_service_pb2 as pb
from wolfpack.v1 import reward_service_pb2_grpc as pb_grpc


class Missing(ServiceError):
    code = "NOT_FOUND"  # a service's vocabulary may name the status


class Broken(pb_grpc.RewardServiceServicer, inf_grpc.InferenceServiceServicer):
    async def Score(self, request: pb.ScoreRequest, context: Any) -> pb.ScoreResponse:
        raise Missing("no such spec")

    async def ListRewardSpecs(self, request: pb.ListRewardSpecsRequest, context: Any) -> Any:
        raise RuntimeError("secret /etc/path")

    async def GenerateBatch(self, request: inf_pb.GenerateBatchRequest, context: Any) -> AsyncIterator[Any]:
        yield inf_pb.GenerateBatchResponse()
        raise ServiceError("too late", grpc.StatusCode.FAILED_PRECONDITION)

    async def Generate(self, request: inf_pb.GenerateRequest, context: Any) -> Any:
        # a message quoting a huge hostile input, as multi-byte text (percent-encoded x3 on the wire)
        raise ServiceError("bad option value: " + "\u72fc" * 20_000, grpc.StatusCode.INVALID_ARGUMENT)

    async def PushWeights(self, request_iterator: AsyncIterator[Any], context: Any) -> Any:
        async for _ in request_iterator:
            raise ServiceError("bad chunk", grpc.StatusCode.INVALID_ARGUMENT)
        return inf_pb.PushWeightsResponse()


@pytest.fixture
async def target() -> AsyncIterator[str]:
    def register(server: grpc.aio.Server) -> list[str]:
        pb_grpc.add_RewardServiceServicer_to_server(Broken(), server)
        inf_grpc.add_InferenceServiceServicer_to_server(Broken(), server)
        return ["wolfpack.v1.RewardService", "wolfpack.v1.InferenceService"]

    server = await rpc.start_server("reward", register, load_settings(), "127.0.0.1:0")
    yield f"127.0.0.1:{server.port}"
    await server.stop(0)


async def test_service_errors_become_their_status_on_every_call_kind(target: str) -> None:
    async with rpc.channel(target, load_settings(rpc_timeout_s=20)) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pb_grpc.RewardServiceStub(ch).Score(pb.ScoreRequest())
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.NOT_FOUND, "no such spec")

        call = inf_grpc.InferenceServiceStub(ch).GenerateBatch(inf_pb.GenerateBatchRequest(), timeout=20)
        got = []
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for msg in call:
                got.append(msg)
        assert len(got) == 1 and err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

        async def chunks() -> AsyncIterator[inf_pb.PushWeightsRequest]:
            yield inf_pb.PushWeightsRequest(policy_id="p")

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await inf_grpc.InferenceServiceStub(ch).PushWeights(chunks(), timeout=20)
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "bad chunk")


async def test_a_bug_is_internal_without_its_message(target: str, caplog: pytest.LogCaptureFixture) -> None:
    async with rpc.channel(target, load_settings(rpc_timeout_s=20)) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pb_grpc.RewardServiceStub(ch).ListRewardSpecs(pb.ListRewardSpecsRequest())
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in (err.value.details() or "") and "RuntimeError" in (err.value.details() or "")
    assert any("secret /etc/path" in str(r.exc_info) for r in caplog.records if r.exc_info)  # logged


async def test_a_huge_message_keeps_its_status(target: str) -> None:
    """Uncut, this message would be ~180 KB in the status trailer and the client would see
    RESOURCE_EXHAUSTED (a retryable-looking code) instead of INVALID_ARGUMENT."""
    async with rpc.channel(target, load_settings(rpc_timeout_s=20)) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await inf_grpc.InferenceServiceStub(ch).Generate(inf_pb.GenerateRequest(), timeout=20)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details() or ""
    assert details.startswith("bad option value: \u72fc") and details.endswith("[cut: 20018 characters]")
    assert len(details) == MAX_MESSAGE_CHARS


def test_short_messages_are_not_cut() -> None:
    exact = "x" * MAX_MESSAGE_CHARS
    assert to_status(ServiceError(exact)).message == exact
    assert to_status(ServiceError(exact + "y")).message.endswith(f"[cut: {MAX_MESSAGE_CHARS + 1} characters]")


def test_batch_items_get_the_same_code_and_message() -> None:
    status = to_status(Missing("no such spec"))
    assert code_of(status) == grpc.StatusCode.NOT_FOUND and status.message == "no such spec"
    assert code_of(to_status(KeyError("x"))) == grpc.StatusCode.INTERNAL


async def test_bytes_that_are_no_message_are_invalid_argument_on_every_call_kind(target: str) -> None:
    """Raw bytes that do not parse as the method's request (a hostile or broken client) answer
    INVALID_ARGUMENT before any handler runs, not UNKNOWN "Unexpected DecodeError" from inside gRPC."""
    garbage = b"\xff\xff\xff"
    async with rpc.channel(target, load_settings(rpc_timeout_s=20)) as ch:
        unary = ch.unary_unary("/wolfpack.v1.RewardService/Score")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await unary(garbage, timeout=20)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid message" in (err.value.details() or "")

        server_stream = ch.unary_stream("/wolfpack.v1.InferenceService/GenerateBatch")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in server_stream(garbage, timeout=20):
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        async def chunks() -> AsyncIterator[bytes]:
            yield garbage

        client_stream = ch.stream_unary("/wolfpack.v1.InferenceService/PushWeights")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client_stream(chunks(), timeout=20)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # a well-formed request still reaches the handler (its own status, not the decode one)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await unary(pb.ScoreRequest().SerializeToString(), timeout=20)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
