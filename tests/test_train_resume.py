"""SIGKILL ``wolfpack train`` mid-run and start it again: no trajectory is lost or used twice, and training
continues from the last checkpoint. Real Redis, the real CLI in a subprocess, the tiny model.

The kill lands wherever the job happens to be (here: after update 1's ack, during update 2); the crash
points between checkpoint and ack are hit deterministically by ``test_train_crash_points.py`` and
``test_train_interrupt.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml

UPDATES = 4
PER_UPDATE = 8


def _config(path: Path, stream: str) -> Path:
    cfg = {
        "name": "resume-test",
        "game": {"id": "ultimatum_v1", "variant": "easy", "bot": "heuristic"},
        "policies": [{"id": "responder", "seats": [1], "model": "tiny", "lr": 1e-3, "micro_batch_size": 8}],
        "rollout": {"episodes_per_update": PER_UPDATE, "group_size": 4, "max_tokens": 6},
        "train": {"updates": UPDATES, "checkpoint_every": 1},
        "eval": {"every": 100, "episodes": 2},
        "stream": {"name": stream, "group": "trainer", "claim_idle_ms": 500},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def _wait_for(what: str, check: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow
def test_sigkill_and_resume_loses_nothing_and_uses_nothing_twice(redis_url: str, tmp_path: Path) -> None:
    stream = f"test:resume:{os.getpid()}:{time.monotonic_ns()}"
    cfg = _config(tmp_path / "cfg.yaml", stream)
    run = tmp_path / "run"
    env = {**os.environ, "WOLFPACK_REDIS_URL": redis_url, "WOLFPACK_RUN_DIR": str(tmp_path / "wp")}
    cmd = [sys.executable, "-m", "wolfpack.cli.main", "train", "-c", str(cfg), "--run-dir", str(run)]
    client = redis.Redis.from_url(redis_url)
    latest = run / "checkpoints" / "LATEST"
    # An audit group that never reads: the stream trims only what every group acked, so it keeps all entries.
    client.xgroup_create(stream, "audit", id="0", mkstream=True)

    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # Kill once update 1 is committed *and* update 2's episodes are on the stream (read, not acked).
        _wait_for(
            "the first checkpoint", lambda: latest.exists() and latest.read_text() == "update_000001", 240
        )
        _wait_for("the next update's episodes", lambda: client.xlen(stream) >= 2 * PER_UPDATE, 120)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    killed_at = json.loads((run / "checkpoints" / latest.read_text() / "state.json").read_text())["step"]
    assert killed_at < UPDATES, "the run finished before it could be killed"

    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"resumed from the checkpoint of update {killed_at}" in second.stdout

    state = json.loads((run / "checkpoints" / latest.read_text() / "state.json").read_text())
    assert state["step"] == UPDATES
    used = state["used_ids"]
    assert len(used) == len(set(used)), "a trajectory was used by two committed updates"
    assert state["trajectories_used"] == len(used)
    # Nothing lost: every entry the group has been handed is acked only because an update used it.
    entries = client.xrange(stream)
    group = next(g for g in client.xinfo_groups(stream) if g["name"] == b"trainer")
    assert group["pending"] == 0
    last = group["last-delivered-id"]
    delivered = [fields[b"id"].decode() for entry_id, fields in entries if _key(entry_id) <= _key(last)]
    assert set(delivered) == set(used)
    # The episodes on the stream at the kill were trained on after the restart.
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rows if "actor/pg_loss" in r} == set(range(1, UPDATES + 1))


def _key(entry_id: bytes) -> tuple[int, int]:
    ms, seq = entry_id.decode().split("-")
    return int(ms), int(seq)
