"""Typed asyncio client of the curriculum service, and ``outcome_of``: a finished ``Trajectory`` as the
``TaskOutcome`` the curriculum and its league learn from (the same function the service applies to the
entries it reads from the trajectory stream, so RPC and stream reports agree)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack.v1 import curriculum_service_pb2 as pb

if TYPE_CHECKING:
    from wolfpack.settings import Settings
    from wolfpack.v1 import curriculum_service_pb2_grpc as pb_grpc

FINGERPRINT_CHARS = 2000
"""Cap on a failure fingerprint's length (the head of the trainee's opening prompt or the scenario)."""


def trainee_seats(traj: trajectory_pb2.Trajectory) -> list[int]:
    """The trajectory's ``trainee_seats``; when empty, every POLICY seat."""
    if traj.trainee_seats:
        return list(traj.trainee_seats)
    return [b.seat for b in traj.seats if b.controller == common_pb2.SEAT_CONTROLLER_POLICY]


def fingerprint_of(traj: trajectory_pb2.Trajectory, cap: int = FINGERPRINT_CHARS) -> str:
    """The failure fingerprint: the scenario text for scenario games, else the first trainee turn's
    observation (its opening prompt), capped at ``cap`` characters."""
    if traj.HasField("scenario"):
        sc = traj.scenario
        return " ".join([sc.public_text] + [p.brief for p in sc.players])[:cap]
    seats = set(trainee_seats(traj))
    for turn in traj.turns:
        if turn.seat in seats and turn.observation_text:
            return turn.observation_text[:cap]
    return f"{traj.game.game_id}/{traj.game.variant}#{traj.seed}"[:cap]


def outcome_of(traj: trajectory_pb2.Trajectory) -> pb.TaskOutcome:
    """The trainee side's result in a scored trajectory: win if any trainee seat won (a team game's seats
    share the result), score 1 / 0.5 / 0 for win / draw / loss, mean final reward over trainee seats."""
    seats = set(trainee_seats(traj))
    outs = [o for o in traj.outcomes if o.seat in seats]
    kinds = {int(o.outcome) for o in outs}
    aborted = bool(traj.metadata.get("truncated")) or not outs or kinds <= {
        common_pb2.OUTCOME_KIND_ABORTED, common_pb2.OUTCOME_KIND_UNSPECIFIED
    }  # fmt: skip
    win = common_pb2.OUTCOME_KIND_WIN in kinds
    draw = not win and common_pb2.OUTCOME_KIND_DRAW in kinds
    invalid = sum(1 for t in traj.turns if t.seat in seats and (not t.valid or t.defaulted))
    kind_name = traj.metadata.get("opponent_kind", "")
    kind = pb.OpponentKind.Value(kind_name) if kind_name in pb.OpponentKind.keys() else 0  # noqa: SIM118
    return pb.TaskOutcome(
        task_id=traj.task_id, bucket=traj.metadata.get("bucket", ""),
        mean_reward=sum(o.final_reward for o in outs) / len(outs) if outs else 0.0,
        success=win and not aborted, invalid_actions=invalid, trajectory_id=traj.trajectory_id,
        score=0.0 if aborted else 1.0 if win else 0.5 if draw else 0.0,
        opponent_id=traj.metadata.get("opponent_id", ""), opponent_kind=kind,  # type: ignore[arg-type]
        fingerprint=fingerprint_of(traj), aborted=aborted,
    )  # fmt: skip


class CurriculumClient:
    """Connects to ``target`` (host:port); use ``async with CurriculumClient(...) as curriculum``."""

    def __init__(self, target: str, settings: Settings | None = None) -> None:
        # gRPC, the telemetry SDK and settings load with the first client, not with this module:
        # ``outcome_of`` and ``trainee_seats`` are used by purely local commands (``wolfpack play``'s CLI).
        from wolfpack import rpc
        from wolfpack.settings import load_settings
        from wolfpack.v1 import curriculum_service_pb2_grpc as pb_grpc

        self.settings = settings or load_settings()
        self.channel = rpc.channel(target, self.settings)
        self.stub: pb_grpc.CurriculumServiceAsyncStub = pb_grpc.CurriculumServiceStub(self.channel)

    async def __aenter__(self) -> CurriculumClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def next_tasks(self, count: int, split: str = "train", worker_id: str = "") -> list[pb.Task]:
        resp = await self.stub.NextTasks(pb.NextTasksRequest(count=count, split=split, worker_id=worker_id))
        return list(resp.tasks)

    async def report_outcomes(self, outcomes: Sequence[pb.TaskOutcome]) -> int:
        resp = await self.stub.ReportOutcomes(pb.ReportOutcomesRequest(outcomes=outcomes))
        return resp.recorded

    async def get_stats(self) -> pb.GetStatsResponse:
        return await self.stub.GetStats(pb.GetStatsRequest())

    async def register_opponent(self, opponent: pb.Opponent) -> pb.RegisterOpponentResponse:
        return await self.stub.RegisterOpponent(pb.RegisterOpponentRequest(opponent=opponent))

    async def list_opponents(self) -> pb.ListOpponentsResponse:
        return await self.stub.ListOpponents(pb.ListOpponentsRequest())
