"""Each evaluation keeps a few of its episodes as ``Trajectory`` files in the run dir (the web view's training
page replays them): written by a real short CPU run with the tiny model, bounded in count, replaced whole when
an evaluation at the same step runs again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from wolfpack.v1 import trajectory_pb2
from wolfpack_inference.models import tiny_model
from wolfpack_trainer import evaluate as ev
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.train import run_training


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model(tmp_path_factory.mktemp("models")))


def test_a_short_run_keeps_each_evaluations_first_episodes(tmp_path: Path, tiny: str, redis_url: str) -> None:
    cfg = TrainConfig.model_validate(
        {
            "name": "episodes",
            "game": {"id": "ultimatum_v1", "variant": "easy"},
            "policies": [{"id": "responder", "seats": [1], "model": tiny, "lr": 1e-3}],
            "rollout": {"episodes_per_update": 4, "group_size": 2, "max_tokens": 4, "max_prompt_tokens": 48},
            "stream": {"name": f"wolfpack:test:episodes:{tmp_path.name}"},
            "train": {"updates": 1},
            "eval": {"every": 1, "episodes": ev.SAVED_EPISODES + 2},
        }
    )
    run = tmp_path / "run"
    _, evals = run_training(cfg, run, redis_url, tmp_path / "models")
    assert [e.step for e in evals] == [0, 1]
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["update_000000", "update_000001"]
    seeds = ev.eval_seeds(cfg)
    for res in evals:
        files = sorted(ev.episodes_dir(run, res.step).iterdir())
        # bounded: 6 episodes were evaluated, 4 kept, the first ones in seed order
        assert [p.name for p in files] == [f"episode_{i:02d}.pb" for i in range(ev.SAVED_EPISODES)]
        trajs = [trajectory_pb2.Trajectory.FromString(p.read_bytes()) for p in files]
        assert [t.seed for t in trajs] == seeds[: ev.SAVED_EPISODES]
        assert [t.trajectory_id for t in trajs] == [t.trajectory_id for t in res.trajectories[: len(trajs)]]
        for traj in trajs:  # what the replay page shows: the trainee's turns with tokens and logprobs
            mine = [t for t in traj.turns if t.policy.policy_id == "responder"]
            assert mine and all(len(t.response_logprobs) == len(t.response_token_ids) > 0 for t in mine)
            assert traj.outcomes


def test_saving_again_at_a_step_replaces_the_files_and_drops_extras(
    tmp_path: Path, trajectory_factory: Callable[..., trajectory_pb2.Trajectory]
) -> None:
    trajs = [trajectory_factory(f"t{i}", [(1, [1], [2], 1.0, "o")]) for i in range(6)]
    first = ev.save_episodes(tmp_path, 5, trajs)
    assert [p.name for p in first] == ["episode_00.pb", "episode_01.pb", "episode_02.pb", "episode_03.pb"]
    (ev.episodes_dir(tmp_path, 5) / "notes.txt").write_text("mine")  # not ours: left alone
    again = ev.save_episodes(tmp_path, 5, trajs[4:])
    names = sorted(p.name for p in ev.episodes_dir(tmp_path, 5).iterdir())
    assert names == ["episode_00.pb", "episode_01.pb", "notes.txt"]  # no stale episode_02/03, no temp files
    assert [trajectory_pb2.Trajectory.FromString(p.read_bytes()).trajectory_id for p in again] == ["t4", "t5"]
    assert ev.save_episodes(tmp_path, 6, trajs, limit=0) == []
