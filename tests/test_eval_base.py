"""``eval.base``: a warm-started run measures the base model it started from (the policy's ``model`` as
configured, before the warm start) on the same held-out seeds, in the same run, and prints it as
``reference: base`` beside the other references.

Local mode (real CLI process, tiny model, CPU learner, in-process player): the base's evaluation samples with
an RNG of its own seeded like the learners', so it must play *exactly* the episodes a run without the warm
start plays at its update-0 evaluation (same tokens, same estimates), and not those of the run's own update-0
evaluation (the clone), which draws the same random numbers from other weights.

Service mode (real CLI process, the job's own stack of real services, transformers inference): the base is
served as an extra policy ``base-responder`` from the configured model; the logprobs inference recorded for
its episodes are the un-cloned model's (teacher-forced here, in process), not the clone's, while the update-0
evaluation's are the clone's. Either test fails if the base were the clone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from wolfpack.v1 import trajectory_pb2
from wolfpack_inference.models import tiny_model
from wolfpack_trainer import evaluate as ev
from wolfpack_trainer.cli import base_plan
from wolfpack_trainer.config import ConfigError, TrainConfig, load_config
from wolfpack_trainer.train import run_training


def _config(tiny: Path, stream: str, mode: str, warm: bool = True) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "name": f"eval-base-{mode}",
        "game": {"id": "ultimatum_v1", "variant": "easy", "bot": "heuristic"},
        "policies": [
            {"id": "responder", "seats": [1], "model": str(tiny), "lr": 1e-3, "micro_batch_size": 8}
        ],
        "rollout": {
            "mode": mode,
            "episodes_per_update": 4,
            "group_size": 2,
            "max_tokens": 6,
            "max_prompt_tokens": 64,
        },
        "train": {"updates": 0},
        "eval": {"every": 100, "episodes": 6},
        "stream": {"name": stream},
    }
    if warm:
        cfg["warmstart"] = {"bot": "random", "episodes": 8, "steps": 10}
    if mode == "service":
        cfg["inference"] = {"backend": "transformers", "device": "cpu"}
    return cfg


def _train(
    cfg: dict[str, Any], tmp: Path, run: Path, settings_dir: Path, redis_url: str, crash_at: str = ""
) -> str:
    """``wolfpack train`` in a process of its own; with ``crash_at`` (``WOLFPACK_TRAINER_CRASH_AT``) it must
    end at that point (exit 75)."""
    path = tmp / f"{cfg['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {
        **os.environ,
        "WOLFPACK_RUN_DIR": str(settings_dir),
        "WOLFPACK_REDIS_URL": redis_url,
        "COLUMNS": "400",
        **({"WOLFPACK_TRAINER_CRASH_AT": crash_at} if crash_at else {}),
    }
    cmd = [sys.executable, "-m", "wolfpack.cli.main", "train", "-c", str(path), "--run-dir", str(run)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == (75 if crash_at else 0), (done.stdout + done.stderr)[-4000:]
    return done.stdout


def _episodes(directory: Path) -> list[trajectory_pb2.Trajectory]:
    files = sorted(directory.glob("episode_*.pb"))
    assert files, directory
    return [trajectory_pb2.Trajectory.FromString(p.read_bytes()) for p in files]


def _turns(trajs: list[trajectory_pb2.Trajectory]) -> list[tuple[int, str, list[int], list[int]]]:
    """(seed, policy id, prompt ids, response ids) of every policy turn."""
    return [
        (t.seed, turn.policy.policy_id, list(turn.prompt_token_ids), list(turn.response_token_ids))
        for t in trajs
        for turn in t.turns
        if turn.policy.policy_id
    ]


def _step0(run: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    out: dict[str, float] = {}
    for row in rows:
        if row.get("step") == 0:
            out.update(row)
    return out


def _clone(settings_dir: Path) -> Path:
    clones = [p for p in (settings_dir / "models").iterdir() if p.name.startswith("warm-")]
    assert len(clones) == 1, clones
    return clones[0]


def test_eval_base_is_on_with_a_warm_start_and_refused_without(tmp_path: Path) -> None:
    tiny = tmp_path / "tiny"  # never loaded: only the config is checked
    warm = TrainConfig.model_validate(_config(tiny, "s", "local"))
    assert warm.eval_base and "loaded in process" in base_plan(warm)
    assert not TrainConfig.model_validate({**_config(tiny, "s", "local"), "eval": {"base": False}}).eval_base
    served = TrainConfig.model_validate(_config(tiny, "s", "service"))
    assert "served by the stack's inference as base-responder" in base_plan(served)
    cold = TrainConfig.model_validate(_config(tiny, "s", "local", warm=False))
    assert not cold.eval_base and base_plan(cold) == ""
    path = tmp_path / "cold.yaml"
    path.write_text(yaml.safe_dump(_config(tiny, "s", "local", warm=False)))
    with pytest.raises(ConfigError, match=r"eval\.base: without a warm start"):
        load_config(path, ["eval.base=true"])


@pytest.mark.slow
def test_local_base_reference_is_the_un_warm_started_model(redis_url: str, tmp_path: Path) -> None:
    tiny = tiny_model(tmp_path / "models")
    stream = f"test:eval-base:{os.getpid()}:{time.monotonic_ns()}"
    warm_run, settings_dir = tmp_path / "warm", tmp_path / "job"
    out = _train(_config(tiny, stream, "local"), tmp_path, warm_run, settings_dir, redis_url)
    assert "reference: base win_rate " in out, out
    assert "base" in out.split("final win_rate 95% CI lower bound")[1].splitlines()[0]  # the verdict names it

    # The same seeds played by the model as configured, with no warm start: its update-0 evaluation.
    cold_cfg = TrainConfig.model_validate(
        {**_config(tiny, f"{stream}:cold", "local", warm=False), "name": "cold"}
    )
    cold_run = tmp_path / "cold"
    _, evals = run_training(cold_cfg, cold_run, redis_url, tmp_path / "models")
    assert [e.step for e in evals] == [0] and evals[0].base is None

    measured = _step0(warm_run)
    cold_step0 = _step0(cold_run)
    for ref_key, eval_key in [("reward_mean", "reward_mean"), ("reward_mean_lo", "reward_lo"),
                              ("reward_mean_hi", "reward_hi"), ("win_rate", "win_rate"),
                              ("win_rate_lo", "win_rate_lo"), ("win_rate_hi", "win_rate_hi")]:  # fmt: skip
        assert measured[f"reference/base/{ref_key}"] == cold_step0[f"eval/{eval_key}"], ref_key
    assert measured["reference/base/failed_episodes"] == 0
    base = _episodes(ev.base_episodes_dir(warm_run))
    cold = _episodes(ev.episodes_dir(cold_run, 0))
    clone = _episodes(ev.episodes_dir(warm_run, 0))
    assert {p for _, p, _, _ in _turns(base)} == {"base-responder"}
    assert [(s, pr, r) for s, _, pr, r in _turns(base)] == [(s, pr, r) for s, _, pr, r in _turns(cold)]
    # The warm-started policy drew the same random numbers on the same seeds: other weights, other answers.
    assert [r for *_, r in _turns(base)] != [r for *_, r in _turns(clone)]
    assert (settings_dir / "models").exists() and _clone(settings_dir)  # the warm start did run


def _logprobs(model: Any, prompt: list[int], response: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def _gap(model: Any, trajs: list[trajectory_pb2.Trajectory]) -> float:
    """The largest gap between the logprobs inference recorded for the policy turns and ``model``'s."""
    gap = 0.0
    for traj in trajs:
        for turn in traj.turns:
            if turn.policy.policy_id and turn.response_token_ids:
                want = _logprobs(model, list(turn.prompt_token_ids), list(turn.response_token_ids))
                got = torch.tensor(list(turn.response_logprobs))
                gap = max(gap, float((got - want).abs().max()))
    return gap


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True], ids=["before", "beside"])
def test_service_base_reference_is_served_from_the_configured_model(
    redis_url: str, tmp_path: Path, overlap: bool
) -> None:
    """``beside``: ``eval.base_overlap`` in a run of no updates (the agent-loop script's evaluations): the
    base's task is awaited after the update-0 evaluation, with nothing to overlap but that."""
    from transformers import AutoModelForCausalLM

    tiny = tiny_model(tmp_path / "models")
    stream = f"test:eval-base-service:{os.getpid()}:{time.monotonic_ns()}"
    run, settings_dir = tmp_path / "run", tmp_path / "job"
    cfg = _config(tiny, stream, "service")
    cfg["eval"] = {**cfg["eval"], "base_overlap": overlap}
    out = _train(cfg, tmp_path, run, settings_dir, redis_url)
    assert "reference: base win_rate " in out, out
    served = {
        p["policy_id"]: p["model"] for p in yaml.safe_load((run / "stack" / "policies.yaml").read_text())
    }
    assert served == {"responder": str(tiny), "base-responder": str(tiny)}
    assert "reference/base/win_rate" in _step0(run)
    assert not (
        run / "checkpoints" / "LATEST"
    ).exists()  # a run of no updates keeps no checkpoint, either way

    base, initial = _episodes(ev.base_episodes_dir(run)), _episodes(ev.episodes_dir(run, 0))
    assert {p for _, p, _, _ in _turns(base)} == {"base-responder"}
    assert [t.seed for t in base] == [t.seed for t in initial]
    original: Any = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32).eval()
    clone: Any = AutoModelForCausalLM.from_pretrained(str(_clone(settings_dir)), dtype=torch.float32).eval()
    assert _gap(original, base) < 1e-3  # inference played the base episodes with the configured model
    assert _gap(clone, base) > 1e-2  # ... not with the warm-started clone
    assert _gap(clone, initial) < 1e-3 and _gap(original, initial) > 1e-2  # update 0 is the clone's


def test_base_overlap_applies_in_service_mode_with_a_base(tmp_path: Path) -> None:
    """``eval.base_overlap`` changes nothing where there is no base to evaluate or no second driver (local
    mode); a recipe that sets it still loads with ``warmstart=null`` or ``rollout.mode=local``."""
    tiny = tmp_path / "tiny"  # never loaded: only the config is checked
    for mode, warm, beside in (("service", True, True), ("local", True, False), ("service", False, False)):
        path = tmp_path / f"{mode}-{warm}.yaml"
        path.write_text(yaml.safe_dump(_config(tiny, "s", mode, warm=warm)))
        cfg = load_config(path, ["eval.base_overlap=true"])
        assert cfg.eval.base_overlap and cfg.base_beside_training is beside
        assert ("(eval.base_overlap)" in base_plan(cfg)) is beside  # what --check says
        assert not load_config(path).base_beside_training  # off by default


@pytest.mark.slow
def test_service_base_overlap_plays_beside_training_and_keeps_the_base(
    redis_url: str, tmp_path: Path
) -> None:
    """``eval.base_overlap``: the base models' evaluation is still running when the update-0 evaluation
    starts (a run without the overlap finishes it first), and the run still ends with the base recorded where
    a run without the overlap records it: the summary's ``reference: base``, the step-0 metrics and the first
    evaluation in the final checkpoint's state (what a resumed run's summary reads). The first process dies
    after update 1's checkpoint, before the base is recorded (it is recorded before the final evaluation):
    the resumed run evaluates the base again, beside its last update."""
    tiny = tiny_model(tmp_path / "models")
    stream = f"test:eval-base-overlap:{os.getpid()}:{time.monotonic_ns()}"
    run, settings_dir = tmp_path / "run", tmp_path / "job"
    cfg = _config(tiny, stream, "service")
    cfg["train"] = {"updates": 2, "checkpoint_every": 1}
    cfg["eval"] = {**cfg["eval"], "base_overlap": True}
    _train(cfg, tmp_path, run, settings_dir, redis_url, crash_at="checkpointed@1")
    latest = (run / "checkpoints" / "LATEST").read_text().strip()
    state = json.loads((run / "checkpoints" / latest / "state.json").read_text())
    assert (
        state["step"] == 1 and [e["step"] for e in state["evals"]] == [0] and "base" not in state["evals"][0]
    )
    initial = _episodes(ev.episodes_dir(run, 0))
    if list(ev.base_episodes_dir(run).glob("episode_*.pb")):  # else: unfinished at update 1, beside it
        base_end = max(t.finished_at.ToNanoseconds() for t in _episodes(ev.base_episodes_dir(run)))
        initial_start = min(t.started_at.ToNanoseconds() for t in initial)
        assert base_end > initial_start, "the base's evaluation ended before the update-0 evaluation began"

    out = _train(cfg, tmp_path, run, settings_dir, redis_url)
    assert "reference: base win_rate " in out, out
    assert "base" in out.split("final win_rate 95% CI lower bound")[1].splitlines()[0]
    step0 = _step0(run)
    assert "reference/base/win_rate" in step0 and step0["perf/eval_base_s"] > 0

    base = _episodes(ev.base_episodes_dir(run))  # the resumed run's
    assert {p for _, p, _, _ in _turns(base)} == {"base-responder"}
    assert [t.seed for t in base] == [t.seed for t in initial]
    latest = (run / "checkpoints" / "LATEST").read_text().strip()
    state = json.loads((run / "checkpoints" / latest / "state.json").read_text())
    assert state["step"] == 2 and [e["step"] for e in state["evals"]] == [0, 2]
    assert state["evals"][0]["base"]["win_rate"]["mean"] == pytest.approx(step0["reference/base/win_rate"])
