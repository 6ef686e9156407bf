"""Protections of the environment service over the wire: gRPC message-size limits, the per-seat act rate,
the finished-episode TTL and the turn timeout that plays a default action. Clocks are fake (the session
manager's ``time``), so every bound is exact and nothing here depends on the machine's speed."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack.v1 import environment_service_pb2_grpc as pb_grpc
from wolfpack_environment.server import EnvironmentServicer, register
from wolfpack_environment.sessions import EpisodeManager, Limits

from .conftest import WAIT_S, EnvStack, FakeClock

# A broken build may hang (a stuck event loop) instead of failing: bound each test.
pytestmark = pytest.mark.timeout(120)

MIB = 1024 * 1024


def act_of_size(size: int) -> pb.ActRequest:
    """An ActRequest whose serialized size is exactly ``size`` bytes."""
    request = pb.ActRequest(episode_id="e", token="t")
    request.raw_text = "x" * (size - request.ByteSize() - 4)
    while request.ByteSize() < size:
        request.raw_text += "x"
    assert request.ByteSize() == size
    return request


async def test_messages_over_the_size_limit_are_refused_by_server_and_client() -> None:
    settings = load_settings(grpc_max_message_mb=1)
    servicer = EnvironmentServicer(EpisodeManager(Limits(max_text_chars=4 * MIB)))
    server = await rpc.start_server("environment", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    target = f"127.0.0.1:{server.port}"
    big, small = act_of_size(MIB + 1), act_of_size(MIB)  # one byte over the limit, and exactly at it
    try:
        # A client without limits of its own: the server refuses the message itself.
        unlimited = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        async with grpc.aio.insecure_channel(target, options=unlimited) as raw:
            stub = pb_grpc.EnvironmentServiceStub(raw)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Act(big, timeout=WAIT_S)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            with pytest.raises(grpc.aio.AioRpcError) as err:  # at the limit: reaches the service
                await stub.Act(small, timeout=WAIT_S)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND  # no episode "e"
        # Our own channel applies the same limit before sending.
        async with rpc.channel(target, settings) as ours:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await pb_grpc.EnvironmentServiceStub(ours).Act(big)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await server.stop(0)


@pytest.fixture
def limits() -> Limits:
    return Limits(max_episodes=100, max_text_chars=2_000, acts_per_second=1.0, burst=3, finished_ttl_s=60.0)


async def test_acts_per_seat_are_rate_limited(env: EnvStack, clock: FakeClock) -> None:
    ep = await env.client.create_episode("werewolf_v1", "6p", seed=1, external_seats=(0, 1))
    seat0, seat1 = (env.client.seat(ep.episode_id, ep.seat_tokens[s]) for s in (0, 1))
    stale = common_pb2.Action(kind="pass")

    async def act_code(seat: object) -> grpc.StatusCode:
        try:
            await seat.act(10_000, stale)  # type: ignore[attr-defined]  # never a real turn: refused after the rate check
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    burst = [await act_code(seat0) for _ in range(3)]
    assert grpc.StatusCode.RESOURCE_EXHAUSTED not in burst
    assert await act_code(seat0) == grpc.StatusCode.RESOURCE_EXHAUSTED  # the 4th act in the same instant
    assert await act_code(seat1) != grpc.StatusCode.RESOURCE_EXHAUSTED  # per seat: others unaffected
    clock.advance(1.0)  # one second refills one act
    assert await act_code(seat0) != grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await act_code(seat0) == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_finished_episodes_stay_readable_for_their_ttl_then_go(env: EnvStack, clock: FakeClock) -> None:
    ep = await env.client.create_episode("werewolf_v1", "6p", seed=2)  # all seats scripted: plays to the end
    state = await env.client.get_episode(ep.episode_id, ep.admin_token)
    assert state.done and state.winner

    clock.advance(59.0)
    await env.client.create_episode("werewolf_v1", "6p", seed=3)  # any create collects expired episodes
    assert (await env.client.get_episode(ep.episode_id, ep.admin_token)).done  # 59 s < 60 s: still kept

    clock.advance(2.0)
    await env.client.create_episode("werewolf_v1", "6p", seed=4)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.client.get_episode(ep.episode_id, ep.admin_token)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "60s" in (err.value.details() or "")


async def test_a_silent_seat_gets_the_default_action_at_its_deadline(env: EnvStack, clock: FakeClock) -> None:
    ep = await env.client.create_episode(
        "werewolf_v1", "6p", seed=5, external_seats=tuple(range(6)), turn_timeout_s=30.0
    )
    sessions = {s: env.client.seat(ep.episode_id, ep.seat_tokens[s]) for s in range(6)}
    waiting = {s: obs for s in range(6) if (obs := await sessions[s].observation()).your_turn}
    assert waiting

    clock.advance(29.0)
    # The sweeper's own check, run now at the fake 29 s (rather than sleeping and hoping it ran): nothing due.
    assert env.manager.expire(clock.monotonic()) == 0
    for seat, obs in waiting.items():  # before the deadline nothing was played for them
        assert (await sessions[seat].observation()).turn_id == obs.turn_id

    def admin_events() -> object:
        return env.client.stub.GetEpisode(
            pb.GetEpisodeRequest(episode_id=ep.episode_id, token=ep.admin_token)
        )

    before = len((await admin_events()).events)  # type: ignore[attr-defined]
    clock.advance(2.0)
    seat, obs = next(iter(waiting.items()))

    async def moved_on() -> None:
        while (await sessions[seat].observation()).turn_id == obs.turn_id:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(moved_on(), timeout=WAIT_S)
    # The agent answers late: its turn was played for it, and it is told so (no second move).
    late = await sessions[seat].act(obs.turn_id, common_pb2.Action(kind="pass"))
    assert late.defaulted and late.duplicate and "timed out" in late.reason
    played = (await admin_events()).events[before:]  # type: ignore[attr-defined]
    assert any(e.actor == seat for e in played)  # the default action is in the log as the seat's move
