"""A trivial Score beside clients looping Score calls near the 64 MiB message limit (issue 20: three such
clients held a trivial Score at 5 s). Such calls (more than ``HEAVY_TURNS`` turns) are scored, and their
response built, in the reward service's one-thread heavy pool, so they queue behind each other instead of
splitting the GIL with the event loop three ways. Real server over gRPC; the bounds are generous absolute
latencies on a shared two-core box (before: median 0.24 s, max 6.8 s; after: median ~15 ms, max ~60 ms)."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator

import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack.v1 import reward_service_pb2 as pb
from wolfpack.v1 import reward_service_pb2_grpc as pb_grpc
from wolfpack_reward.server import HEAVY_TURNS, register

ROLES = ["werewolf", "werewolf", "seer", "witch", "villager", "villager"]


def _trajectory(turns: int, observation: str = "obs") -> trajectory_pb2.Trajectory:
    traj = trajectory_pb2.Trajectory(
        trajectory_id="t", game=common_pb2.GameRef(game_id="werewolf_v1", variant="6p"), winner="village"
    )
    for i in range(turns):
        traj.turns.add(
            index=i, seat=i % 6, valid=True, phase="day.discussion", observation_text=observation,
            response_text="vote 1",
        )  # fmt: skip
    for seat, role in enumerate(ROLES):
        team = "wolves" if role == "werewolf" else "village"
        traj.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_POLICY)
        win = common_pb2.OUTCOME_KIND_WIN if team == "village" else common_pb2.OUTCOME_KIND_LOSS
        traj.outcomes.add(seat=seat, role=role, team=team, outcome=win)
    return traj


@pytest.fixture
async def target() -> AsyncIterator[str]:
    server = await rpc.start_server("reward", register, load_settings(rpc_timeout_s=120), "127.0.0.1:0")
    yield f"127.0.0.1:{server.port}"
    await server.stop(0)


async def test_a_trivial_score_beside_three_clients_looping_60_mb_scores(target: str) -> None:
    settings = load_settings(rpc_timeout_s=120)
    big = pb.ScoreRequest(trajectory=_trajectory(60_000, observation="o" * 1000), spec="werewolf_shaped")
    assert big.ByteSize() > 60_000_000 and len(big.trajectory.turns) > HEAVY_TURNS
    normal = pb.ScoreRequest(trajectory=_trajectory(40), spec="werewolf_shaped")
    stop = asyncio.Event()
    answered: list[int] = []

    async def abuser() -> None:
        async with rpc.channel(target, settings) as channel:
            stub = pb_grpc.RewardServiceStub(channel)
            while not stop.is_set():
                resp = await stub.Score(big, timeout=120)
                answered.append(len(resp.turn_rewards))

    async with rpc.channel(target, settings) as channel:
        stub = pb_grpc.RewardServiceStub(channel)
        await stub.Score(normal)
        abusers = [asyncio.ensure_future(abuser()) for _ in range(3)]
        await asyncio.sleep(3.0)  # the three are sending, parsing and scoring their calls
        latencies = []
        for _ in range(10):
            t = time.perf_counter()
            resp = await stub.Score(normal, timeout=30)
            latencies.append(time.perf_counter() - t)
            assert len(resp.turn_rewards) == 40
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*abusers)
    assert answered and set(answered) == {60_000}, "the large calls must still be answered"
    assert statistics.median(latencies) < 0.15 and max(latencies) < 1.5, latencies
