"""The learning line of a model trained elsewhere (``wolfpack_trainer.learning``), from two real
evaluation-only runs (``train.updates: 0``, local mode, tiny model, CPU): the start run warm-starts the
configured model and measures the base model beside it; the final run evaluates a checkpoint *directory*
(``policies.0.model=<dir>``, no warm start). Evaluating the start's own clone directory that way must
reproduce the start's update-0 evaluation exactly (same seeds, same sampling), and evaluating the
un-warm-started model must reproduce the start run's base reference, so the summary compares the very
numbers each model gets in a ``wolfpack train`` run."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from wolfpack.v1 import trajectory_pb2
from wolfpack_inference.models import tiny_model
from wolfpack_trainer import evaluate as ev
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.learning import LearningError, main, step0, summary_lines
from wolfpack_trainer.train import run_training


def _config(tiny: Path, stream: str) -> dict[str, Any]:
    return {
        "name": "learning-two-runs",
        "game": {"id": "ultimatum_v1", "variant": "easy", "bot": "heuristic"},
        "policies": [
            {"id": "responder", "seats": [1], "model": str(tiny), "lr": 1e-3, "micro_batch_size": 8}
        ],
        "rollout": {
            "mode": "local",
            "episodes_per_update": 4,
            "group_size": 2,
            "max_tokens": 6,
            "max_prompt_tokens": 64,
        },
        "warmstart": {"bot": "heuristic", "episodes": 16, "steps": 60},
        "train": {"updates": 0},
        "eval": {"every": 100, "episodes": 6},
        "stream": {"name": stream},
    }


def _answers(directory: Path) -> list[tuple[int, list[int]]]:
    """(seed, response ids) of every policy turn of the episodes an evaluation kept."""
    files = sorted(directory.glob("episode_*.pb"))
    assert files, directory
    trajs = [trajectory_pb2.Trajectory.FromString(p.read_bytes()) for p in files]
    return [
        (t.seed, list(turn.response_token_ids)) for t in trajs for turn in t.turns if turn.policy.policy_id
    ]


def _evaluate_dir(data: dict[str, Any], model: str, run: Path, redis_url: str, cache: Path) -> None:
    """What the script's final evaluation does: the config with the model swapped for a directory."""
    final = {**data, "warmstart": None, "policies": [{**data["policies"][0], "model": model}]}
    _, evals = run_training(TrainConfig.model_validate(final), run, redis_url, cache)
    assert [e.step for e in evals] == [0] and evals[0].base is None


@pytest.mark.slow
def test_summary_of_two_evaluation_only_runs(redis_url: str, tmp_path: Path, capsys: Any) -> None:
    tiny = tiny_model(tmp_path / "models")
    data = _config(tiny, f"test:learning:{os.getpid()}:{time.monotonic_ns()}")
    cfg, cache = TrainConfig.model_validate(data), tmp_path / "cache"
    start = tmp_path / "start"
    trainer, evals = run_training(cfg, start, redis_url, cache)
    clone = trainer.state.model_path  # the warm start's clone directory, the start model
    assert Path(clone).parent == cache and evals[0].base is not None

    same, base = tmp_path / "final-clone", tmp_path / "final-base"
    _evaluate_dir(data, clone, same, redis_url, cache)
    _evaluate_dir(data, str(tiny), base, redis_url, cache)
    s0, c0, b0 = step0(start), step0(same), step0(base)
    for key in ("eval/win_rate", "eval/win_rate_lo", "eval/win_rate_hi", "eval/reward_mean"):
        assert c0[key] == s0[key], key  # the clone's directory evaluated alone: the start's update 0
    assert b0["eval/win_rate"] == s0["reference/base/win_rate"]  # the base model: the start's base line
    assert b0["eval/reward_mean"] == s0["reference/base/reward_mean"]
    assert s0["eval/win_rate"] != b0["eval/win_rate"]  # the clone and the base play differently here
    # each evaluation's wall time and its episodes' split, logged beside its numbers
    assert s0["perf/eval_s"] > 0 and s0["perf/eval_base_s"] > 0 and b0["perf/eval_s"] > 0
    for run in (s0, b0):
        assert run["perf/eval_episode_s"] >= run["perf/eval_episode_generate_s"] > 0, run
    assert s0["perf/eval_base_episode_s"] >= s0["perf/eval_base_episode_generate_s"] > 0, s0
    # token for token: the directory's episodes are the start's update-0 episodes, the base's its base ones
    assert _answers(ev.episodes_dir(same, 0)) == _answers(ev.episodes_dir(start, 0))
    assert _answers(ev.episodes_dir(base, 0)) == _answers(ev.base_episodes_dir(start))
    assert _answers(ev.episodes_dir(base, 0)) != _answers(ev.episodes_dir(start, 0))

    lines = summary_lines(cfg, start, base)
    w = evals[0].win_rate
    learning = lines[-1]
    assert learning.startswith(f"learning: win_rate {w.mean:.2f} -> {b0['eval/win_rate']:.2f} on 6 held-out")
    assert learning.endswith(f"(95% CI {b0['eval/win_rate_lo']:.2f}..{b0['eval/win_rate_hi']:.2f})")
    assert f"reference: initial win_rate {w.mean:.2f} (95% CI {w.lo:.2f}..{w.hi:.2f})" in lines
    assert any(line.startswith("reference: base win_rate ") for line in lines)
    assert any(line.startswith("reference: heuristic win_rate ") for line in lines)
    assert any("final win_rate 95% CI lower bound" in line for line in lines)

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    main(["-c", str(path), "--start", str(start), "--final", str(same)])
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1].startswith(f"learning: win_rate {w.mean:.2f} -> {w.mean:.2f} on 6 held-out episodes")

    # A start without a base evaluation (the base model itself): its own evaluation is the base line only
    # when the script says so.
    no_base = [x for x in summary_lines(cfg, base, same) if x.startswith("reference: base ")]
    assert no_base == []
    as_base = [
        x for x in summary_lines(cfg, base, same, start_is_base=True) if x.startswith("reference: base ")
    ]
    assert as_base == [
        f"reference: base win_rate {b0['eval/win_rate']:.2f} (95% CI {b0['eval/win_rate_lo']:.2f}..{b0['eval/win_rate_hi']:.2f})"
    ]


def test_a_run_without_its_evaluation_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LearningError, match=r"no metrics\.jsonl"):
        step0(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "eval/win_rate": 0.5}) + "\n")
    with pytest.raises(LearningError, match="no evaluation at step 0"):
        step0(tmp_path)
