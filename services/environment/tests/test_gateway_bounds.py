"""The HTTP gateway's value bounds and JSON shapes at their exact edges, over a real gRPC environment
server and a real gateway on loopback ports: a one-character action kind and a 256-character token reach
the service (one less / one more is refused by the gateway), the applied action's ``target`` is a number
or null, and a too-large body is told apart from an unknown path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack_environment.gateway import GatewayConfig, start_gateway
from wolfpack_environment.server import EnvironmentServicer, register

pytestmark = pytest.mark.timeout(120)

MAX_BODY = 64 * 1024


@pytest.fixture
async def http(servicer: EnvironmentServicer) -> AsyncIterator[aiohttp.ClientSession]:
    settings = load_settings(rpc_timeout_s=20)
    server = await rpc.start_server("environment", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    target = f"127.0.0.1:{server.port}"
    cfg = GatewayConfig(env_target=target, max_body_bytes=MAX_BODY, default_wait_s=0.0)
    gateway = await start_gateway("127.0.0.1", 0, target, settings=settings, config=cfg)
    async with aiohttp.ClientSession(base_url=gateway.url) as session:
        yield session
    await gateway.stop()
    servicer.manager.close_all()
    await server.stop(0)


async def call(http: aiohttp.ClientSession, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    async with http.request(method, path, **kwargs) as resp:
        return resp.status, await resp.json()


async def created(http: aiohttp.ClientSession, seats: list[int]) -> dict[str, Any]:
    status, body = await call(
        http, "POST", "/v1/episodes", json={"game": "werewolf_v1", "variant": "6p", "seed": 1,
                                            "external_seats": seats},
    )  # fmt: skip
    assert status == 201, body
    body["tokens"] = {t["seat"]: t["token"] for t in body["seat_tokens"]}
    return body  # type: ignore[no-any-return]


async def test_action_kind_and_token_length_bounds(http: aiohttp.ClientSession) -> None:
    ep = await created(http, [3])  # seat 3 opens the night (a wolf's chat turn)
    token = ep["tokens"][3]
    step = f"/v1/episodes/{ep['episode_id']}/step"
    status, obs = await call(http, "GET", f"/v1/episodes/{ep['episode_id']}/observation",
                             headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    assert status == 200 and obs["observation"]["your_turn"], obs
    turn = obs["observation"]["turn_id"]
    status, body = await call(
        http, "POST", step, json={"token": token, "turn_id": turn, "action": {"kind": "x"}}
    )
    assert status == 200 and body["accepted"] is False and body["reason"], body  # the game's re-prompt
    status, body = await call(
        http, "POST", step, json={"token": token, "turn_id": turn, "action": {"kind": ""}}
    )
    assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT", body
    for size, expected in ((256, 403), (257, 400)):  # 256: a (wrong) token for the service to refuse
        status, body = await call(
            http, "POST", step, json={"token": "t" * size, "turn_id": turn, "text": "hi"}
        )
        assert status == expected, (size, body)


async def test_the_applied_action_carries_its_target_or_null(http: aiohttp.ClientSession) -> None:
    ep = await created(http, list(range(6)))
    episode = f"/v1/episodes/{ep['episode_id']}"
    tokens = ep["tokens"]
    seen = {"with": 0, "without": 0}
    for _ in range(200):  # bounded: a 6-player game reaches a targeted action within a few dozen turns
        if seen["with"] and seen["without"]:
            break
        for seat, token in tokens.items():
            status, body = await call(http, "GET", f"{episode}/observation", params={"token": token})
            obs = body["observation"]
            if not obs["your_turn"]:
                continue
            legal = obs["legal_actions"][0]
            action: dict[str, Any] = {"kind": legal["kind"], "text": "Nothing yet."}
            if legal["targets"]:
                action["target"] = legal["targets"][0]
            status, result = await call(http, "POST", f"{episode}/step",
                                        json={"token": token, "turn_id": obs["turn_id"], "action": action, "wait_s": 0.01})  # fmt: skip
            assert status == 200 and result["accepted"], (seat, result)
            assert result["action"]["target"] == action.get("target"), result["action"]  # a number, or null
            seen["with" if "target" in action else "without"] += 1
    assert seen["with"] and seen["without"], seen


async def test_a_too_large_body_is_told_apart_from_an_unknown_path(http: aiohttp.ClientSession) -> None:
    status, body = await call(http, "POST", "/v1/episodes", data=b"{" + b" " * MAX_BODY + b"}",
                              headers={"Content-Type": "application/json"})  # fmt: skip
    assert status == 413 and body["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert f"the limit is {MAX_BODY} bytes" in body["error"]["message"]
    status, body = await call(http, "GET", "/v1/no-such-thing")
    assert status == 404 and body["error"]["code"] == "NOT_FOUND"
    assert "too large" not in body["error"]["message"]
