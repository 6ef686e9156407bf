"""Hidden information at the service boundary, for every role, in the middle of a game: what a seat
token reads over gRPC and through the HTTP gateway is that seat's own view and nothing more.

Oracle: the engine itself, read in-process (``observe(seat)``, ``roles``): the wire must carry exactly the
seat's observation, its own role only, and no event log (the log holds night actions, wolf chat, seer
results) until the game is over; another episode's token opens nothing."""

from __future__ import annotations

from typing import Any

import aiohttp
import grpc
import pytest

from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.client import CreatedEpisode
from wolfpack_environment.gateway import RunningGateway
from wolfpack_games.werewolf import WerewolfEnv

from .conftest import EnvStack

# A broken build may hang (a stuck event loop) instead of failing: bound each test.
pytestmark = pytest.mark.timeout(120)

ROLES_12P = {"werewolf", "villager", "seer", "witch", "hunter", "guard"}


async def mid_game(env: EnvStack, seed: int) -> tuple[CreatedEpisode, WerewolfEnv]:
    """A 12-player game, every seat external, played (first legal action) past the first night: the
    seer has inspected, the wolves have chosen, the witch has decided, and the game is still running."""
    ep = await env.client.create_episode("werewolf_v1", "12p", seed=seed, external_seats=tuple(range(12)))
    engine = env.manager.get(ep.episode_id).env
    assert isinstance(engine, WerewolfEnv) and set(engine.roles) == ROLES_12P
    seats = {s: env.client.seat(ep.episode_id, ep.seat_tokens[s]) for s in range(12)}
    for _ in range(500):
        events = engine.events
        inspected = [i for i, e in enumerate(events) if e.kind == "inspect"]
        if inspected and any(e.channel == "public" for e in events[inspected[-1] + 1 :]):
            break  # the night with an inspection is over and the day has begun
        for seat in engine.acting_seats():
            obs = await seats[seat].observation()
            if obs.your_turn:
                la = obs.legal_actions[0]
                action = common_pb2.Action(kind=la.kind, text="I am sure of nothing yet.")
                if la.targets:
                    action.target = la.targets[0]
                await seats[seat].act(obs.turn_id, action)
    assert not engine.done and any(e.kind == "inspect" for e in engine.events)
    return ep, engine


@pytest.mark.parametrize("seed", [1, 4])
async def test_grpc_seat_tokens_read_only_their_own_seat(env: EnvStack, seed: int) -> None:
    ep, engine = await mid_game(env, seed)
    for seat in range(12):
        token = ep.seat_tokens[seat]
        obs = (
            await env.client.stub.GetObservation(
                pb.GetObservationRequest(episode_id=ep.episode_id, token=token)
            )
        ).observation
        assert (obs.seat, obs.role) == (seat, engine.roles[seat])
        assert obs.text == engine.observe(seat).text  # this seat's view, not another's nor the admin's
        state = await env.client.stub.GetEpisode(pb.GetEpisodeRequest(episode_id=ep.episode_id, token=token))
        assert {s.seat: s.role for s in state.seats if s.role} == {seat: engine.roles[seat]}
        assert list(state.events) == [] and not state.done
    # The admin token sees everything (so the checks above are not passing on an empty game).
    full = await env.client.stub.GetEpisode(
        pb.GetEpisodeRequest(episode_id=ep.episode_id, token=ep.admin_token)
    )
    assert [s.role for s in full.seats] == engine.roles and any(e.kind == "inspect" for e in full.events)


async def test_a_token_opens_only_its_own_episode(env: EnvStack) -> None:
    a = await env.client.create_episode("werewolf_v1", "6p", seed=1, external_seats=(0,))
    b = await env.client.create_episode("werewolf_v1", "6p", seed=2, external_seats=(0,))
    for token in (a.seat_tokens[0], a.admin_token):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await env.client.stub.GetObservation(
                pb.GetObservationRequest(episode_id=b.episode_id, token=token)
            )
        assert err.value.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await env.client.stub.GetEpisode(pb.GetEpisodeRequest(episode_id=b.episode_id, token=token))
        assert err.value.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)


async def test_gateway_seat_tokens_read_only_their_own_seat(env: EnvStack, gateway: RunningGateway) -> None:
    ep, engine = await mid_game(env, 7)
    async with aiohttp.ClientSession(gateway.url) as http:

        async def get(path: str, token: str) -> tuple[int, Any]:
            headers = {"Authorization": f"Bearer {token}"}
            async with http.get(path, headers=headers, params={"wait_s": "0"}) as resp:
                return resp.status, await resp.json()

        for seat in range(12):
            token = ep.seat_tokens[seat]
            status, body = await get(f"/v1/episodes/{ep.episode_id}/observation", token)
            assert status == 200, body
            obs = body["observation"]
            assert (obs["seat"], obs["role"]) == (seat, engine.roles[seat])
            assert obs["text"] == engine.observe(seat).text
            status, state = await get(f"/v1/episodes/{ep.episode_id}", token)
            assert status == 200, state
            assert {s["seat"]: s["role"] for s in state["seats"] if s["role"]} == {seat: engine.roles[seat]}
            assert state["events"] == []
        status, full = await get(f"/v1/episodes/{ep.episode_id}", ep.admin_token)
        assert status == 200 and [s["role"] for s in full["seats"]] == engine.roles
