"""The access log of ``rpc.start_server``: one record per finished unary call, DEBUG when OK and WARNING
otherwise, with the method, the status code and a duration in milliseconds (two decimals)."""

from __future__ import annotations

import logging
from typing import Any

import grpc
import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import reward_service_pb2 as pb
from wolfpack.v1 import reward_service_pb2_grpc as pb_grpc


class Specs(pb_grpc.RewardServiceServicer):
    async def ListRewardSpecs(self, request: pb.ListRewardSpecsRequest, context: Any) -> Any:
        return pb.ListRewardSpecsResponse()

    async def Score(self, request: pb.ScoreRequest, context: Any) -> Any:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no trajectory")


async def test_one_record_per_call_with_level_code_and_duration(caplog: pytest.LogCaptureFixture) -> None:
    def register(server: grpc.aio.Server) -> list[str]:
        pb_grpc.add_RewardServiceServicer_to_server(Specs(), server)
        return ["wolfpack.v1.RewardService"]

    server = await rpc.start_server("reward", register, load_settings(), "127.0.0.1:0")
    try:
        with caplog.at_level(logging.DEBUG, logger="wolfpack.rpc"):
            async with rpc.channel(f"127.0.0.1:{server.port}", load_settings(rpc_timeout_s=30)) as ch:
                stub = pb_grpc.RewardServiceStub(ch)
                await stub.ListRewardSpecs(pb.ListRewardSpecsRequest())
                with pytest.raises(grpc.aio.AioRpcError):
                    await stub.Score(pb.ScoreRequest())
    finally:
        await server.stop(0)
    records = {r.method: r for r in caplog.records if r.getMessage() == "rpc"}  # type: ignore[attr-defined]
    ok = records["/wolfpack.v1.RewardService/ListRewardSpecs"]
    bad = records["/wolfpack.v1.RewardService/Score"]
    assert (ok.levelno, ok.code) == (logging.DEBUG, "OK")  # type: ignore[attr-defined]
    assert (bad.levelno, bad.code) == (logging.WARNING, "INVALID_ARGUMENT")  # type: ignore[attr-defined]
    for record in (ok, bad):
        ms = record.ms  # type: ignore[attr-defined]
        # A duration, not a clock reading (an hour bounds any test call) and rounded to 0.01 ms.
        assert 0 <= ms < 3_600_000 and ms == round(ms, 2)
