"""``train.parallel_learners`` (IPPO, two learners): the learners of an update train side by side and their
versions are written side by side, with exactly the results of one after the other.

Real parts: the tiny model, ultimatum episodes played in process, the trainer's batches, verl's GRPO / GAE,
the CPU learner, the publisher writing real version directories. The instrumentation is a pass-through that
makes both learners' ``update`` (and ``save_pretrained``) wait for each other at a barrier: one after the other,
the first would wait alone and the barrier break, so the tests fail unless the two really run at once."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from wolfpack_inference.models import tiny_model
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.train import Trainer

BARRIER_S = 30.0
"""How long a learner waits at the barrier for the other (far above one tiny update)."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model(tmp_path_factory.mktemp("models"), max_positions=2048))


def _trainer(tmp_path: Path, cfg: TrainConfig, parallel: bool) -> Trainer:
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"parallel_learners": parallel})})
    t = Trainer(cfg, tmp_path / ("parallel" if parallel else "serial"), "redis://unused", cache_dir=tmp_path)
    t.setup()
    return t


def _meet_at(barrier: threading.Barrier, learner: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = getattr(learner, name)

    def meet(*args: Any) -> Any:
        barrier.wait()  # BrokenBarrierError after BARRIER_S if the other learner is not running beside it
        return real(*args)

    monkeypatch.setattr(learner, name, meet)


def _played(t: Trainer) -> list[Any]:
    trajs = t.play_local(t.tasks([1, 2], 2, "u0"), 1.0)
    # the random tiny model's answers are all invalid: spread the returns by hand so both roles have a gradient
    for i, traj in enumerate(trajs):
        for o in traj.outcomes:
            o.final_reward = float(i if o.seat == 0 else -i)
    return trajs


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_side_by_side_updates_are_the_one_after_the_other_updates(
    tmp_path: Path, tiny: str, estimator: str, monkeypatch: pytest.MonkeyPatch, two_seat_config: Any
) -> None:
    cfg = two_seat_config(tiny, estimator)
    serial = _trainer(tmp_path, cfg, parallel=False)
    parallel = _trainer(tmp_path, cfg, parallel=True)
    assert serial.learners["proposer"] is not serial.learners["responder"]  # IPPO: a learner each
    barrier = threading.Barrier(2, timeout=BARRIER_S)
    for learner in parallel.learners.values():
        _meet_at(barrier, learner, "update", monkeypatch)
    trajs = _played(serial)
    want = serial.train_step(trajs)
    got = parallel.train_step(trajs)
    assert not barrier.broken
    for pid in ("proposer", "responder"):
        a, b = serial.learners[pid], parallel.learners[pid]
        assert a.step == b.step == 1
        for x, y in zip(a.model.parameters(), b.model.parameters(), strict=True):
            assert torch.equal(x, y), pid
    # every metric as one after the other: per-policy names, and the first policy's under the bare name
    assert set(got) == set(want)
    timing = ("perf/", "time/")
    for k, v in want.items():
        if not k.startswith(timing) and "/perf/" not in k:
            assert got[k] == v or (v != v and got[k] != got[k]), k  # NaN equals NaN here
    assert got["proposer/actor/pg_loss"] != got["responder/actor/pg_loss"]
    assert got["actor/pg_loss"] == got["proposer/actor/pg_loss"]


def test_a_failing_learner_fails_the_update_after_both_end(
    tmp_path: Path, tiny: str, monkeypatch: pytest.MonkeyPatch, two_seat_config: Any
) -> None:
    t = _trainer(tmp_path, two_seat_config(tiny, "grpo"), parallel=True)
    other_done = threading.Event()
    real = t.learners["proposer"].update

    def fails(*args: Any) -> Any:
        raise RuntimeError("responder learner broke")

    def finishes(*args: Any) -> Any:
        out = real(*args)
        other_done.set()
        return out

    monkeypatch.setattr(t.learners["responder"], "update", fails)
    monkeypatch.setattr(t.learners["proposer"], "update", finishes)
    with pytest.raises(RuntimeError, match="responder learner broke"):
        t.train_step(_played(t))
    assert other_done.is_set()  # raised only once the other learner's update had ended


def test_versions_are_written_side_by_side_in_order(
    tmp_path: Path, tiny: str, monkeypatch: pytest.MonkeyPatch, two_seat_config: Any
) -> None:
    t = _trainer(tmp_path, two_seat_config(tiny, "grpo"), parallel=True)
    barrier = threading.Barrier(2, timeout=BARRIER_S)
    for learner in t.learners.values():
        _meet_at(barrier, learner, "save_pretrained", monkeypatch)
    before = len(t.state.published)
    asyncio.run(t.publish_current())
    assert not barrier.broken
    new = t.state.published[before:]
    assert [(p["policy_id"], p["version"]) for p in new] == [("proposer", 1), ("responder", 1)]
    for p in new:
        assert (Path(p["path"]) / "config.json").exists() and Path(p["path"]).parent.name == p["policy_id"]


def test_verl_learners_side_by_side_on_one_collective_group(
    tmp_path: Path, tiny: str, monkeypatch: pytest.MonkeyPatch, two_seat_config: Any
) -> None:
    """The real ``verl_fsdp`` learner (FSDP2 on gloo, in process: both learners share the process's one
    collective group, the case that keeps the setting off by default on a GPU): updates and publishes side
    by side give exactly the weights and metrics of one after the other, without a hang."""
    pytest.importorskip("verl.workers.engine_workers", reason="verl (trainer extra) is not installed")
    player = _trainer(tmp_path / "cpu", two_seat_config(tiny, "grpo"), parallel=False)
    trajs = _played(player)  # the verl learner does not sample in process: the CPU learner plays

    def verl(parallel: bool) -> Trainer:
        cfg = two_seat_config(tiny, "grpo")
        learner = {
            "learner": "verl_fsdp",
            "device": "cpu",
            "micro_batch_size": 4,
            "extra": {"strategy": "fsdp2"},
        }
        policies = [p.model_copy(update=learner) for p in cfg.policies]
        return _trainer(tmp_path / "verl", cfg.model_copy(update={"policies": policies}), parallel)

    serial, parallel = verl(False), verl(True)
    assert type(parallel.learners["proposer"]).__name__ == "VerlFsdpLearner"
    barrier = threading.Barrier(2, timeout=BARRIER_S)
    for learner in parallel.learners.values():
        _meet_at(barrier, learner, "update", monkeypatch)
        _meet_at(barrier, learner, "save_pretrained", monkeypatch)
    want, got = serial.train_step(trajs), parallel.train_step(trajs)
    asyncio.run(parallel.publish_current())
    assert not barrier.broken
    for pid in ("proposer", "responder"):
        a, b = serial.learners[pid]._full_state(), parallel.learners[pid]._full_state()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), pid
    for k, v in want.items():
        if not k.startswith(("perf/", "time/")) and "/perf/" not in k:
            assert got[k] == v or (v != v and got[k] != got[k]), k
    assert [(p["policy_id"], p["version"]) for p in parallel.state.published[-2:]] == [
        ("proposer", 1),
        ("responder", 1),
    ]
