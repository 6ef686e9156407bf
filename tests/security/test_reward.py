"""Regression tests over the real wire for issue 12's reward item: bounded work per Score. A trajectory
whose prediction shaping would take CPU-minutes is refused up front; long trajectories are scored in
linear time; worst-case legal calls beside normal traffic leave normal latency bounded (a ratio to an
idle run)."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack.v1 import reward_service_pb2 as pb
from wolfpack.v1 import reward_service_pb2_grpc as pb_grpc
from wolfpack_reward.server import register
from wolfpack_rewards.shaping import MAX_PREDICTION_WORK

ROLES = ["werewolf", "werewolf", "seer", "witch", "villager", "villager"]


def trajectory(turns: int, prediction: str = "", observation: str = "obs") -> trajectory_pb2.Trajectory:
    traj = trajectory_pb2.Trajectory(
        trajectory_id="t", game=common_pb2.GameRef(game_id="werewolf_v1", variant="6p"), winner="village"
    )
    for i in range(turns):
        traj.turns.add(index=i, seat=i % 6, valid=True, phase="day.discussion", observation_text=observation,
                       response_text=f"<predict_next>{prediction}</predict_next> vote 1" if prediction else "vote 1")  # fmt: skip
    for seat, role in enumerate(ROLES):
        team = "wolves" if role == "werewolf" else "village"
        traj.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_POLICY)
        win = common_pb2.OUTCOME_KIND_WIN if team == "village" else common_pb2.OUTCOME_KIND_LOSS
        traj.outcomes.add(seat=seat, role=role, team=team, outcome=win)
    return traj


@pytest.fixture
async def stub() -> AsyncIterator[pb_grpc.RewardServiceStub]:
    settings = load_settings(rpc_timeout_s=60)
    server = await rpc.start_server("reward", register, settings, "127.0.0.1:0")
    channel = rpc.channel(f"127.0.0.1:{server.port}", settings)
    async with channel:
        yield pb_grpc.RewardServiceStub(channel)
    await server.stop(0)


async def test_a_prediction_bomb_is_refused_before_any_work(stub: pb_grpc.RewardServiceStub) -> None:
    """3,000 turns of 2,000-character predictions and observations: ~20 CPU-minutes of difflib before."""
    bomb = trajectory(3000, prediction="wolf " * 400, observation="seat " * 400)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Score(pb.ScoreRequest(trajectory=bomb, spec="werewolf_shaped"), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "trajectory.turns" in (err.value.details() or "")


async def test_many_turns_with_predictions_score_in_linear_time(stub: pb_grpc.RewardServiceStub) -> None:
    """30,000 turns each predicting: the old next-observation scan was quadratic in turns (minutes);
    the 30 s deadline is the bound."""
    long = trajectory(30_000, prediction="x", observation="y")
    resp = await stub.Score(pb.ScoreRequest(trajectory=long, spec="werewolf_shaped"), timeout=30)
    assert len(resp.turn_rewards) == 30_000


async def test_worst_case_legal_scores_beside_normal_traffic(stub: pb_grpc.RewardServiceStub) -> None:
    """Normal Score latency while worst-case legal calls (just under the work limit) run, as a ratio to
    an idle run; a generous bound, since the suite shares two cores and the GIL."""
    normal = pb.ScoreRequest(trajectory=trajectory(40, prediction="seat 3 dies"), spec="werewolf_shaped")
    side = int((MAX_PREDICTION_WORK // 6) ** 0.5)  # six predicting turns of side x side characters
    heavy = pb.ScoreRequest(
        trajectory=trajectory(12, prediction="ab" * (side // 2), observation="ba" * (side // 2)),
        spec="werewolf_shaped",
    )

    async def latencies(n: int) -> list[float]:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            await stub.Score(normal)
            out.append(time.perf_counter() - t)
        return out

    await stub.Score(normal)
    idle = statistics.median(await latencies(7))
    abusers = [asyncio.ensure_future(stub.Score(heavy, timeout=120))]
    await asyncio.sleep(0.2)  # the heavy calls are running
    busy = statistics.median(await latencies(7))
    done = await asyncio.gather(*abusers)
    assert all(len(d.turn_rewards) == 12 for d in done)
    assert busy / idle < 40, (idle, busy)
