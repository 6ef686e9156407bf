"""A Werewolf agent that plays through the HTTP gateway, with no Wolfpack (or gRPC) code at all.

It shows the gateway protocol (``services/environment/wolfpack_environment/gateway_protocol.md``)
from the outside, as an agent in any language would use it. The default mode is reset/step over plain
HTTP with the standard library only; ``--ws`` plays the same over the WebSocket (needs ``aiohttp``).
The policy is random legal actions: replace ``choose`` with your model.

    wolfpack serve environment --address 127.0.0.1:50051 &
    python -m wolfpack_environment.gateway --port 8080 --env 127.0.0.1:50051 &
    python examples/http_agent.py --gateway http://127.0.0.1:8080          # reset/step
    python examples/http_agent.py --gateway http://127.0.0.1:8080 --ws     # WebSocket
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import urllib.error
import urllib.request
from typing import Any


class GatewayError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code


def request(base: str, method: str, path: str, body: dict[str, Any] | None = None, token: str = "") -> Any:
    """One JSON call; errors arrive as ``{"error": {"code", "message"}}`` with a matching HTTP status."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base.rstrip("/") + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=90) as resp:  # step/reset long-poll up to wait_s
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            err = json.loads(exc.read())["error"]
        except (ValueError, KeyError, TypeError):
            err = {"code": "HTTP_ERROR", "message": exc.reason}
        raise GatewayError(exc.code, err["code"], err["message"]) from None


def choose(obs: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A random legal action. ``targets`` and ``action.target`` are 0-based seats ("Player 3" is 2)."""
    legal = rng.choice(obs["legal_actions"])
    action: dict[str, Any] = {"kind": legal["kind"]}
    if legal["targets"]:
        action["target"] = rng.choice(legal["targets"])
    if legal["needs_text"]:
        action["text"] = rng.choice(["I trust nobody yet.", "Someone is lying.", "Let's think carefully."])
    return action


def play_http(base: str, episode_id: str, token: str, rng: random.Random) -> tuple[dict[str, Any], int]:
    """reset() once, then step() until done; both wait (long-poll) until this seat must act."""
    obs = request(base, "POST", f"/v1/episodes/{episode_id}/reset", {"wait_s": 30}, token)["observation"]
    print(f"Player {obs['seat'] + 1}, role {obs['role']}", flush=True)
    steps = 0
    while not obs["done"]:
        if not obs["your_turn"]:  # the long-poll ran out: wait again
            obs = request(base, "GET", f"/v1/episodes/{episode_id}/observation?wait_s=30", token=token)[
                "observation"
            ]
            continue
        action = choose(obs, rng)
        try:
            result = request(
                base,
                "POST",
                f"/v1/episodes/{episode_id}/step",
                {"turn_id": obs["turn_id"], "action": action},
                token,
            )
        except GatewayError as exc:
            if exc.status == 409:  # the turn moved on (we timed out); resynchronise
                obs = request(base, "GET", f"/v1/episodes/{episode_id}/observation?wait_s=0", token=token)[
                    "observation"
                ]
                continue
            if exc.status == 429:  # rate limited: slow down
                time.sleep(1.0)
                continue
            raise
        steps += 1
        verdict = "ok" if result["accepted"] else f"rejected: {result['reason']}"
        print(f"[{obs['phase']} {obs['round']}] {action} -> {verdict}", flush=True)
        obs = result["observation"]
    return obs, steps


async def play_ws(base: str, episode_id: str, token: str, rng: random.Random) -> tuple[dict[str, Any], int]:
    """The push model: observations arrive as they happen; answer the ones with ``your_turn``."""
    import aiohttp  # only this mode needs it

    url = base.rstrip("/").replace("http", "ws", 1) + f"/v1/episodes/{episode_id}/ws"
    obs: dict[str, Any] = {}
    answered: set[int] = set()
    steps = 0
    async with aiohttp.ClientSession() as session, session.ws_connect(url, params={"token": token}) as ws:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(msg.data)
            if data["type"] == "error":
                print(f"error: {data['code']}: {data['message']}", file=sys.stderr)
                continue
            if data["type"] == "act_result":
                steps += 1
                if not (data["accepted"] or data["defaulted"]):
                    answered.discard(data["observation"]["turn_id"])  # re-prompt: same turn again
            obs = data["observation"]
            if obs["your_turn"] and obs["turn_id"] not in answered:
                answered.add(obs["turn_id"])
                await ws.send_json({"type": "act", "turn_id": obs["turn_id"], "action": choose(obs, rng)})
    return obs, steps  # the server closes the socket when the episode is over


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Random-action Werewolf agent over the Wolfpack HTTP/WebSocket gateway."
    )
    p.add_argument("--gateway", default="http://127.0.0.1:8080", help="gateway base URL")
    p.add_argument("--episode", help="join this episode (needs --token) instead of creating one")
    p.add_argument("--token", help="seat token for --episode")
    p.add_argument("--variant", default="6p", help="Werewolf preset for a new episode (6p, 9p, 12p)")
    p.add_argument("--seed", type=int, default=0, help="episode seed")
    p.add_argument("--seat", type=int, default=0, help="0-based seat to take in a new episode")
    p.add_argument("--bots", default="heuristic", help="scripted bot for the other seats")
    p.add_argument("--ws", action="store_true", help="play over the WebSocket instead of reset/step")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    try:
        if args.episode:
            episode_id, token = args.episode, args.token or ""
        else:
            body = {
                "game": "werewolf_v1",
                "variant": args.variant,
                "seed": args.seed,
                "external_seats": [args.seat],
                "default_bot": args.bots,
            }
            created = request(args.gateway, "POST", "/v1/episodes", body)
            episode_id, token = created["episode_id"], created["seat_tokens"][0]["token"]
            print(f"created episode {episode_id}", flush=True)
        if args.ws:
            final, steps = asyncio.run(play_ws(args.gateway, episode_id, token, rng))
        else:
            final, steps = play_http(args.gateway, episode_id, token, rng)
        state = request(args.gateway, "GET", f"/v1/episodes/{episode_id}", token=token)
    except GatewayError as exc:
        print(f"gateway error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"cannot reach the gateway at {args.gateway}: {exc}", file=sys.stderr)
        return 1
    print(
        f"Summary: episode {episode_id} | Player {final['seat'] + 1} ({final['role']}) | "
        f"outcome {final['outcome']} | winner {state['winner'] or '-'} | actions {steps} | "
        f"mode {'websocket' if args.ws else 'reset/step'}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
