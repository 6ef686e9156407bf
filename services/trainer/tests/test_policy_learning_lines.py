"""Per-policy held-out scores: with several co-trained policies the summary's overall ``learning:`` line
averages the seats of an episode, so ``learning[<policy>]:`` lines follow it, each computed on that policy's
own seats, and ``eval/<policy>/...`` keys go to metrics.jsonl. A single-policy run prints and records
nothing new. The runs are the real job (``cli._run``: local rollout, tiny model, real Redis stream), one
update and four held-out episodes; the per-policy numbers are checked against the per-seat outcomes of the
evaluated episodes the run kept as ``Trajectory`` files."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_inference.models import tiny_model
from wolfpack_trainer import cli
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.evaluate import episodes_dir, policy_metrics, policy_scores
from wolfpack_trainer.metrics import Estimate
from wolfpack_trainer.train import (
    EvalResult,
    _eval_from_json,
    _eval_to_json,
    learning_line,
    policy_learning_lines,
)

EPISODES = 4  # every evaluated episode is kept as a file (evaluate.SAVED_EPISODES)
LINE = re.compile(
    r"^learning\[(\w+)\]: win_rate (\S+) -> (\S+) on (\d+) held-out episodes \(95% CI (\S+)\.\.(\S+)\)$"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model(tmp_path_factory.mktemp("models")))


def _config(name: str, policies: list[dict[str, Any]], stream: str, **extra: Any) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            **extra,
            "name": name,
            "seed": 0,
            "game": {"id": "ultimatum_v1", "variant": "outside", "bot": "heuristic"},
            "policies": policies,
            "rollout": {
                "mode": "local",
                "episodes_per_update": 4,
                "group_size": 1,
                "max_tokens": 16,
                "max_prompt_tokens": 64,
            },
            "stream": {"name": stream},
            "train": {"updates": 1, "share_policy": False, "save_versions": False},
            "eval": {"every": 1, "episodes": EPISODES, "metric": "win_rate"},
        }
    )


def _run(
    cfg: TrainConfig, out: Path, redis_url: str, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """The summary lines ``wolfpack train`` prints for ``cfg``."""
    buf = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=buf, width=300, color_system=None))
    cli._run(cfg, out, redis_url, cache, None, None)
    return buf.getvalue().strip().splitlines()


def _seat_wins(run_dir: Path, step: int) -> dict[int, list[bool]]:
    """Per seat, the wins of the evaluated episodes at ``step`` (from the kept ``Trajectory`` files)."""
    files = sorted(episodes_dir(run_dir, step).glob("episode_*.pb"))
    assert len(files) == EPISODES
    wins: dict[int, list[bool]] = {}
    for path in files:
        traj = trajectory_pb2.Trajectory.FromString(path.read_bytes())
        for o in traj.outcomes:
            wins.setdefault(o.seat, []).append(o.outcome == common_pb2.OUTCOME_KIND_WIN)
    return wins


def test_two_policies_print_and_record_their_own_seats(
    tmp_path: Path, tiny: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    policies = [
        {"id": "proposer", "seats": [0], "model": tiny, "lr": 1e-3},
        {"id": "responder", "seats": [1], "model": tiny, "lr": 1e-3},
    ]
    # a short clone of the random bot: valid moves, so the two seats' outcomes differ (an untrained tiny
    # model makes invalid moves and both seats lose every game, where any split of seats looks right)
    warm = {"bot": "random", "episodes": 40, "steps": 40}
    cfg = _config("two", policies, f"wolfpack:test:policy-lines:{tmp_path.name}", warmstart=warm)
    run_dir = tmp_path / "run"
    lines = _run(cfg, run_dir, redis_url, tmp_path / "models", monkeypatch)

    overall = next(i for i, line in enumerate(lines) if line.startswith("learning: win_rate"))
    per_policy = [LINE.match(line) for line in lines[overall + 1 :]]
    assert all(per_policy) and [m.group(1) for m in per_policy if m] == ["proposer", "responder"], lines[
        overall:
    ]

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    seat_of = {"proposer": 0, "responder": 1}
    differ = []
    for step, col in ((0, 2), (1, 3)):  # initial and final evaluation
        row = next(r for r in rows if r["step"] == step and "eval/win_rate" in r)
        wins = _seat_wins(run_dir, step)
        differ.append(wins[0] != wins[1])
        for m in per_policy:
            assert m is not None
            pid = m.group(1)
            own = wins[seat_of[pid]]
            expected = sum(own) / len(own)
            assert row[f"eval/{pid}/win_rate"] == pytest.approx(expected)
            assert row[f"eval/{pid}/win_rate_lo"] <= expected <= row[f"eval/{pid}/win_rate_hi"]
            assert {f"eval/{pid}/reward_mean", f"eval/{pid}/reward_lo", f"eval/{pid}/reward_hi"} <= row.keys()
            assert float(m.group(col)) == pytest.approx(expected, abs=0.005)
            assert int(m.group(4)) == EPISODES
        # the overall estimate is the mean of the two seats: each policy's number is one of its parts
        both = [w for seat in (0, 1) for w in wins[seat]]
        assert row["eval/win_rate"] == pytest.approx(sum(both) / len(both))

    assert any(differ), "the seats' outcomes never differ: the check above cannot tell them apart"
    # the scores survive the checkpoint (a resumed run prints the same lines from its saved evaluations)
    latest = (run_dir / "checkpoints" / "LATEST").read_text().strip()
    state = json.loads((run_dir / "checkpoints" / latest / "state.json").read_text())
    first, last = (EvalResult(**_eval_from_json(e)) for e in state["evals"])
    assert policy_learning_lines("win_rate", first, last) == lines[overall + 1 :]


def test_one_policy_prints_and_records_nothing_new(
    tmp_path: Path, tiny: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    policies = [{"id": "responder", "seats": [1], "model": tiny, "lr": 1e-3}]
    cfg = _config("one", policies, f"wolfpack:test:policy-lines-one:{tmp_path.name}")
    run_dir = tmp_path / "run"
    lines = _run(cfg, run_dir, redis_url, tmp_path / "models", monkeypatch)
    assert lines[-1].startswith("learning: win_rate") and not any("learning[" in line for line in lines)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert not [k for r in rows for k in r if k.startswith("eval/responder/")]
    latest = (run_dir / "checkpoints" / "LATEST").read_text().strip()
    state = json.loads((run_dir / "checkpoints" / latest / "state.json").read_text())
    assert len(state["evals"]) == 2 and all("policies" not in e for e in state["evals"])


def _episode(tid: str, wins: dict[int, bool], bound: dict[int, str]) -> trajectory_pb2.Trajectory:
    traj = trajectory_pb2.Trajectory(trajectory_id=tid)
    for seat, pid in bound.items():
        traj.seats.add(seat=seat).policy.policy_id = pid
    for seat, won in wins.items():
        kind = common_pb2.OUTCOME_KIND_WIN if won else common_pb2.OUTCOME_KIND_LOSS
        traj.outcomes.add(seat=seat, final_reward=1.0 if won else -1.0, outcome=kind)
    return traj


def test_scores_use_only_the_policys_seats() -> None:
    """Seat 0 (a) wins both episodes, seat 1 (b) loses both, seat 2 is a scripted bot that wins; a third
    episode failed (a loss for every policy). An episode without a seat of the policy does not count."""
    bound = {0: "a", 1: "b"}
    trajs = [
        _episode("e1", {0: True, 1: False, 2: True}, bound),
        _episode("e2", {0: True, 1: False, 2: True}, bound),
        _episode("e3", {0: True, 2: True}, {0: "a"}),  # b holds no seat here
    ]
    scores = policy_scores(trajs, 4, ["a", "b"])
    assert (scores["a"].win_rate.mean, scores["a"].win_rate.n) == (0.75, 4)  # 3 wins + the failed one
    assert (scores["b"].win_rate.mean, scores["b"].win_rate.n) == (0.0, 3)
    assert scores["b"].reward.mean == -1.0
    assert policy_scores(trajs, 4, ["a"]) == {}
    assert set(policy_metrics(scores)) == {
        f"eval/{p}/{k}"
        for p in "ab"
        for k in ("reward_mean", "reward_lo", "reward_hi", "win_rate", "win_rate_lo", "win_rate_hi")
    }


def test_lines_format_and_skip_policies_the_first_evaluation_lacks() -> None:
    est = Estimate(0.5, 0.25, 0.75, 8)
    first = EvalResult(0, est, Estimate(0.25, 0.1, 0.5, 8), policies={})
    last = EvalResult(1, est, Estimate(0.5, 0.25, 0.75, 8))
    assert learning_line("win_rate", first, last) == (
        "learning: win_rate 0.25 -> 0.50 on 8 held-out episodes (95% CI 0.25..0.75)"
    )
    assert policy_learning_lines("win_rate", first, last) == []
    scores = policy_scores([_episode("e", {0: True, 1: False}, {0: "a", 1: "b"})], 1, ["a", "b"])
    first = EvalResult(0, est, est, policies=scores)
    last = EvalResult(1, est, est, policies={"b": scores["a"], "a": scores["b"]})
    assert policy_learning_lines("win_rate", first, last) == [
        "learning[b]: win_rate 0.00 -> 1.00 on 1 held-out episodes (95% CI 0.21..1.00)",
        "learning[a]: win_rate 1.00 -> 0.00 on 1 held-out episodes (95% CI 0.00..0.79)",
    ]
    assert _eval_from_json(_eval_to_json(first))["policies"] == scores
