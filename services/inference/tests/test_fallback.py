"""No silent fallback: a model that cannot be prepared is an error, unless a fallback was asked for, and a
fallback shows in the logs, ListPolicies and every response's policy id."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import inference_service_pb2 as pb
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.policies import FALLBACK_SUFFIX, PolicyLoadError, PolicyRegistry, build_policy
from wolfpack_inference.server import InferenceServicer, register
from wolfpack_inference.settings import InferenceSettings


def missing_model(tmp_path: Path, **kw: object) -> PolicyConfig:
    return PolicyConfig(  # type: ignore[arg-type]
        policy_id="default", model=str(tmp_path / "no-such-model"), device="cpu", dtype="float32", **kw
    )


def test_fallback_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WOLFPACK_INFERENCE_FALLBACK_TO_TINY", raising=False)
    assert InferenceSettings().fallback_to_tiny is False
    assert PolicyConfig().fallback_to_tiny is False
    assert all(p.fallback_to_tiny is False for p in InferenceSettings().policies())


def test_a_model_that_cannot_be_prepared_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError) as err:
        PolicyRegistry.from_configs([missing_model(tmp_path)], tmp_path)
    assert "no-such-model" in str(err.value) and "'default'" in str(err.value)


async def test_an_asked_for_fallback_is_visible_everywhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="wolfpack_inference.policies"):
        policy = build_policy(missing_model(tmp_path, fallback_to_tiny=True), tmp_path)
    served = "default" + FALLBACK_SUFFIX
    assert policy.policy_id == served and "no-such-model" in policy.fallback_reason
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "no-such-model" in record.reason  # type: ignore[attr-defined]

    registry = PolicyRegistry(tmp_path, [policy])
    settings = load_settings(rpc_timeout_s=60)
    servicer = InferenceServicer(registry)
    server = await rpc.start_server("inference", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    try:
        async with rpc.channel(f"127.0.0.1:{server.port}", settings) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            listed = await stub.ListPolicies(pb.ListPoliciesRequest())
            assert [p.policy.policy_id for p in listed.policies] == [served]
            # Callers may keep naming the configured id; the answer says who really served it.
            request = pb.GenerateRequest(
                policy_id="default",
                tokens=pb.TokenPrompt(token_ids=[5, 6, 7]),
                sampling=common_pb2.SamplingParams(max_tokens=2, temperature=0),
            )
            response = await stub.Generate(request)
            assert response.policy.policy_id == served
    finally:
        await registry.close()
        await server.stop(0)


async def test_an_unavailable_registry_answers_unavailable_with_the_reason(tmp_path: Path) -> None:
    registry = PolicyRegistry(tmp_path, unavailable="policy 'default': model 'x' cannot be prepared: gone")
    settings = load_settings(rpc_timeout_s=10)
    servicer = InferenceServicer(registry)
    server = await rpc.start_server("inference", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    try:
        async with rpc.channel(f"127.0.0.1:{server.port}", settings) as channel:
            request = pb.GenerateRequest(
                policy_id="default",
                tokens=pb.TokenPrompt(token_ids=[5]),
                sampling=common_pb2.SamplingParams(max_tokens=1),
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await pb_grpc.InferenceServiceStub(channel).Generate(request)
            # Listing says why too: an empty list would read as "nothing configured".
            with pytest.raises(grpc.aio.AioRpcError) as listed:
                await pb_grpc.InferenceServiceStub(channel).ListPolicies(pb.ListPoliciesRequest())
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "cannot be prepared: gone" in (err.value.details() or "")
        assert listed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "cannot be prepared: gone" in (listed.value.details() or "")
    finally:
        await server.stop(0)
