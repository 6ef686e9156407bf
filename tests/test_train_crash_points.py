"""The trainer's delivery guarantee at each crash point, hit deterministically: ``Trainer.crash_point`` is
called at ``checkpointed`` (LATEST written), ``ack`` (the update's entries about to be acked) and ``acked``;
a test hook raises there, which ends the run with nothing after that line done (no ack, no further
checkpoint), then a new trainer resumes from the run directory. Real Redis, the tiny model, local play.

What must hold (``services/trainer/README.md``, Guarantees):
- at every crash point, every entry the trainer's group has acked is in the checkpoint the run resumes
  from (acking first, then checkpointing, would lose the entries of a crash in between: acked, so never
  redelivered, yet used by no checkpoint) — the ``ack`` point sees its update's checkpoint already written;
- a crash between checkpoint and ack redelivers the entries; the resumed run skips them as used (the used
  ids are in the checkpoint), so ``used_ids`` has no duplicate and no update is trained twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from wolfpack_inference.models import tiny_model
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.train import Trainer

UPDATES = 3
PER_UPDATE = 4


class Crash(Exception):
    """Stands for the process dying at a crash point."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model(tmp_path_factory.mktemp("models")))


def _config(tiny: str, stream: str) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "name": "crash-points",
            "game": {"id": "ultimatum_v1", "variant": "easy", "bot": "heuristic"},
            "policies": [{"id": "responder", "seats": [1], "model": tiny, "lr": 1e-3}],
            "rollout": {"episodes_per_update": PER_UPDATE, "group_size": 2, "max_tokens": 4},
            "train": {"updates": UPDATES, "checkpoint_every": 1, "save_versions": False},
            "eval": {"every": 100, "episodes": 1},
            "stream": {"name": stream, "group": "trainer", "claim_idle_ms": 300},
        }
    )


def _latest(run: Path) -> dict[str, Any]:
    root = run / "checkpoints"
    return json.loads((root / (root / "LATEST").read_text() / "state.json").read_text())  # type: ignore[no-any-return]


def _pending(client: redis.Redis, stream: str) -> set[str]:
    """Message (trajectory) ids the trainer group was handed and has not acked."""
    entry_ids = {p["message_id"] for p in client.xpending_range(stream, "trainer", "-", "+", 1000)}
    return {f[b"id"].decode() for eid, f in client.xrange(stream) if eid in entry_ids}


def _acked(client: redis.Redis, stream: str) -> set[str]:
    """Message ids the trainer group was handed and has acked."""
    group = next(g for g in client.xinfo_groups(stream) if g["name"] == b"trainer")
    last = _key(group["last-delivered-id"])
    handed = {f[b"id"].decode() for eid, f in client.xrange(stream) if _key(eid) <= last}
    return handed - _pending(client, stream)


def _key(entry_id: bytes) -> tuple[int, int]:
    ms, seq = entry_id.decode().split("-")
    return int(ms), int(seq)


def _run(cfg: TrainConfig, run: Path, redis_url: str, cache: Path, hook: Any = None) -> Trainer:
    trainer = Trainer(cfg, run, redis_url, cache_dir=cache)
    if hook is not None:
        trainer.crash_point = hook
    trainer.setup()
    asyncio.run(trainer.run())
    return trainer


def _crash_run(
    cfg: TrainConfig, run: Path, redis_url: str, cache: Path, point: str, step: int, seen: dict[str, Any]
) -> None:
    """Run until ``point`` at update ``step``, record what a crash there would leave, crash."""
    client = redis.Redis.from_url(redis_url)

    def hook(at: str, update: int) -> None:
        if (at, update) != (point, step):
            return
        seen["latest"] = _latest(run)
        seen["pending"] = _pending(client, cfg.stream.name)
        seen["acked"] = _acked(client, cfg.stream.name)
        raise Crash(f"{at}@{update}")

    with pytest.raises(Crash):
        _run(cfg, run, redis_url, cache, hook)
    assert seen, f"the run never reached the crash point {point}@{step}"


def _assert_whole(trainer: Trainer, run: Path, client: redis.Redis, stream: str) -> None:
    """After the resumed run: every update once, every entry used once and acked, nothing lost."""
    state = _latest(run)
    assert state["step"] == UPDATES
    used = state["used_ids"]
    assert len(used) == len(set(used)), "a trajectory was used by two committed updates"
    assert len(used) == state["trajectories_used"] == UPDATES * PER_UPDATE
    assert trainer.learners["responder"].step == UPDATES, "an update was trained twice (or lost)"
    assert _pending(client, stream) == set()
    assert _acked(client, stream) == set(used)


@pytest.fixture
def stream(redis_url: str) -> str:
    name = f"test:crash:{os.getpid()}:{time.monotonic_ns()}"
    # An audit group that never reads: the stream trims only what every group acked, so it keeps all.
    redis.Redis.from_url(redis_url).xgroup_create(name, "audit", id="0", mkstream=True)
    return name


@pytest.mark.slow
def test_crash_between_checkpoint_and_ack_skips_the_redelivered_entries(
    tiny: str, redis_url: str, stream: str, tmp_path: Path
) -> None:
    cfg, run, client = _config(tiny, stream), tmp_path / "run", redis.Redis.from_url(redis_url)
    seen: dict[str, Any] = {}
    _crash_run(cfg, run, redis_url, tmp_path, "checkpointed", 1, seen)
    update_1 = set(seen["latest"]["used_ids"])
    assert seen["latest"]["step"] == 1 and len(update_1) == PER_UPDATE
    # The premise: checkpointed, not yet acked (acking first would have acked them already).
    assert seen["pending"] >= update_1, "update 1's entries were acked before its checkpoint was written"

    resumed = _run(cfg, run, redis_url, tmp_path)
    assert resumed.resumed_from == 1
    # Redelivered (claimed back after claim_idle_ms) and skipped as used by update 1, not trained again.
    assert resumed.state.redelivered_skipped == PER_UPDATE
    _assert_whole(resumed, run, client, stream)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["ack", "acked"])
def test_no_entry_is_acked_outside_the_checkpoint(
    point: str, tiny: str, redis_url: str, stream: str, tmp_path: Path
) -> None:
    cfg, run, client = _config(tiny, stream), tmp_path / "run", redis.Redis.from_url(redis_url)
    seen: dict[str, Any] = {}
    _crash_run(cfg, run, redis_url, tmp_path, point, 2, seen)
    # Whatever the group has acked is in the checkpoint a restart resumes from: nothing acked is lost.
    assert seen["acked"] <= set(seen["latest"]["used_ids"]), "acked entries missing from the checkpoint"
    # Update 2 is checkpointed before any of its entries is acked.
    assert seen["latest"]["step"] == 2, "update 2's entries were acked before its checkpoint was written"

    resumed = _run(cfg, run, redis_url, tmp_path)
    assert resumed.resumed_from == 2
    _assert_whole(resumed, run, client, stream)
