"""``runs``: run directories by name only, metrics rows that survive a file being written, the panels
and their 95% bands under the trainer's metric names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wolfpack_web import runs

from .conftest import metrics_values


def _write(path: Path, *rows: dict[str, float] | str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    with (path / "metrics.jsonl").open("a") as fh:
        for row in rows:
            fh.write(row if isinstance(row, str) else json.dumps(row) + "\n")


def test_runs_are_found_by_name_under_their_roots_only(tmp_path: Path) -> None:
    _write(tmp_path / "root" / "a", {"step": 1})
    _write(tmp_path / "root" / "b", {"step": 1})
    (tmp_path / "root" / "empty").mkdir()
    _write(tmp_path / "single", {"step": 1})  # a root that is itself a run
    _write(tmp_path / "secret", {"step": 1})  # not under any root
    roots = [tmp_path / "root", tmp_path / "single", tmp_path / "missing"]
    assert sorted(runs.find_runs(roots)) == ["a", "b", "single"]
    assert runs.get_run(roots, "a").path == tmp_path / "root" / "a"
    for name in ("secret", "empty", "../secret", "..", ".a", "a/../b", "x" * 200, ""):
        with pytest.raises(runs.RunError):
            runs.get_run(roots, name)


def test_rows_merge_by_step_and_skip_what_does_not_parse(tmp_path: Path) -> None:
    _write(
        tmp_path, {"step": 1, "a": 1.0}, "not json\n", {"step": 2, "a": 2.0}, '["a list"]\n',
        {"step": 1, "b": 5.0, "flag": True, "name": "x", "inf": float("inf")}, {"a": 3.0},
        '{"step": 3, "a": 3',
    )  # fmt: skip
    assert runs.read_rows(tmp_path / "metrics.jsonl") == [
        {"step": 1.0, "a": 1.0, "b": 5.0},
        {"step": 2.0, "a": 2.0},
    ]
    assert runs.read_rows(tmp_path / "absent.jsonl") == []


def test_panels_group_the_trainer_metrics_with_their_bands() -> None:
    rows = [
        {"step": 1.0, **metrics_values(1)},
        {"step": 2.0, **metrics_values(2, evaluated=True)},
        {"step": 2.0, "reference/constant_ACCEPT/reward_mean": 0.4, "reference/constant_ACCEPT/reward_mean_lo": 0.3,
         "reference/constant_ACCEPT/reward_mean_hi": 0.5, "critic/vf_loss": 0.2, "charts/invalid_rate": 0.1},
    ]  # fmt: skip
    panels = {p["title"]: {s["key"]: s for s in p["series"]} for p in runs.panels(rows)}
    reward = panels["reward (train, held-out eval, references)"]
    assert set(reward) == {"charts/reward_mean", "eval/reward_mean", "reference/constant_ACCEPT/reward_mean"}
    assert (
        reward["charts/reward_mean"]["points"] == [[1.0, 0.1], [2.0, 0.2]]
        and reward["charts/reward_mean"]["band"] == []
    )
    assert reward["eval/reward_mean"]["band"] == [[2.0, pytest.approx(0.14), pytest.approx(0.34)]]
    assert reward["reference/constant_ACCEPT/reward_mean"]["band"] == [[2.0, 0.3, 0.5]]
    assert panels["win rate (train, held-out eval, references)"]["eval/win_rate"]["band"] == [[2.0, 0.4, 0.6]]
    assert set(panels["win rate by policy and role"]) == {"charts/trainee/seller/win_rate"}
    assert set(panels["loss"]) == {"actor/pg_loss", "critic/vf_loss"}
    assert set(panels["KL"]) == {"actor/ppo_kl"} and set(panels["invalid-answer rate"]) == {
        "charts/invalid_rate"
    }
    assert runs.panels([{"step": 1.0, "perf/tokens_per_s": 9.0}]) == []  # nothing charted: no panel


def test_samples_without_a_tensorboard_folder_are_empty(tmp_path: Path) -> None:
    assert runs.samples(runs.Run("r", tmp_path)) == []
