"""``wolfpack up`` leaves nothing behind and never touches another stack (issue 12, launcher item):
a second ``up`` on the same run dir refuses; SIGKILL of the launcher takes its services with it and the
next ``up`` reaps its Redis; SIGTERM and SIGHUP during start-up stop everything. Real processes, a
fresh run dir per test; every wait is bounded and says what it waits for."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from wolfpack import SERVICES


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def wait_for(what: str, cond: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def state(run_dir: Path) -> dict:  # type: ignore[type-arg]
    try:
        return dict(json.loads((run_dir / "up.json").read_text()))
    except (OSError, ValueError):
        return {}


def spawned(run_dir: Path) -> bool:
    """Every service's process is started (the web view's pid, when it has one, is listed too)."""
    return set(SERVICES) <= set(state(run_dir).get("pids", {}))


SPAWN_S = 150.0
"""Bound on the wait for every service to be spawned (all start at once; bounded for a loaded box)."""


def redis_pid(run_dir: Path) -> int:
    path = run_dir / "redis" / "redis.pid"
    return int(path.read_text()) if path.exists() else 0


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[Path, list[subprocess.Popen[bytes]]]]:
    run_dir = tmp_path / "run"
    procs: list[subprocess.Popen[bytes]] = []
    yield run_dir, procs
    for p in procs:  # whatever a failed assertion left running
        if p.poll() is None:
            p.kill()
            p.wait()
    for pid in [*state(run_dir).get("pids", {}).values(), redis_pid(run_dir)]:
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)


def start(run_dir: Path, procs: list[subprocess.Popen[bytes]], *extra: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "WOLFPACK_RUN_DIR": str(run_dir),
        "WOLFPACK_INFERENCE_MODEL": "tiny",
        "WOLFPACK_REDIS_URL": "",
    }
    cmd = [sys.executable, "-m", "wolfpack.cli.main", "up", "--base-port", "0", "--timeout", "120", *extra]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    procs.append(proc)
    return proc


def wait_serving(launcher: subprocess.Popen[bytes]) -> None:
    """Read the launcher's output until it says the stack is up (bounded: a cold start on a loaded box)."""
    assert launcher.stdout is not None
    seen = b""
    deadline = time.monotonic() + 150
    while b"Ctrl-C to stop" not in seen and time.monotonic() < deadline:
        line = launcher.stdout.readline()
        if not line:
            break
        seen += line
    assert b"Ctrl-C to stop" in seen, seen.decode()[-2000:]


def test_second_up_refuses_and_sighup_of_the_running_stack_stops_everything(
    up: tuple[Path, list[subprocess.Popen[bytes]]],
) -> None:
    run_dir, procs = up
    first = start(run_dir, procs)
    wait_serving(first)
    services = list(state(run_dir)["pids"].values())
    redis = redis_pid(run_dir)

    second = start(run_dir, procs)
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 1
    assert b"already running" in out and str(first.pid).encode() in out
    assert all(alive(p) for p in [*services, redis]), "the refused up touched the running stack"
    assert state(run_dir)["launcher_pid"] == first.pid

    first.send_signal(signal.SIGHUP)  # the terminal closed
    rest, _ = first.communicate(timeout=90)
    assert first.returncode == 0, rest.decode()[-2000:]
    assert not any(alive(p) for p in [*services, redis])


def test_sigkill_leaves_nothing_the_next_up_does_not_reap_and_sigterm_in_start_up(
    up: tuple[Path, list[subprocess.Popen[bytes]]],
) -> None:
    run_dir, procs = up
    first = start(run_dir, procs)
    wait_for("the first stack's services to start", lambda: spawned(run_dir), SPAWN_S)
    services = list(state(run_dir)["pids"].values())
    redis = redis_pid(run_dir)
    first.send_signal(signal.SIGKILL)
    first.wait()
    wait_for("the services to follow their killed launcher", lambda: not any(alive(p) for p in services))
    # Redis (its own session, stopped last on purpose) is reaped by the next up on this run dir.
    second = start(run_dir, procs)
    wait_for("the next up to reap the orphaned Redis", lambda: not alive(redis))
    wait_for("the next stack's services to start", lambda: spawned(run_dir), SPAWN_S)
    services, redis = list(state(run_dir)["pids"].values()), redis_pid(run_dir)
    second.send_signal(signal.SIGTERM)  # during its start-up
    out, _ = second.communicate(timeout=60)
    assert not any(alive(p) for p in [*services, redis]), out.decode()[-2000:]
    assert not (run_dir / "up.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGHUP])
def test_a_signal_during_start_up_stops_everything(
    up: tuple[Path, list[subprocess.Popen[bytes]]], sig: signal.Signals
) -> None:
    run_dir, procs = up
    launcher = start(run_dir, procs)
    wait_for("the services to be spawned", lambda: spawned(run_dir), SPAWN_S)
    services = list(state(run_dir)["pids"].values())
    redis = redis_pid(run_dir)
    launcher.send_signal(sig)
    out, _ = launcher.communicate(timeout=60)
    assert b"stopped" in out
    assert not any(alive(p) for p in [*services, redis]), out.decode()[-2000:]
    web = state(run_dir).get("pids", {}).get("web") if (run_dir / "up.json").exists() else None
    assert not (run_dir / "up.json").exists(), out.decode()[-3000:]
    assert web is None or not alive(web)
