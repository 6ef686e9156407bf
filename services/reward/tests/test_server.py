"""The reward service over real gRPC (a server on 127.0.0.1:0 per test)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import wolfpack_rewards
from wolfpack import telemetry
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack.v1 import reward_service_pb2 as pb
from wolfpack.v1 import reward_service_pb2_grpc as pb_grpc
from wolfpack_games.scenarios import Scenario

Stub = pb_grpc.RewardServiceStub
RATIO = 34 / 38  # see test_specs.py


async def test_score_werewolf_default_spec(stub: Stub, ww: Callable[..., trajectory_pb2.Trajectory]) -> None:
    resp = await stub.Score(pb.ScoreRequest(trajectory=ww()))
    assert resp.spec == resp.trajectory.reward_spec == "werewolf_shaped@1"
    rewards = {s.seat: s.reward for s in resp.seat_rewards}
    assert rewards == pytest.approx({0: 1, 1: 1, 2: -1 + 0.2 * RATIO, 3: -1, 4: -1.1, 5: -1})
    turns = [t.reward for t in resp.turn_rewards]
    assert turns == pytest.approx([0, 0, 0.2 * RATIO, -1, 1, -1, -0.1, -1, 1, -1])
    assert dict(resp.turn_rewards[6].components) == pytest.approx({"invalid_penalty": -0.1})
    assert [t.reward for t in resp.trajectory.turns] == pytest.approx(turns)
    assert {o.seat: o.final_reward for o in resp.trajectory.outcomes} == pytest.approx(rewards)
    # Invariant over the wire (float32): seat reward = sum of its turn rewards (no terminal-only parts here).
    for seat, reward in rewards.items():
        own = [t.reward for t in resp.turn_rewards if resp.trajectory.turns[t.turn_index].seat == seat]
        assert sum(own) == pytest.approx(reward, abs=1e-5)


async def test_score_bargaining_named_spec(
    stub: Stub, bargaining: Scenario, sc_traj: Callable[..., trajectory_pb2.Trajectory]
) -> None:
    turns = [(0, "FINAL_BID: 600", {}), (1, "Deal.\nACCEPT", {})]
    traj = sc_traj(bargaining, turns, [common_pb2.OUTCOME_KIND_DRAW, common_pb2.OUTCOME_KIND_DRAW])
    resp = await stub.Score(pb.ScoreRequest(trajectory=traj, spec="scenario_verified"))
    assert resp.spec == "scenario_verified@1"
    assert {s.seat: s.reward for s in resp.seat_rewards} == {0: 1.0, 1: 1.0}
    assert [o.outcome for o in resp.trajectory.outcomes] == [common_pb2.OUTCOME_KIND_WIN] * 2  # verifier wins
    assert "seat 0: trajectory OUTCOME_KIND_DRAW" in resp.trajectory.metadata["reward.verifier_mismatch"]
    assert resp.trajectory.metadata["reward.verifier"].startswith("deal at 600")


async def test_the_service_answers_what_the_library_computes(
    stub: Stub, ww: Callable[..., trajectory_pb2.Trajectory], bargaining: Scenario,
    sc_traj: Callable[..., trajectory_pb2.Trajectory],
) -> None:  # fmt: skip
    """The server is an adapter: its response is ``wolfpack_rewards.score``'s, field for field."""
    deal = sc_traj(bargaining, [(0, "<predict_next>ok</predict_next> FINAL_BID: 600", {}), (1, "ACCEPT", {})])
    for traj, spec in [(ww(), ""), (ww("village"), "werewolf_outcome"), (deal, "scenario_shaped@1")]:
        resp = await stub.Score(pb.ScoreRequest(trajectory=traj, spec=spec))
        assert resp == wolfpack_rewards.score(traj, spec)


@pytest.mark.parametrize(
    ("mutate", "spec", "message"),
    [
        (lambda t: t.ClearField("turns"), "", "no turns"),
        (
            lambda t: None,
            "werewolf_outcome@7",
            "unknown reward spec 'werewolf_outcome@7'; valid: bargaining_selfplay@1, scenario_shaped@1",
        ),
        (lambda t: setattr(t.game, "game_id", "chess_v1"), "", "no default reward spec for game 'chess_v1'"),
        (lambda t: setattr(t.turns[0], "seat", 7), "", "turn 0 is by seat 7"),
        (
            lambda t: setattr(t.game, "game_id", "bargaining_v1"),
            "",
            "needs its scenario (Trajectory.scenario)",
        ),
        (
            lambda t: setattr(t.game, "game_id", "bargaining_v1"),
            "werewolf_outcome@1",
            "not game 'bargaining_v1'",
        ),
    ],
)
async def test_bad_input_is_invalid_argument(
    stub: Stub,
    ww: Callable[..., trajectory_pb2.Trajectory],
    mutate: Callable[[trajectory_pb2.Trajectory], None],
    spec: str,
    message: str,
) -> None:
    traj = ww()
    mutate(traj)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Score(pb.ScoreRequest(trajectory=traj, spec=spec))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (err.value.details() or "")


async def test_missing_trajectory(stub: Stub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Score(pb.ScoreRequest(spec="werewolf_outcome@1"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "trajectory is required" in (err.value.details() or "")


async def test_list_reward_specs(stub: Stub) -> None:
    resp = await stub.ListRewardSpecs(pb.ListRewardSpecsRequest())
    by_key = {s.spec: s for s in resp.specs}
    assert {"werewolf_outcome@1", "werewolf_shaped@1", "scenario_verified@1", "scenario_shaped@1"} <= set(
        by_key
    )
    assert list(by_key["werewolf_outcome@1"].game_ids) == ["werewolf_v1"]
    assert "bargaining_v1" in by_key["scenario_shaped@1"].game_ids
    assert "predict_next" in by_key["werewolf_shaped@1"].description


@pytest.mark.tracing_sdk
async def test_score_span_continues_the_callers_trace(
    stub: Stub, ww: Callable[..., trajectory_pb2.Trajectory]
) -> None:
    exporter = InMemorySpanExporter()
    telemetry.setup_telemetry("tests", exporter=exporter)
    with telemetry.tracer("tests").start_as_current_span("caller") as caller:
        await stub.Score(pb.ScoreRequest(trajectory=ww(), spec="werewolf_outcome"))
    [span] = [s for s in exporter.get_finished_spans() if s.name == "score"]
    assert span.context.trace_id == caller.get_span_context().trace_id
    assert dict(span.attributes or {}) == {
        "wolfpack.game": "werewolf_v1",
        "wolfpack.trajectory_id": "ww-1",
        "wolfpack.turns": 10,
        "wolfpack.reward_spec": "werewolf_outcome@1",
    }
