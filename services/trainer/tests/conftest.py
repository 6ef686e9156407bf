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


def two_seat_ultimatum(model: str, estimator: str, **train: Any) -> Any:
    """A ``TrainConfig``: ultimatum ``easy``, proposer (seat 0) and responder (seat 1) as two policy ids with
    the same CPU-learner settings, 4 episodes in groups of 2, KL to the reference and truncated IS on; ``train``
    is the ``train`` section (``share_policy``, ``parallel_learners``...)."""
    from wolfpack_trainer.config import TrainConfig

    policy: dict[str, Any] = {
        "model": model, "lr": 1e-2, "value_head": estimator == "gae", "mini_batch_size": 4, "ppo_epochs": 2,
    }  # fmt: skip
    return TrainConfig.model_validate(
        {
            "name": "two-seats",
            "game": {"id": "ultimatum_v1", "variant": "easy"},
            "policies": [
                {"id": "proposer", "seats": [0], **policy},
                {"id": "responder", "seats": [1], **policy},
            ],
            "rollout": {
                "episodes_per_update": 4,
                "group_size": 2,
                "max_tokens": 8,
                "max_prompt_tokens": 1500,
            },
            "algo": {"estimator": estimator, "lam": 0.95},
            "loss": {"kl_coef": 0.04, "kl_type": "low_var_kl", "tis_cap": 2.0},
            "batch": {"layout": "turn", "group_by": ["group", "role"]},
            "train": {"max_staleness": 1, **train},
        }
    )


@pytest.fixture
def two_seat_config() -> Callable[..., Any]:
    """``two_seat_ultimatum`` (a fixture: under importlib mode test modules cannot import each other)."""
    return two_seat_ultimatum
