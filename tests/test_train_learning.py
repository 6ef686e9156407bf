"""The learning signal, measured: GRPO on the ultimatum responder with the tiny model. After a few updates
the trained policy's win rate on held-out seeds is significantly above the initial policy's (their 95%
Wilson intervals do not overlap). Real Redis stream, real verl estimator and loss, real tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.train import learning_line, run_training


@pytest.mark.slow
def test_grpo_improves_held_out_win_rate(redis_url: str, tmp_path: Path) -> None:
    cfg = TrainConfig.model_validate(
        {
            "name": "learning-test",
            "seed": 1,
            "game": {"id": "ultimatum_v1", "variant": "easy", "bot": "heuristic"},
            "policies": [
                {"id": "responder", "seats": [1], "model": "tiny", "lr": 2e-3, "micro_batch_size": 32}
            ],
            "warmstart": {"bot": "random", "episodes": 60, "steps": 30},
            "rollout": {"episodes_per_update": 24, "group_size": 8, "max_tokens": 8, "max_prompt_tokens": 96},
            "algo": {"estimator": "grpo"},
            "loss": {"tis_cap": 2.0},
            "train": {"updates": 6},
            "eval": {"every": 100, "episodes": 48},
            "stream": {"name": f"test:learning:{tmp_path.name}"},
        }
    )
    trainer, evals = run_training(cfg, tmp_path / "run", redis_url, tmp_path / "models")
    first, last = evals[0], evals[-1]
    print(learning_line("win_rate", first, last))
    assert trainer.state.step == 6 and last.step == 6
    assert first.win_rate.n == last.win_rate.n == 48
    assert last.win_rate.lo > first.win_rate.hi, learning_line("win_rate", first, last)
    assert last.reward.mean > first.reward.mean
    assert (tmp_path / "run" / "curves.png").stat().st_size > 0
