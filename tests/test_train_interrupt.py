"""Ctrl-C on ``wolfpack train`` (the real CLI in a subprocess, real Redis, the tiny model): one SIGINT stops
after the current update with a checkpoint and says ``checkpointed at update N — rerun to resume``; a
second quits at once; SIGUSR1 finishes after the update with the final evaluation; the rerun resumes from that checkpoint. A crash point given in the environment
ends the CLI between checkpoint and ack (``os._exit``), and the rerun skips the redelivered entries."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml

PER_UPDATE = 4


def _job(tmp_path: Path, redis_url: str, updates: int) -> tuple[list[str], dict[str, str], Path]:
    stream = f"test:interrupt:{os.getpid()}:{time.monotonic_ns()}"
    cfg = {
        "name": "interrupt-test",
        "game": {"id": "ultimatum_v1", "variant": "easy", "bot": "heuristic"},
        "policies": [{"id": "responder", "seats": [1], "model": "tiny", "lr": 1e-3}],
        "rollout": {"episodes_per_update": PER_UPDATE, "group_size": 2, "max_tokens": 4},
        "train": {"updates": updates, "checkpoint_every": 1, "save_versions": False},
        "eval": {"every": 100, "episodes": 1},
        "stream": {"name": stream, "group": "trainer", "claim_idle_ms": 300},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    env = {**os.environ, "WOLFPACK_REDIS_URL": redis_url, "WOLFPACK_RUN_DIR": str(tmp_path / "wp")}
    env.pop("WOLFPACK_TRAINER_CRASH_AT", None)
    cmd = [sys.executable, "-m", "wolfpack.cli.main", "train", "-c", str(path), "--run-dir", str(run)]
    return cmd, env, run


def _latest_step(run: Path) -> int:
    root = run / "checkpoints"
    if not (root / "LATEST").exists():
        return -1
    return int(json.loads((root / (root / "LATEST").read_text() / "state.json").read_text())["step"])


def _wait_for_step(proc: subprocess.Popen[str], run: Path, step: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while (now := _latest_step(run)) < step:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"the job exited ({proc.returncode}) before update {step}: {out[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no checkpoint of update {step} after {timeout_s}s")
        time.sleep(0.1)
    return now


def _signalled(
    cmd: list[str], env: dict[str, str], run: Path, *signals: signal.Signals, timeout_s: float = 180
) -> tuple[int, str, int]:
    """Start the job, send ``signals`` (0.5 s apart) once update 1 is checkpointed; (the step checkpointed
    then, the output, the exit code)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        at = _wait_for_step(proc, run, 1, 240)
        for i, sig in enumerate(signals):
            if i:
                time.sleep(0.5)
            proc.send_signal(sig)
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
    return at, out, proc.returncode


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_one_ctrl_c_stops_after_the_update_with_a_checkpoint(
    redis_url: str, tmp_path: Path, sig: signal.Signals
) -> None:
    """SIGTERM (a pod deleted, a scheduler's stop) is the same polite stop as Ctrl-C, exit 128 + 15."""
    updates = 40
    cmd, env, run = _job(tmp_path, redis_url, updates)
    at, out, code = _signalled(cmd, env, run, sig)
    assert code == 128 + sig, out[-3000:]
    stopped = re.search(r"checkpointed at update (\d+) — rerun to resume", out)
    assert stopped, out[-3000:]
    n = int(stopped.group(1))
    # The update running at the signal is finished and committed, and nothing after it is started.
    assert at <= n <= at + 2 < updates
    assert _latest_step(run) == n
    assert "learning:" not in out  # no summary of a run that has not finished
    group = next(
        g for g in redis.Redis.from_url(redis_url).xinfo_groups(env_stream(run)) if g["name"] == b"trainer"
    )
    assert group["pending"] == 0  # the stopped update's entries were acked after its checkpoint
    if sig != signal.SIGINT:
        return  # resuming is the same for both; once is enough
    again = subprocess.run(
        [*cmd, "--updates", str(n + 1)], env=env, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"resumed from the checkpoint of update {n}" in again.stdout
    assert _latest_step(run) == n + 1


@pytest.mark.slow
def test_sigusr1_finishes_after_the_update_with_the_final_evaluation(redis_url: str, tmp_path: Path) -> None:
    """SIGUSR1 ends the run as a spent ``train.max_minutes`` does: the update running is the last, then the
    final evaluation, the learning line and exit 0 (a polite stop prints no learning line)."""
    updates = 40
    cmd, env, run = _job(tmp_path, redis_url, updates)
    at, out, code = _signalled(cmd, env, run, signal.SIGUSR1)
    assert code == 0, out[-3000:]
    assert "SIGUSR1: finishing after the current update" in out
    assert "learning:" in out, out[-3000:]
    n = _latest_step(run)
    assert at <= n <= at + 2 < updates
    root = run / "checkpoints"
    state = json.loads((root / (root / "LATEST").read_text() / "state.json").read_text())
    assert [e["step"] for e in state["evals"]] == [0, n]  # the final evaluation is of the last update


@pytest.mark.slow
def test_a_second_ctrl_c_quits_at_once(redis_url: str, tmp_path: Path) -> None:
    cmd, env, run = _job(tmp_path, redis_url, 40)
    _, out, code = _signalled(cmd, env, run, signal.SIGINT, signal.SIGINT, timeout_s=60)
    assert code == 130, out[-3000:]
    assert "second Ctrl-C: quitting now" in out
    assert re.search(r"interrupted — rerun to resume from the checkpoint update_\d+", out), out[-3000:]
    assert 1 <= _latest_step(run) < 40


@pytest.mark.slow
def test_crash_point_from_the_environment_then_resume(redis_url: str, tmp_path: Path) -> None:
    cmd, env, run = _job(tmp_path, redis_url, 2)
    crashed = subprocess.run(
        cmd, env={**env, "WOLFPACK_TRAINER_CRASH_AT": "checkpointed@1"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert crashed.returncode == 75, crashed.stdout[-3000:] + crashed.stderr[-3000:]
    assert _latest_step(run) == 1
    resumed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from the checkpoint of update 1" in resumed.stdout
    state = json.loads(
        (run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text() / "state.json").read_text()
    )
    assert state["step"] == 2 and state["redelivered_skipped"] == PER_UPDATE
    assert len(state["used_ids"]) == len(set(state["used_ids"])) == 2 * PER_UPDATE


def env_stream(run: Path) -> str:
    """The stream name the job used (from its config, as recorded in the checkpoint)."""
    root = run / "checkpoints"
    state = json.loads((root / (root / "LATEST").read_text() / "state.json").read_text())
    return str(state["config"]["stream"]["name"])
