"""A model that cannot be prepared is an error at start, visible at the boundary: the inference process
(``wolfpack serve inference``) stays up NOT_SERVING, logs the reason, and answers calls UNAVAILABLE with
it. It never serves a random model unasked (``WOLFPACK_INFERENCE_FALLBACK_TO_TINY`` is off by default)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import inference_service_pb2 as pb
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc

from .conftest import WAIT_S, ServerProcess

# A broken build may hang (a stuck event loop) instead of failing: bound each test.
pytestmark = pytest.mark.timeout(120)


async def test_unpreparable_model_is_not_serving_with_the_reason(
    spawn: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-checkpoint"
    server = spawn(
        ["-m", "wolfpack.cli.main", "serve", "inference", "--address", "127.0.0.1:0"],
        {"WOLFPACK_INFERENCE_MODEL": str(missing), "WOLFPACK_INFERENCE_CACHE_DIR": str(tmp_path / "cache")},
    )
    target = f"127.0.0.1:{server.port()}"
    reason = server.wait_log(lambda r: r.get("msg", "").startswith("not serving"), "'not serving'")
    assert str(missing) in str(reason.get("reason")) and reason.get("level") == "error"
    assert await rpc.check_health(target) == "NOT_SERVING"
    async with rpc.channel(target, load_settings(rpc_timeout_s=WAIT_S)) as channel:
        request = pb.GenerateRequest(
            policy_id="default",
            tokens=pb.TokenPrompt(token_ids=[1, 2]),
            sampling=common_pb2.SamplingParams(max_tokens=1),
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pb_grpc.InferenceServiceStub(channel).Generate(request)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and str(missing) in (err.value.details() or "")
    assert not any("tiny" in str(r.get("msg", "")) for r in server.logs)
    assert await asyncio.to_thread(server.terminate) == 0
