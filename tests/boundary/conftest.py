"""Boundary tests: behaviour the README and docs promise, checked over the real wire (gRPC on loopback
sockets, the HTTP gateway, server subprocesses stopped by signals), each able to fail when the behaviour
breaks. Helpers here: an environment stack with chosen limits and a settable clock, and server
subprocesses that bind port 0 and report their port in their own "serving" log line."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from wolfpack import rpc
from wolfpack.settings import Settings, load_settings
from wolfpack_environment import sessions
from wolfpack_environment.client import EnvironmentClient
from wolfpack_environment.gateway import RunningGateway, start_gateway
from wolfpack_environment.server import EnvironmentServicer, register
from wolfpack_environment.sessions import EpisodeManager, Limits

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60.0
"""Bound on waits for something that happens within milliseconds; only a hung run reaches it."""


class FakeClock:
    """``time`` as the session manager sees it: ``monotonic()`` moves only when a test says so, so TTLs,
    rate buckets and turn deadlines are exact, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _TimeModule:
    """The ``time`` module with ``monotonic`` replaced (everything else, e.g. ``perf_counter``, is real)."""

    def __init__(self, clock: FakeClock) -> None:
        self.monotonic = clock.monotonic

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(sessions, "time", _TimeModule(fake))
    return fake


@dataclass
class EnvStack:
    servicer: EnvironmentServicer
    server: rpc.Server
    client: EnvironmentClient
    settings: Settings
    target: str

    @property
    def manager(self) -> EpisodeManager:
        return self.servicer.manager


@pytest.fixture
def limits() -> Limits:
    return Limits(max_episodes=100, max_text_chars=2_000)


@pytest.fixture
async def env(limits: Limits) -> AsyncIterator[EnvStack]:
    """A real environment service on 127.0.0.1:0 with ``limits`` (override the fixture to change them)."""
    settings = load_settings(rpc_timeout_s=20)
    servicer = EnvironmentServicer(EpisodeManager(limits))
    server = await rpc.start_server("environment", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    target = f"127.0.0.1:{server.port}"
    async with EnvironmentClient(target, settings) as client:
        yield EnvStack(servicer, server, client, settings, target)
    servicer.manager.close_all()
    await server.stop(0)


@pytest.fixture
async def gateway(env: EnvStack) -> AsyncIterator[RunningGateway]:
    running = await start_gateway("127.0.0.1", 0, env.target, settings=env.settings)
    yield running
    await running.stop()


# --- server subprocesses -------------------------------------------------------------------------------


@dataclass
class ServerProcess:
    """A server subprocess writing JSON log lines to stderr; every line is kept and can be waited for."""

    proc: subprocess.Popen[str]
    logs: list[dict[str, Any]] = field(default_factory=list)
    stdout: queue.Queue[str | None] = field(default_factory=queue.Queue)
    _lines: queue.Queue[dict[str, Any] | None] = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.put(line)
        self.stdout.put(None)

    def stdout_line(self) -> str:
        """The next line the process prints (an empty string once it has exited)."""
        line = self.stdout.get(timeout=WAIT_S)
        return "" if line is None else line

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                record = json.loads(line)
            except ValueError:
                record = {"msg": line.rstrip("\n"), "raw": True}
            self._lines.put(record)
        self._lines.put(None)

    def wait_log(self, match: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """The first log record (seen so far or to come) that ``match`` accepts."""
        for record in self.logs:
            if match(record):
                return record
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                record = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no log line {what} within {WAIT_S}s: {self.logs[-20:]}") from None
            if record is None:
                raise AssertionError(
                    f"exited ({self.proc.wait()}) before a log line {what}: {self.logs[-20:]}"
                )
            self.logs.append(record)
            if match(record):
                return record

    def port(self) -> int:
        """The port the server bound (it was asked for port 0), from its "serving" log line."""
        record = self.wait_log(lambda r: r.get("msg") == "serving" and "address" in r, '"serving"')
        return int(str(record["address"]).rpartition(":")[2])

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=WAIT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()

    def drain_logs(self) -> list[dict[str, Any]]:
        """Every log line, after the process has exited."""
        while True:
            record = self._lines.get(timeout=WAIT_S)
            if record is None:
                return self.logs
            self.logs.append(record)


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "WOLFPACK_"))}
    env.update({"WOLFPACK_LOG_FORMAT": "json", "WOLFPACK_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


@pytest.fixture
def spawn() -> Iterator[Callable[..., ServerProcess]]:
    """``spawn(args, env)``: ``python args...`` with JSON logs; killed at the end of the test if alive."""
    started: list[ServerProcess] = []

    def start(args: Sequence[str], env: dict[str, str] | None = None) -> ServerProcess:
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=_env(env or {}),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        server = ServerProcess(proc)
        started.append(server)
        return server

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
        for pipe in (server.proc.stdout, server.proc.stderr):
            if pipe is not None:
                pipe.close()
