"""The HTTP + WebSocket gateway end to end: a real gRPC environment server and a real aiohttp gateway on
free ports, driven by a real aiohttp client exactly as a non-Python agent would drive it."""

from __future__ import annotations

import asyncio
import json
import random
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack_environment.gateway import GatewayConfig, RunningGateway, start_gateway
from wolfpack_environment.server import EnvironmentServicer, register

MAX_BODY = 64 * 1024


@pytest.fixture
async def env_target(servicer: EnvironmentServicer) -> AsyncIterator[str]:
    settings = load_settings(rpc_timeout_s=20)
    server = await rpc.start_server("environment", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    yield f"127.0.0.1:{server.port}"
    servicer.manager.close_all()
    await server.stop(0)


@pytest.fixture
async def gateway(env_target: str) -> AsyncIterator[RunningGateway]:
    cfg = GatewayConfig(env_target=env_target, max_body_bytes=MAX_BODY, default_wait_s=10.0)
    running = await start_gateway(
        "127.0.0.1", 0, env_target, settings=load_settings(rpc_timeout_s=20), config=cfg
    )
    yield running
    await running.stop()


@pytest.fixture
async def http(gateway: RunningGateway) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=gateway.url) as session:
        yield session


async def call(
    http: aiohttp.ClientSession, method: str, path: str, *, status: int = 200, **kwargs: Any
) -> dict[str, Any]:
    async with http.request(method, path, **kwargs) as resp:
        body = await resp.json()
        assert resp.status == status, (resp.status, body)
        assert resp.content_type == "application/json"
        return body  # type: ignore[no-any-return]


async def error_of(http: aiohttp.ClientSession, method: str, path: str, status: int, **kwargs: Any) -> str:
    """The error code of a failing call, after checking the status and the JSON error shape."""
    body = await call(http, method, path, status=status, **kwargs)
    assert set(body) == {"error"} and body["error"]["message"], body
    return str(body["error"]["code"])


def random_action(obs: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    la = rng.choice(obs["legal_actions"])
    action: dict[str, Any] = {"kind": la["kind"]}
    if la["targets"]:
        action["target"] = rng.choice(la["targets"])
    if la["needs_text"]:
        action["text"] = f"Player {obs['seat'] + 1} thinks hard."
    return action


def as_text(action: dict[str, Any]) -> str:
    """The same action as free text, the way a model writes it (1-based player numbers)."""
    if "text" in action:
        return str(action["text"])
    target = action.get("target")
    return f"{action['kind']} {target + 1}" if target is not None else str(action["kind"])


async def create(http: aiohttp.ClientSession, **body: Any) -> dict[str, Any]:
    return await call(
        http, "POST", "/v1/episodes", status=201, json={"game": "werewolf_v1", "variant": "6p", **body}
    )


async def play_http(http: aiohttp.ClientSession, episode_id: str, token: str, seed: int) -> dict[str, Any]:
    """Reset/step loop; the bearer header (not the body) carries the token here."""
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {token}"}
    first = await call(http, "POST", f"/v1/episodes/{episode_id}/reset", json={}, headers=headers)
    assert first["info"]["role"] and first["info"]["num_seats"] == 6
    assert "You are Player" in first["observation"]["text"]
    obs: dict[str, Any] = first["observation"]
    steps = 0
    while not obs["done"]:
        if not obs["your_turn"]:  # the long-poll ran out; keep waiting
            obs = (await call(http, "GET", f"/v1/episodes/{episode_id}/observation", headers=headers))[
                "observation"
            ]
            continue
        body = {"turn_id": obs["turn_id"], "action": random_action(obs, rng)}
        result = await call(http, "POST", f"/v1/episodes/{episode_id}/step", json=body, headers=headers)
        assert result["accepted"] or result["defaulted"] or result["observation"]["feedback"]
        assert result["done"] == result["observation"]["done"]
        obs = result["observation"]
        steps += 1
        assert steps < 500
    assert steps > 0
    return obs


async def play_ws(http: aiohttp.ClientSession, episode_id: str, token: str, seed: int) -> dict[str, Any]:
    """Push loop over the WebSocket, answering with free text the game parses."""
    rng = random.Random(seed)
    answered: set[int] = set()
    last: dict[str, Any] = {}
    results = 0
    async with http.ws_connect(f"/v1/episodes/{episode_id}/ws", params={"token": token}) as ws:
        async for msg in ws:
            assert msg.type == aiohttp.WSMsgType.TEXT, msg
            data = json.loads(msg.data)
            assert data["type"] in ("observation", "act_result"), data
            if data["type"] == "act_result":
                results += 1
                obs = data["observation"]
                if data["accepted"] or data["defaulted"]:
                    last = obs
                    continue
                answered.discard(obs["turn_id"])  # re-prompt: answer the same turn again
            else:
                obs = data["observation"]
            last = obs
            if obs["your_turn"] and obs["turn_id"] not in answered:
                answered.add(obs["turn_id"])
                text = as_text(random_action(obs, rng))
                await ws.send_json(
                    {"type": "act", "turn_id": obs["turn_id"], "text": text, "id": obs["turn_id"]}
                )
        assert ws.close_code == 1000
    assert results > 0 and last["done"]
    return last


async def test_games_are_listed(http: aiohttp.ClientSession) -> None:
    games = {g["game_id"]: g for g in (await call(http, "GET", "/v1/games"))["games"]}
    assert {v["name"]: v["num_seats"] for v in games["werewolf_v1"]["variants"]} == {
        "6p": 6,
        "9p": 9,
        "12p": 12,
    }
    assert "heuristic" in games["werewolf_v1"]["bots"]


async def test_http_seat_and_websocket_seat_finish_a_6_player_game(http: aiohttp.ClientSession) -> None:
    ep = await create(http, seed=7, external_seats=[1, 4], default_bot="heuristic", bots={"0": "random"})
    tokens = {t["seat"]: t["token"] for t in ep["seat_tokens"]}
    assert set(tokens) == {1, 4} and ep["num_seats"] == 6 and ep["admin_token"]
    finals = await asyncio.wait_for(
        asyncio.gather(
            play_http(http, ep["episode_id"], tokens[1], seed=1),
            play_ws(http, ep["episode_id"], tokens[4], seed=2),
        ),
        timeout=60,
    )
    for final in finals:
        assert final["done"] and final["outcome"] in ("win", "loss", "draw")
        assert not final["legal_actions"]
    state = await call(http, "GET", f"/v1/episodes/{ep['episode_id']}", params={"token": tokens[1]})
    assert state["done"] and state["winner"] and all(s["role"] for s in state["seats"])
    assert {s["seat"]: s["controller"] for s in state["seats"]}[4] == "external"
    assert any(e["actor"] == 4 and e["kind"] not in ("role", "invalid") for e in state["events"])
    assert (
        await call(http, "DELETE", f"/v1/episodes/{ep['episode_id']}", params={"token": ep["admin_token"]})
    )["closed"]


async def test_bad_requests_get_json_errors_with_mapped_statuses(http: aiohttp.ClientSession) -> None:
    ep = await create(http, seed=5, external_seats=[0, 1, 2, 3, 4, 5])
    eid = ep["episode_id"]
    tokens = {t["seat"]: t["token"] for t in ep["seat_tokens"]}
    observations = {
        s: (await call(http, "POST", f"/v1/episodes/{eid}/reset", json={"token": t, "wait_s": 0}))[
            "observation"
        ]
        for s, t in tokens.items()
    }
    acting = next(s for s, o in observations.items() if o["your_turn"])
    idle = next(s for s, o in observations.items() if not o["your_turn"])
    obs, token = observations[acting], tokens[acting]
    step = f"/v1/episodes/{eid}/step"

    bad_json = await error_of(
        http, "POST", step, 400, data=b'{"token": ', headers={"Content-Type": "application/json"}
    )
    assert bad_json == "INVALID_ARGUMENT"
    assert await error_of(http, "POST", step, 400, json=[1, 2]) == "INVALID_ARGUMENT"
    assert await error_of(http, "POST", step, 400, json={"token": token, "turn_id": "x", "text": "pass"}) == (
        "INVALID_ARGUMENT"
    )
    no_move = {"token": token, "turn_id": obs["turn_id"]}
    assert await error_of(http, "POST", step, 400, json=no_move) == "INVALID_ARGUMENT"
    assert await error_of(http, "POST", step, 400, json={**no_move, "action": "vote 3"}) == "INVALID_ARGUMENT"
    assert await error_of(http, "POST", step, 401, json={"turn_id": 1, "text": "pass"}) == "UNAUTHENTICATED"
    wrong = {"token": "not-a-token", "turn_id": obs["turn_id"], "text": "pass"}
    assert await error_of(http, "POST", step, 403, json=wrong) == "PERMISSION_DENIED"
    assert (
        await error_of(http, "GET", f"/v1/episodes/{eid}", 403, params={"token": "nope"})
        == "PERMISSION_DENIED"
    )
    unknown = {"token": token, "turn_id": 1, "text": "pass"}
    assert await error_of(http, "POST", "/v1/episodes/nope/step", 404, json=unknown) == "NOT_FOUND"
    assert await error_of(http, "GET", "/v1/nothing-here", 404) == "NOT_FOUND"
    stale = {"token": token, "turn_id": obs["turn_id"] + 100, "text": "pass"}
    assert await error_of(http, "POST", step, 409, json=stale) == "FAILED_PRECONDITION"
    out_of_turn = {"token": tokens[idle], "turn_id": 1, "text": "vote 1"}
    assert await error_of(http, "POST", step, 409, json=out_of_turn) == "FAILED_PRECONDITION"
    # A structured action's text over the service's max_text_chars (conftest: 2000); free text that long
    # is a move the game judges (the first 2000 characters are read), not an HTTP error.
    oversized = {**no_move, "action": {"kind": "say", "text": "x" * 5_000}}
    assert await error_of(http, "POST", step, 400, json=oversized) == "INVALID_ARGUMENT"
    huge = {**no_move, "text": "x" * (MAX_BODY + 1)}  # over the gateway's body limit
    assert await error_of(http, "POST", step, 413, json=huge) == "PAYLOAD_TOO_LARGE"
    bad_game = {"game": "chess_v9"}
    assert await error_of(http, "POST", "/v1/episodes", 400, json=bad_game) == "INVALID_ARGUMENT"
    assert await error_of(http, "POST", "/v1/episodes", 400, json={"game": "werewolf_v1", "bots": [1]}) == (
        "INVALID_ARGUMENT"
    )

    # An illegal move is not an HTTP error: rejected with a reason, the same turn is re-prompted.
    rejected = await call(http, "POST", step, json={**no_move, "action": {"kind": "fly", "target": 0}})
    assert not rejected["accepted"] and rejected["reason"] and not rejected["done"]
    assert rejected["observation"]["feedback"] and rejected["observation"]["turn_id"] == obs["turn_id"]
    legal = {**no_move, "action": random_action(obs, random.Random(0)), "wait_s": 0}
    accepted = await call(http, "POST", step, json=legal)
    assert accepted["accepted"] and not accepted["duplicate"] and accepted["action"]["kind"]
    again = await call(http, "POST", step, json=legal)  # a retry of an applied turn is idempotent
    assert again["duplicate"] and again["action"] == accepted["action"]

    # The WebSocket checks the token before upgrading, and keeps a socket open after a bad message.
    with pytest.raises(aiohttp.WSServerHandshakeError) as handshake:
        await http.ws_connect(f"/v1/episodes/{eid}/ws", params={"token": "nope"})
    assert handshake.value.status == 403
    async with http.ws_connect(f"/v1/episodes/{eid}/ws", params={"token": tokens[idle]}) as ws:
        first = await ws.receive_json(timeout=5)
        assert first["type"] == "observation" and first["observation"]["seat"] == idle
        await ws.send_str("{not json")
        err = await ws.receive_json(timeout=5)
        assert err["type"] == "error" and err["code"] == "INVALID_ARGUMENT"
        await ws.send_json({"type": "act", "turn_id": 999, "text": "pass", "id": "a1"})
        err = await ws.receive_json(timeout=5)
        assert err == {"type": "error", "code": "FAILED_PRECONDITION", "message": err["message"], "id": "a1"}
        await ws.send_json({"type": "ping"})
        assert (await ws.receive_json(timeout=5))["type"] == "pong"

    # Closing needs the admin token; afterwards the episode is gone.
    assert (
        await error_of(http, "DELETE", f"/v1/episodes/{eid}", 403, params={"token": token})
        == "PERMISSION_DENIED"
    )
    closed = await call(
        http, "DELETE", f"/v1/episodes/{eid}", headers={"Authorization": f"Bearer {ep['admin_token']}"}
    )
    assert closed == {"closed": True}
    assert await error_of(http, "GET", f"/v1/episodes/{eid}", 404, params={"token": token}) == "NOT_FOUND"


async def test_silent_seat_gets_default_actions_and_the_long_poll_sees_the_end(
    http: aiohttp.ClientSession,
) -> None:
    ep = await create(http, seed=3, external_seats=[2], turn_timeout_s=0.02)
    token = ep["seat_tokens"][0]["token"]
    obs: dict[str, Any] = {"done": False}
    for _ in range(200):
        polled = await call(
            http,
            "GET",
            f"/v1/episodes/{ep['episode_id']}/observation",
            params={"token": token, "wait_s": "5"},
        )
        obs = polled["observation"]
        if obs["done"]:
            break
        await asyncio.sleep(0.05)  # a silent agent: never acts
    assert obs["done"] and obs["outcome"] in ("win", "loss", "draw")
    state = await call(http, "GET", f"/v1/episodes/{ep['episode_id']}", params={"token": ep["admin_token"]})
    assert state["done"] and state["events"]


async def test_unreachable_environment_service_is_503() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused, and no other
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # process can take the port while the test runs
        running = await start_gateway("127.0.0.1", 0, dead, settings=load_settings(rpc_timeout_s=5))
        try:
            async with aiohttp.ClientSession(base_url=running.url) as session:
                assert await error_of(session, "GET", "/v1/games", 503) == "UNAVAILABLE"
                assert (await call(session, "GET", "/healthz")) == {"status": "ok"}
        finally:
            await running.stop()
