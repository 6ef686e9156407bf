"""What a spec returns (``ScoreResult``) and how it is written into proto messages.

The invariant (by construction here, and asserted by the tests):

* a turn's reward is the sum of its components;
* a seat's final reward is the sum of its turns' rewards plus its terminal-only components, and
  ``seat.components[name]`` is the sum of that component over the seat's turns plus its terminal-only
  value, so the seat's components also sum to its reward.

Terminal-only components are the parts that belong to no turn: the outcome of a seat that never acted,
and the survival bonus.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from wolfpack.errors import ServiceError
from wolfpack.v1 import reward_service_pb2 as pb
from wolfpack.v1 import trajectory_pb2


class ScoreError(ServiceError, ValueError):
    """The request cannot be scored as given (bad trajectory, unknown spec, ...): INVALID_ARGUMENT."""

    code = "INVALID_ARGUMENT"  # named, not gRPC's member: the trainer's local mode scores without gRPC


@dataclass(frozen=True)
class TurnScore:
    index: int  # position in trajectory.turns
    seat: int
    components: dict[str, float]

    @property
    def reward(self) -> float:
        return math.fsum(self.components.values())


@dataclass(frozen=True)
class SeatScore:
    seat: int
    role: str
    team: str
    outcome: int  # common_pb2.OutcomeKind
    terminal: dict[str, float] = field(default_factory=dict)  # terminal-only components


@dataclass(frozen=True)
class ScoreResult:
    turns: list[TurnScore]
    seats: dict[int, SeatScore]
    #: Free-form findings (verifier mismatch, skipped bonus); copied to trajectory.metadata as "reward.<key>".
    notes: dict[str, str] = field(default_factory=dict)
    spec: str = ""

    def seat_components(self, seat: int) -> dict[str, float]:
        totals: dict[str, float] = {}
        for turn in self.turns:
            if turn.seat == seat:
                for name, value in turn.components.items():
                    totals[name] = totals.get(name, 0.0) + value
        for name, value in self.seats[seat].terminal.items():
            totals[name] = totals.get(name, 0.0) + value
        return totals

    def seat_reward(self, seat: int) -> float:
        turn_sum = math.fsum(t.reward for t in self.turns if t.seat == seat)
        return turn_sum + math.fsum(self.seats[seat].terminal.values())


def to_response(trajectory: trajectory_pb2.Trajectory, result: ScoreResult) -> pb.ScoreResponse:
    """The ScoreResponse, including a copy of the trajectory with rewards, outcomes and spec filled in."""
    resp = pb.ScoreResponse(spec=result.spec)
    for turn in result.turns:
        resp.turn_rewards.add(turn_index=turn.index, reward=turn.reward, components=turn.components)
    for seat in sorted(result.seats):
        resp.seat_rewards.add(
            seat=seat, reward=result.seat_reward(seat), components=result.seat_components(seat)
        )
    out = resp.trajectory
    out.CopyFrom(trajectory)
    out.reward_spec = result.spec
    for turn in result.turns:
        filled = out.turns[turn.index]
        filled.reward = turn.reward
        filled.reward_components.clear()
        filled.reward_components.update(turn.components)  # the trainer reads them (Turn.reward_components)
    existing = {o.seat: o for o in out.outcomes}
    for seat, score in sorted(result.seats.items()):
        outcome = existing.get(seat) or out.outcomes.add(seat=seat)
        outcome.role = outcome.role or score.role
        outcome.team = outcome.team or score.team
        outcome.outcome = score.outcome  # type: ignore[assignment]
        outcome.final_reward = result.seat_reward(seat)
    for key, value in result.notes.items():
        out.metadata[f"reward.{key}"] = value
    return resp
