"""Hand-built trajectories with exact token ids (exposed as fixtures: under importlib mode test modules
cannot import each other)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from wolfpack.v1 import common_pb2, trajectory_pb2

TurnSpec = tuple[int, list[int], list[int], float, str]
"""(seat, prompt ids, response ids, reward, observation text)."""


def make_trajectory(
    tid: str,
    turns: Sequence[TurnSpec],
    *,
    group: str = "g",
    roles: dict[int, str] | None = None,
    finals: dict[int, float] | None = None,
    policy: str = "p",
    version: int = 0,
) -> trajectory_pb2.Trajectory:
    traj = trajectory_pb2.Trajectory(trajectory_id=tid, group_id=group, group_size=2)
    traj.game.game_id = "ultimatum_v1"
    for i, (seat, prompt, resp, reward, obs) in enumerate(turns):
        t = traj.turns.add(index=i, seat=seat, observation_text=obs, reward=reward, valid=True)
        t.prompt_token_ids.extend(prompt)
        t.response_token_ids.extend(resp)
        t.response_logprobs.extend([-0.5] * len(resp))
        t.policy.policy_id = policy
        t.policy.version = version
    seats = sorted({t[0] for t in turns})
    for seat in seats:
        final = (finals or {}).get(seat, sum(t[3] for t in turns if t[0] == seat))
        traj.outcomes.add(
            seat=seat,
            role=(roles or {}).get(seat, "player"),
            final_reward=final,
            outcome=common_pb2.OUTCOME_KIND_WIN if final > 0 else common_pb2.OUTCOME_KIND_LOSS,
        )
    return traj


@pytest.fixture
def trajectory_factory() -> Callable[..., trajectory_pb2.Trajectory]:
    return make_trajectory


@pytest.fixture
def two_turn_episode() -> Callable[..., Any]:
    """Seat 0 acts twice with full-history prompts: prompt2 = prompt1 + response1 + observation."""

    def build(tid: str = "t1", reward: float = 1.0) -> trajectory_pb2.Trajectory:
        p1, r1 = [1, 2, 3], [4, 5]
        obs = [6, 7]
        p2, r2 = [*p1, *r1, *obs], [8, 9, 10]
        return make_trajectory(tid, [(0, p1, r1, 0.0, "o1"), (0, p2, r2, reward, "o2")])

    return build
