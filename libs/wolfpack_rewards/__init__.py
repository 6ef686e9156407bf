"""Reward specs as a library: named, versioned ``score(trajectory, config)`` functions (outcome, credit,
shaping) over ``Trajectory`` protos, with no I/O.

Why a library: the reward service (its gRPC adapter), the trainer's in-process rollout and the verl agent
loop all score trajectories, and a spec's ``name@version`` must mean the same numbers on every path. Each
of them calls this code; none keeps a copy.
"""

from __future__ import annotations

from wolfpack.v1 import reward_service_pb2, trajectory_pb2
from wolfpack_rewards.result import ScoreError, ScoreResult, to_response
from wolfpack_rewards.specs import SPECS, RewardSpec, get_spec, load_specs, resolve_spec

__all__ = [
    "SPECS",
    "RewardSpec",
    "ScoreError",
    "ScoreResult",
    "get_spec",
    "load_specs",
    "resolve_spec",
    "score",
    "to_response",
]


def score(trajectory: trajectory_pb2.Trajectory, spec: str = "") -> reward_service_pb2.ScoreResponse:
    """What ``RewardService.Score(trajectory, spec)`` answers, computed in process: ``spec`` is
    ``name@version``, ``name`` (its latest version) or empty (the game's default spec). Bad input raises
    ``ScoreError`` with the message the service would send."""
    return to_response(trajectory, resolve_spec(spec, trajectory.game.game_id).score(trajectory))
