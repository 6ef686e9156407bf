"""The HTTP gateway's value bounds and JSON shapes at their exact edges, over a real gRPC environment
server and a real gateway on loopback ports: a one-character action kind and a 256-character token reach
the service (one less / one more is refused by the gateway), the applied action's ``target`` is a number
or null, and a too-large body is told apart from an unknown path."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack_environment.gateway import GatewayConfig, serve_gateway, start_gateway
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


# --------------------------------------------------------------------------- documented defaults


def test_documented_defaults_port_8080_and_wait_cap_60() -> None:
    # gateway_protocol.md: "--port (default 8080)", "--max-wait-s (default 60)", "wait_s ... capped at 60".
    for func in (start_gateway, serve_gateway):
        assert inspect.signature(func).parameters["port"].default == 8080, func
    assert GatewayConfig(env_target="127.0.0.1:1").max_wait_s == 60


# --------------------------------------------------------------------------- header field size


async def raw_request(port: int, head: bytes) -> bytes:
    """One raw HTTP/1.1 request (``Connection: close``); the whole answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 20)  # bounded: the gateway answers and closes
    finally:
        writer.close()


async def test_a_header_field_of_8190_bytes_passes_and_8191_is_refused(http: aiohttp.ClientSession) -> None:
    # gateway_protocol.md: a header value is at most 8190 bytes.
    port = http._base_url.port  # type: ignore[union-attr]
    assert port
    for size, ok in ((8190, True), (8191, False)):
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: " + b"a" * size + b"\r\n\r\n"
        answer = await raw_request(port, head)
        status = answer.split(b" ", 2)[1] if answer.startswith(b"HTTP/1.") else answer[:80]
        assert status == (b"200" if ok else b"400"), (size, answer[:80])


# --------------------------------------------------------------------------- WebSocket frames


async def test_a_binary_websocket_frame_gets_an_invalid_argument_message(http: aiohttp.ClientSession) -> None:
    # gateway_protocol.md: messages are JSON text frames. Every receive is bounded and the client
    # closes the socket (bounded close) before the fixture stops the gateway.
    ep = await created(http, [3])
    eid = ep["episode_id"]
    timeouts = aiohttp.ClientWSTimeout(ws_receive=20, ws_close=10)
    async with http.ws_connect(
        f"/v1/episodes/{eid}/ws", params={"token": ep["tokens"][3]}, timeout=timeouts
    ) as ws:
        first = await ws.receive_json(timeout=20)
        assert first["type"] == "observation", first
        await ws.send_bytes(b'{"type": "ping"}')
        for _ in range(50):  # bounded: observations may come first; the error follows the frame
            msg = await ws.receive_json(timeout=20)
            if msg["type"] != "observation":
                break
        assert msg["type"] == "error" and msg["code"] == "INVALID_ARGUMENT", msg
        await ws.send_json({"type": "ping"})  # the socket stays usable
        for _ in range(50):
            msg = await ws.receive_json(timeout=20)
            if msg["type"] != "observation":
                break
        assert msg["type"] == "pong", msg
        await ws.close()  # bounded by ws_close: the handler ends, cancelling its Observe stream
    assert ws.closed


async def test_the_websocket_path_without_an_upgrade_is_a_json_400(http: aiohttp.ClientSession) -> None:
    # gateway_protocol.md: every error body is {"error": {"code", "message"}}; a plain GET of the
    # WebSocket path (valid token, no Upgrade header) is refused by the handshake with a 400.
    ep = await created(http, [3])
    async with http.get(f"/v1/episodes/{ep['episode_id']}/ws", params={"token": ep["tokens"][3]}) as resp:
        assert resp.status == 400
        assert resp.content_type == "application/json", await resp.text()
        body = await resp.json()
    assert set(body) == {"error"} and body["error"]["code"] and body["error"]["message"], body


# --------------------------------------------------------------------------- connection cap


async def until(cond: Any, what: str) -> None:
    for _ in range(2000):  # bounded (20 s): the server reaches the state as soon as it reads the bytes
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_past_the_cap_a_connection_finding_every_other_busy_reads_a_json_503(
    servicer: EnvironmentServicer,
) -> None:
    # gateway_protocol.md: past max connections the oldest idle one is closed; when every one is busy the
    # new connection reads a JSON 503 and is closed (a busy flood cannot take more descriptors). Cap 1: A
    # busy, B refused; A answered and idle, then C drops A and is served.
    settings = load_settings(rpc_timeout_s=20)
    server = await rpc.start_server("environment", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    target = f"127.0.0.1:{server.port}"
    cfg = GatewayConfig(env_target=target, max_body_bytes=MAX_BODY, max_connections=1, header_timeout_s=600)
    gateway = await start_gateway("127.0.0.1", 0, target, settings=settings, config=cfg)
    conns = gateway.runner.server._connections  # type: ignore[union-attr]
    streams = []
    try:
        head = b"POST /v1/episodes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{"
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        streams.append((reader, writer))
        writer.write(head)  # its handler waits for the rest of its body: a request in progress
        await writer.drain()
        await until(lambda: len(conns) == 1 and all(h._request_in_progress for h in conns), "busy")
        b_reader, b_writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        streams.append((b_reader, b_writer))
        answer = await asyncio.wait_for(b_reader.read(), 20)  # all of it, then EOF
        head_b, _, body = answer.partition(b"\r\n\r\n")
        assert head_b.startswith(b"HTTP/1.1 503"), answer[:200]
        assert json.loads(body)["error"]["code"] == "UNAVAILABLE"
        writer.write(b"}")  # "{}": a create without a game, answered 400; the connection stays open
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        assert answer.startswith(b"HTTP/1.1 400"), answer
        length = int(answer.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await asyncio.wait_for(reader.readexactly(length), 20)
        await until(lambda: not any(h._request_in_progress for h in conns), "idle")
        c_reader, c_writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        streams.append((c_reader, c_writer))
        assert await asyncio.wait_for(reader.read(), 20) == b""  # A: dropped for C
        c_writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await c_writer.drain()
        assert (await asyncio.wait_for(c_reader.read(), 20)).startswith(b"HTTP/1.1 200")
    finally:
        for _, w in streams:
            w.close()
        await gateway.stop()
        servicer.manager.close_all()
        await server.stop(0)


async def test_past_the_cap_only_the_oldest_idle_connection_is_closed(servicer: EnvironmentServicer) -> None:
    # gateway_protocol.md: past max connections the oldest idle one is closed, one per connection over.
    # Cap 2, idle A and B, then C: A is closed and B still answers a request (both go in the same
    # connection_made call, so once A's EOF is read, B would already be closed if it were dropped too).
    settings = load_settings(rpc_timeout_s=20)
    server = await rpc.start_server("environment", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    target = f"127.0.0.1:{server.port}"
    cfg = GatewayConfig(env_target=target, max_body_bytes=MAX_BODY, max_connections=2, header_timeout_s=600)
    gateway = await start_gateway("127.0.0.1", 0, target, settings=settings, config=cfg)
    conns = gateway.runner.server._connections  # type: ignore[union-attr]
    streams = []
    try:
        for n in (1, 2):
            streams.append(await asyncio.open_connection("127.0.0.1", gateway.port))
            await until(lambda n=n: len(conns) == n, "connected")
        streams.append(await asyncio.open_connection("127.0.0.1", gateway.port))
        assert await asyncio.wait_for(streams[0][0].read(), 20) == b""  # A: closed
        reader, writer = streams[1]
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 20)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:80]  # B: still open
    finally:
        for _, writer in streams:
            writer.close()
        await gateway.stop()
        servicer.manager.close_all()
        await server.stop(0)
