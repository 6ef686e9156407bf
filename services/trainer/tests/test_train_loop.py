"""The loop's own rules on real trajectories from in-process play: IPPO keeps one learner per policy (each
updated on its own samples), a shared policy is one learner, and stale trajectories are dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from wolfpack_inference.models import tiny_model
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.train import Trainer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model(tmp_path_factory.mktemp("models")))


def _trainer(tmp_path: Path, tiny: str, **over: Any) -> Trainer:
    data: dict[str, Any] = {
        "name": "loop",
        "game": {"id": "ultimatum_v1", "variant": "easy"},
        "policies": [
            {"id": "proposer", "seats": [0], "model": tiny, "lr": 1e-2, "value_head": True},
            {"id": "responder", "seats": [1], "model": tiny, "lr": 1e-2, "value_head": True},
        ],
        "rollout": {"episodes_per_update": 4, "group_size": 1, "max_tokens": 6, "max_prompt_tokens": 64},
        "algo": {"estimator": "gae", "lam": 0.95},
        "train": {"max_staleness": 1},
    }
    data.update(over)
    t = Trainer(TrainConfig.model_validate(data), tmp_path / "run", "redis://unused", cache_dir=tmp_path)
    t.setup()
    return t


def _params(t: Trainer, pid: str) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in t.learners[pid].model.parameters()])  # type: ignore[attr-defined]


def test_ippo_updates_each_policy_on_its_own_samples(tmp_path: Path, tiny: str) -> None:
    t = _trainer(tmp_path, tiny)
    assert t.learners["proposer"] is not t.learners["responder"]
    trajs = t.play_local(t.tasks([1, 2, 3, 4], 1, "u0"), 1.0)
    before = {p: _params(t, p) for p in t.learners}
    metrics = t.train_step(trajs)
    for pid in ("proposer", "responder"):
        assert not torch.equal(before[pid], _params(t, pid)), pid
        assert f"{pid}/actor/pg_loss" in metrics and f"{pid}/critic/vf_loss" in metrics
        assert t.learners[pid].step == 1
    assert {k for k in metrics if k.startswith("charts/") and k.endswith("win_rate")} >= {
        "charts/win_rate",
        "charts/proposer/proposer/win_rate",
        "charts/responder/responder/win_rate",
    }


def test_shared_policy_is_one_learner(tmp_path: Path, tiny: str) -> None:
    t = _trainer(tmp_path, tiny, train={"share_policy": True})
    assert t.learners["proposer"] is t.learners["responder"]


def test_stale_trajectories_are_detected(tmp_path: Path, tiny: str) -> None:
    t = _trainer(tmp_path, tiny)
    (traj,) = t.play_local(t.tasks([5], 1, "s"), 1.0)
    t.state.versions = {"proposer": 1, "responder": 1}
    assert not t._stale(traj)  # played at version 0, one behind: within max_staleness 1
    t.state.versions["responder"] = 2
    assert t._stale(traj)


def test_gigpo_finds_anchor_states_in_real_groups(tmp_path: Path, tiny: str) -> None:
    """Episodes of one group start from the same scenario: the responder's first observation is identical
    across them, so GiGPO's step-level groups are non-empty on real play."""
    t = _trainer(
        tmp_path,
        tiny,
        policies=[{"id": "responder", "seats": [1], "model": tiny, "lr": 1e-2}],
        rollout={"episodes_per_update": 8, "group_size": 4, "max_tokens": 6, "max_prompt_tokens": 64},
        algo={"estimator": "gigpo", "gigpo_gamma": 0.9},
    )
    trajs = t.play_local(t.tasks([11, 12], 4, "g"), 1.0)
    assert {tr.group_id for tr in trajs} == {"g-0", "g-1"}
    metrics = t.train_step(trajs)
    assert metrics["gigpo/anchor_groups"] >= 2
    assert 0 < metrics["gigpo/anchored_fraction"] <= 1
