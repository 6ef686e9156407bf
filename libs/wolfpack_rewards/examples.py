"""Hand-built trajectories with hand-computed scores: the worked examples that the library's tests and
the reward service's tests both score (one copy, so the two suites check the same numbers).

``werewolf_trajectory``: 6-player Werewolf (seats 0-1 wolves, 2 seer, 3 witch, 4-5 villagers), 10 turns;
turn 2 (seat 2) predicts ``PREDICTION``, turn 5 is seat 2's next observation (``NEXT_OBS``), turn 6 is
invalid and defaulted. ``bargaining_scenario`` is the bargaining scenario of seed 1 (easy): the buyer
(seat 0, speaks first) has target 654 and reservation 728, the seller target 515 and reservation 471.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_games.scenarios import Scenario, generate_scenario
from wolfpack_games.scenarios.wire import scenario_to_pb

WIN, LOSS, DRAW = common_pb2.OUTCOME_KIND_WIN, common_pb2.OUTCOME_KIND_LOSS, common_pb2.OUTCOME_KIND_DRAW

ROLES = ["werewolf", "wolf_king", "seer", "witch", "villager", "villager"]
PREDICTION = "Seat 0 is a werewolf."
NEXT_OBS = "Seat 0 is a wolf."

TurnSpec = dict[str, Any]


def make_turn(index: int, seat: int, **kw: Any) -> trajectory_pb2.Turn:
    """A valid turn with placeholder texts unless ``kw`` says otherwise."""
    kw.setdefault("valid", True)
    kw.setdefault("response_text", f"turn {index}")
    kw.setdefault("observation_text", f"observation {index}")
    return trajectory_pb2.Turn(index=index, seat=seat, **kw)


def werewolf_trajectory(winner: str = "wolves") -> trajectory_pb2.Trajectory:
    """The 10-turn Werewolf example (see the module docstring); ``winner`` is the winning team."""
    specs: list[tuple[int, str, TurnSpec]] = [
        (0, "night.wolf_chat", {}),
        (1, "night.wolf_chat", {}),
        (2, "night.seer", {"response_text": f"<predict_next>{PREDICTION}</predict_next>\ninspect 0"}),
        (3, "night.witch", {}),
        (0, "day.discussion", {}),
        (2, "day.discussion", {"observation_text": NEXT_OBS}),
        (4, "day.discussion", {"valid": False, "defaulted": True, "invalid_reason": "empty"}),
        (5, "day.vote", {}),
        (1, "day.vote", {}),
        (4, "day.vote", {}),
    ]
    traj = trajectory_pb2.Trajectory(
        trajectory_id="ww-1", game=common_pb2.GameRef(game_id="werewolf_v1", variant="6p"), winner=winner
    )
    for i, (seat, phase, kw) in enumerate(specs):
        traj.turns.append(make_turn(i, seat, phase=phase, **kw))
    for seat, role in enumerate(ROLES):
        team = "wolves" if role in ("werewolf", "wolf_king") else "village"
        traj.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_POLICY)
        traj.outcomes.add(seat=seat, role=role, team=team, outcome=WIN if team == winner else LOSS)
    return traj


def bargaining_scenario() -> Scenario:
    """The bargaining scenario of seed 1, easy (its numbers are in the module docstring)."""
    return generate_scenario("bargaining", 1, "easy")


def scenario_trajectory(
    scenario: Scenario, turns: Sequence[tuple[int, str, TurnSpec]], claimed: Sequence[int] | None = None
) -> trajectory_pb2.Trajectory:
    """A bargaining trajectory of ``(seat, text, extra turn fields)`` turns; ``claimed`` are the outcomes
    the trajectory asserts (the verifier may disagree)."""
    traj = trajectory_pb2.Trajectory(
        trajectory_id="sc-1", game=common_pb2.GameRef(game_id="bargaining_v1", variant=scenario.difficulty)
    )
    traj.scenario.CopyFrom(scenario_to_pb(scenario))
    for i, (seat, text, kw) in enumerate(turns):
        kw = dict(kw)
        kw.setdefault("action", common_pb2.Action(kind="say", text=text))
        traj.turns.append(make_turn(i, seat, phase="bargaining", response_text=text, **kw))
    for seat, p in enumerate(scenario.players):
        o = traj.outcomes.add(seat=seat, role=p.role, team=p.role)
        if claimed is not None:
            o.outcome = claimed[seat]  # type: ignore[assignment]
    return traj
