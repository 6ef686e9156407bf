"""The OpenAI-compatible HTTP front, and the remote OpenAI backend talking to it (a real HTTP round trip
to a real tiny model: the "remote strong model" here is our own service)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import httpx
import pytest

from wolfpack.v1 import common_pb2
from wolfpack.v1 import inference_service_pb2 as pb
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.http_api import HttpFront
from wolfpack_inference.policies import Policy, PolicyRegistry, build_backend

KEY = "sk-test-not-a-real-key"


@pytest.fixture
async def http_url(registry: PolicyRegistry) -> AsyncIterator[str]:
    front = HttpFront(registry, api_key=KEY)
    port = await front.start("127.0.0.1", 0)
    yield f"http://127.0.0.1:{port}"
    await front.stop()


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_chat_and_completions_match_grpc(http_url: str, stub: pb_grpc.InferenceServiceStub) -> None:
    msg = "Bob says: vote Carol."
    grpc_resp = await stub.Generate(
        pb.GenerateRequest(
            policy_id="tiny", chat=pb.ChatPrompt(messages=[common_pb2.ChatMessage(role="user", content=msg)]),
            sampling=common_pb2.SamplingParams(max_tokens=8, logprobs=True),
        )
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=http_url, headers=auth(), timeout=30) as client:
        models = (await client.get("/v1/models")).json()
        assert {m["id"] for m in models["data"]} >= {"tiny", "strict"}
        body = {"model": "tiny", "messages": [{"role": "user", "content": msg}], "max_tokens": 8,
                "temperature": 0, "logprobs": True}  # fmt: skip
        chat = (await client.post("/v1/chat/completions", json=body)).json()
        choice = chat["choices"][0]
        assert choice["token_ids"] == list(grpc_resp.completions[0].token_ids)
        assert choice["message"]["content"] == grpc_resp.completions[0].text
        assert chat["prompt_token_ids"] == list(grpc_resp.prompt_token_ids) and chat["policy_version"] == 0
        got = [x["logprob"] for x in choice["logprobs"]["content"]]
        assert max(abs(a - b) for a, b in zip(got, grpc_resp.completions[0].logprobs, strict=True)) < 1e-4
        assert chat["usage"]["completion_tokens"] == len(choice["token_ids"])
        comp = (await client.post("/v1/completions", json={
            "model": "tiny", "prompt": chat["prompt_token_ids"], "max_tokens": 8, "temperature": 0,
        })).json()  # fmt: skip
        assert comp["choices"][0]["token_ids"] == choice["token_ids"]
        assert comp["choices"][0]["text"] == choice["message"]["content"]


async def test_http_errors(http_url: str) -> None:
    async with httpx.AsyncClient(base_url=http_url, timeout=30) as client:
        assert (await client.get("/v1/models")).status_code == 401
        assert (await client.get("/v1/models", headers=auth("wrong"))).status_code == 401
        r = await client.post("/v1/chat/completions", headers=auth(), json={"model": "nope", "messages": []})
        assert r.status_code == 404 and "unknown policy" in r.json()["error"]["message"]
        r = await client.post(
            "/v1/chat/completions", headers=auth(),
            json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
        )  # fmt: skip
        assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]


async def test_openai_backend_against_http_front(
    http_url: str,
    registry: PolicyRegistry,
    stub: pb_grpc.InferenceServiceStub,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEST_REMOTE_KEY", KEY)
    cfg = PolicyConfig(policy_id="remote", backend="openai", model="tiny", base_url=f"{http_url}/v1",
                       api_key_env="TEST_REMOTE_KEY", retries=0, timeout_s=30)  # fmt: skip
    registry.add(Policy(cfg, build_backend(cfg, registry.cache_dir)))
    bad_cfg = cfg.model_copy(update={"policy_id": "remote-badkey", "api_key_env": "TEST_NO_SUCH_VAR"})
    registry.add(Policy(bad_cfg, build_backend(bad_cfg, registry.cache_dir)))
    down_cfg = cfg.model_copy(
        update={"policy_id": "remote-down", "base_url": "http://127.0.0.1:9/v1", "retries": 1}
    )
    registry.add(Policy(down_cfg, build_backend(down_cfg, registry.cache_dir)))

    def req(policy: str) -> pb.GenerateRequest:
        return pb.GenerateRequest(
            policy_id=policy,
            chat=pb.ChatPrompt(messages=[common_pb2.ChatMessage(role="user", content="Who is the wolf?")]),
            sampling=common_pb2.SamplingParams(max_tokens=8, logprobs=True),
        )

    local, remote = await stub.Generate(req("tiny")), await stub.Generate(req("remote"))
    assert remote.completions[0].text == local.completions[0].text
    assert list(remote.completions[0].token_ids) == []  # a remote endpoint returns no ids (documented)
    assert len(remote.completions[0].logprobs) == len(local.completions[0].token_ids)
    assert remote.usage.prompt_tokens == local.usage.prompt_tokens
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Generate(req("remote-badkey"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and KEY not in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Generate(req("remote-down"))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    tokens_req = pb.GenerateRequest(policy_id="remote", tokens=pb.TokenPrompt(token_ids=[1, 2]),
                                    sampling=common_pb2.SamplingParams(max_tokens=2))  # fmt: skip
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Generate(tokens_req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
