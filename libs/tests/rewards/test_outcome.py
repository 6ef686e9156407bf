"""outcome.py against hand-written expectations: who won is derived from the winner for both sides, a
derived outcome is not a "mismatch", and the verifier reads what the player actually sent."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_rewards.outcome import transcript_of
from wolfpack_rewards.specs import get_spec

WW = Callable[..., trajectory_pb2.Trajectory]
# ROLES of the conftest trajectory: seats 0 and 1 are wolves, 2-5 the village.
VILLAGE_WINS = {0: -1, 1: -1, 2: 1, 3: 1, 4: 1, 5: 1}


@pytest.mark.parametrize("winner", ["village", "wolves"])
def test_unspecified_outcomes_are_derived_for_either_winner(ww: WW, winner: str) -> None:
    traj = ww(winner)
    for o in traj.outcomes:
        o.outcome = common_pb2.OUTCOME_KIND_UNSPECIFIED
    result = get_spec("werewolf_outcome@1").score(traj)
    expected = VILLAGE_WINS if winner == "village" else {s: -v for s, v in VILLAGE_WINS.items()}
    assert {s: result.seat_reward(s) for s in result.seats} == expected
    assert not any(k.startswith("outcome_mismatch") for k in result.notes)  # derived, not contradicted


def test_transcript_prefers_what_was_said_over_the_parsed_action() -> None:
    traj = trajectory_pb2.Trajectory()
    said = traj.turns.add(seat=0, valid=True, response_text="FINAL_BID: 97")
    said.action.text = "FINAL_BID: 97.0"
    parsed_only = traj.turns.add(seat=1, valid=True)
    parsed_only.action.text = "ACCEPT"
    defaulted = traj.turns.add(seat=0, valid=False, defaulted=True, response_text="garbage")
    defaulted.action.text = "WALK_AWAY"
    traj.turns.add(seat=1, valid=False, response_text="also garbage")  # re-prompted: not in the record
    assert transcript_of(traj) == [(0, "FINAL_BID: 97"), (1, "ACCEPT"), (0, "WALK_AWAY")]
