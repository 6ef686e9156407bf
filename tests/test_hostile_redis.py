"""A SIGKILLed embedded Redis is noticed (issue 20, "a SIGKILLed embedded Redis goes unnoticed"): the
server is restarted on its port from its AOF with a line saying so, and one that keeps dying stops the
stack (``EmbeddedRedis.watch``, used by ``wolfpack up``). Real redis-server processes and, for the
launcher, a real ``wolfpack up`` with every service; every wait is bounded and says what it waits for."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from wolfpack import SERVICES
from wolfpack.redis_server import EmbeddedRedis


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for(what: str, cond: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _pid_of(url: str) -> int:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=1)
    try:
        return int(client.info("server")["process_id"])
    except redis.exceptions.ConnectionError:
        return 0
    finally:
        client.close()


async def test_a_killed_server_is_restarted_with_its_data_and_one_that_keeps_dying_is_given_up(
    tmp_path: Path,
) -> None:
    # appendfsync always: under ``everysec`` (the default) Redis may hold back the AOF write of the last
    # second or two while a background fsync is slow, and a SIGKILL then loses acknowledged writes (seen on
    # a loaded disk: the group created just before the kill was gone); this test is about the restart.
    server = EmbeddedRedis(tmp_path / "redis", appendfsync="always").start()
    try:
        client = redis.Redis.from_url(server.url)
        client.xadd("s", {"data": b"kept"})
        client.xgroup_create("s", "g", id="0")
        client.close()
        lines: list[str] = []
        watch = asyncio.create_task(server.watch(lines.append, max_restarts=2, window_s=60, poll_s=0.05))
        first = server.proc
        assert first is not None
        os.kill(first.pid, signal.SIGKILL)
        for _ in range(200):
            if any("is back" in line for line in lines):
                break
            await asyncio.sleep(0.05)
        assert any(f"pid {first.pid}" in ln and "was killed by SIGKILL" in ln for ln in lines), lines
        assert any("is back" in line for line in lines), lines
        assert server.proc is not None and server.proc.pid != first.pid
        assert _pid_of(server.url) == server.proc.pid  # same URL, the new process
        client = redis.Redis.from_url(server.url)
        assert client.xrange("s")[0][1] == {b"data": b"kept"}  # replayed from the AOF
        assert client.xinfo_groups("s")[0]["name"] == b"g"
        client.close()
        # Two more deaths within the window: the second is one too many.
        for n in range(2):
            proc = server.proc
            assert proc is not None
            os.kill(proc.pid, signal.SIGKILL)
            if n == 0:  # wait until the restart is over (a server killed while starting fails the restart)
                for _ in range(200):
                    if sum("is back" in line for line in lines) == 2:
                        break
                    await asyncio.sleep(0.05)
        verdict = await asyncio.wait_for(watch, timeout=20)
        assert "was killed by SIGKILL" in verdict and "not restarting it again" in verdict, verdict
        assert server.proc is None and not server.pid_file.exists()
    finally:
        server.stop()


async def test_watch_ends_quietly_when_its_owner_stops_the_server(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis").start()
    lines: list[str] = []
    watch = asyncio.create_task(server.watch(lines.append, poll_s=0.05))
    await asyncio.sleep(0.2)
    server.stop()
    assert await asyncio.wait_for(watch, timeout=5) == "stopped"
    assert lines == []


# --------------------------------------------------------------------------- wolfpack up


class _Launcher:
    """A ``wolfpack up`` subprocess whose output a thread collects (bounded waits read it)."""

    def __init__(self, run_dir: Path) -> None:
        env = {
            **os.environ,
            "WOLFPACK_RUN_DIR": str(run_dir),
            "WOLFPACK_INFERENCE_MODEL": "tiny",
            "WOLFPACK_REDIS_URL": "",
        }
        cmd = [sys.executable, "-m", "wolfpack.cli.main", "up", "--base-port", "0", "--timeout", "150"]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.out: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.out.append(raw.decode(errors="replace"))

    def text(self) -> str:
        """The output so far, whitespace collapsed (the console wraps long lines)."""
        return " ".join("".join(self.out).split())

    def wait_text(self, what: str, timeout: float) -> None:
        _wait_for(f"{what!r} in the launcher's output", lambda: what in self.text(), timeout)


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[tuple[Path, list[_Launcher]]]:
    run_dir = tmp_path / "run"
    started: list[_Launcher] = []
    yield run_dir, started
    for la in started:  # whatever a failed assertion left running
        if la.proc.poll() is None:
            la.proc.send_signal(signal.SIGTERM)
            try:
                la.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                la.proc.kill()
                la.proc.wait()


def _redis_pid(run_dir: Path) -> int:
    path = run_dir / "redis" / "redis.pid"
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def test_up_restarts_a_killed_redis_and_stops_the_stack_when_it_keeps_dying(
    launcher: tuple[Path, list[_Launcher]],
) -> None:
    import json

    run_dir, started = launcher
    up = _Launcher(run_dir)
    started.append(up)
    up.wait_text("Ctrl-C to stop", 200)
    state = json.loads((run_dir / "up.json").read_text())
    url, services = state["redis_url"], list(state["pids"].values())
    assert len(services) >= len(SERVICES)  # every service (and whatever else up starts)
    client = redis.Redis.from_url(url)
    client.set("wolfpack:test:kept", "yes")
    client.close()

    first = _redis_pid(run_dir)
    os.kill(first, signal.SIGKILL)
    up.wait_text("is back", 30)
    assert f"pid {first}" in up.text() and "was killed by SIGKILL" in up.text(), up.text()[-2000:]
    second = _redis_pid(run_dir)
    assert second not in (0, first) and _pid_of(url) == second
    assert redis.Redis.from_url(url).get("wolfpack:test:kept") == b"yes"
    assert up.proc.poll() is None and all(_alive(p) for p in services), up.text()[-2000:]

    # Three more deaths within a minute: the fourth in the window is one too many; the stack goes down.
    # Each kill waits until the launcher said the last restart is over (a server killed while it starts
    # fails its restart, a different verdict).
    for n in range(3):
        if n:
            _wait_for("the restart to finish", lambda n=n: up.text().count("is back") == n + 1, 30)  # type: ignore[misc]
        os.kill(_redis_pid(run_dir), signal.SIGKILL)
    assert up.proc.wait(timeout=90) == 1, up.text()[-3000:]
    assert "not restarting it again; stopping the stack" in up.text(), up.text()[-3000:]
    assert not any(_alive(p) for p in services)
    assert not (run_dir / "up.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_server_started_by_the_main_thread_dies_with_its_owner(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM to ``wolfpack train`` (whose main thread starts its embedded Redis) left the server running:
    the default action runs no ``atexit``. The kernel now stops it when its owner dies, either way."""
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from wolfpack.redis_server import EmbeddedRedis
        s = EmbeddedRedis(Path({str(tmp_path / "redis")!r})).start()
        print(s.proc.pid, flush=True)
        time.sleep(3600)
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    server = int(owner.stdout.readline())
    assert _alive(server)
    owner.send_signal(sig)
    owner.wait(timeout=30)
    try:
        _wait_for("the server to stop with its owner", lambda: not _alive(server), 30)
    finally:
        if _alive(server):
            os.kill(server, signal.SIGKILL)
