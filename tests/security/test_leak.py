"""Wire-level leak test: whole games played by several seats through the gRPC API and through the
gateway (HTTP), checking everything each seat receives against what its role may know.

What a seat may learn from the protocol beyond the text: its own decisions. So its turn ids must be
exactly 1, 2, 3, ... (one per decision of its own, re-prompts keep theirs): with one counter shared by
all seats, the gaps counted other seats' private decisions (a wolf's kill vote, a seer's check).
Roles: its own only (in observations and in GetEpisode) while the game runs; the event log (whose
sequence numbers count private events too) only once it is over. Ids: the episode id is the same random
id for everyone and is not derived from anything a caller chose."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from typing import Any

import aiohttp
import pytest

from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.gateway import RunningGateway

from .conftest import EnvStack

SEATS = 9


def pick(obs: pb.Observation, rng: random.Random) -> common_pb2.Action:
    la = rng.choice(list(obs.legal_actions))
    action = common_pb2.Action(kind=la.kind)
    if la.targets:
        action.target = rng.choice(list(la.targets))
    if la.needs_text:
        action.text = f"Player {obs.seat + 1} has a plan."
    return action


def check_turn_ids(seen: dict[int, list[int]]) -> None:
    for seat, ids in seen.items():
        distinct = list(dict.fromkeys(i for i in ids if i))
        assert distinct == list(range(1, len(distinct) + 1)), (seat, distinct)


@pytest.mark.parametrize("seed", [3, 11])
async def test_grpc_seats_see_only_their_own_counters_and_role(env: EnvStack, seed: int) -> None:
    req = pb.CreateEpisodeRequest(game=common_pb2.GameRef(game_id="werewolf_v1", variant="9p"), seed=seed)
    for seat in range(SEATS):
        req.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_EXTERNAL)
    created = await env.client.stub.CreateEpisode(req)
    roles: dict[int, str] = {}
    turn_ids: dict[int, list[int]] = defaultdict(list)

    async def play(seat: int, token: str) -> None:
        rng = random.Random(seed * 100 + seat)
        session = env.client.seat(created.episode_id, token)
        async for obs in session.observe():
            assert obs.episode_id == created.episode_id and obs.seat == seat
            roles.setdefault(seat, obs.role)
            assert obs.role == roles[seat]
            if not obs.done:
                state = await env.client.stub.GetEpisode(
                    pb.GetEpisodeRequest(episode_id=created.episode_id, token=token)
                )
                if not state.done:
                    assert [s.seat for s in state.seats if s.role] == [seat]
                    assert not state.events  # the event log's indices count private events
            while obs.your_turn and not obs.done:
                turn_ids[seat].append(obs.turn_id)
                resp = await session.act(obs.turn_id, pick(obs, rng))
                obs = resp.observation
                if resp.accepted or resp.defaulted or obs.done:
                    break
            if obs.done:
                return

    await asyncio.wait_for(asyncio.gather(*(play(t.seat, t.token) for t in created.seat_tokens)), timeout=60)
    check_turn_ids(turn_ids)
    # decisions really were private and uneven: some seat acted more often than another
    counts = sorted(len(set(v)) for v in turn_ids.values())
    assert counts[0] < counts[-1]


async def test_gateway_seats_see_only_their_own_counters(env: EnvStack, gateway: RunningGateway) -> None:
    async with aiohttp.ClientSession(gateway.url) as http:
        body = {"game": "werewolf_v1", "variant": "6p", "seed": 5, "external_seats": list(range(6))}
        async with http.post("/v1/episodes", json=body) as resp:
            created = await resp.json()
        eid = created["episode_id"]
        turn_ids: dict[int, list[int]] = defaultdict(list)

        async def play(seat: int, token: str) -> None:
            rng = random.Random(seat)
            async with http.post(f"/v1/episodes/{eid}/reset", json={"token": token, "wait_s": 30}) as resp:
                data = await resp.json()
            obs = data["observation"]
            assert data["info"]["seat"] == seat
            role = obs["role"]
            while not obs["done"]:
                assert obs["role"] == role and obs["seat"] == seat
                if not obs["your_turn"]:
                    url = f"/v1/episodes/{eid}/observation"
                    async with http.get(url, params={"token": token, "wait_s": "30"}) as resp:
                        obs = (await resp.json())["observation"]
                    continue
                turn_ids[seat].append(obs["turn_id"])
                la = rng.choice(obs["legal_actions"])
                action: dict[str, Any] = {"kind": la["kind"]}
                if la["targets"]:
                    action["target"] = rng.choice(la["targets"])
                if la["needs_text"]:
                    action["text"] = "I have a plan."
                step = {"token": token, "turn_id": obs["turn_id"], "action": action, "wait_s": 30}
                async with http.post(f"/v1/episodes/{eid}/step", json=step) as resp:
                    result = await resp.json()
                assert resp.status == 200, result
                obs = result["observation"]

        await asyncio.wait_for(
            asyncio.gather(*(play(t["seat"], t["token"]) for t in created["seat_tokens"])), timeout=60
        )
        check_turn_ids(turn_ids)
