"""The ``wolfpack`` command as a user runs it: a subprocess, real Redis, real gRPC health checks."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

WOLFPACK = [sys.executable, "-m", "wolfpack.cli.main"]


def run(
    args: list[str], tmp_path: Path, timeout: float = 180, **env: str
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("WOLFPACK_")}
    # The tiny random model keeps these tests hermetic: no SmolLM2 download or conversion, whatever the cache.
    full_env.update(
        {
            "WOLFPACK_RUN_DIR": str(tmp_path / "run"),
            "COLUMNS": "200",
            "WOLFPACK_INFERENCE_MODEL": "tiny",
            **env,
        }
    )
    return subprocess.run(
        [*WOLFPACK, *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=tmp_path
    )


def test_up_check_starts_everything_on_embedded_redis(tmp_path: Path) -> None:
    result = run(["up", "--check", "--base-port", "0"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "redis (embedded)" in out and "PONG" in out
    for service in ("environment", "inference", "reward", "curriculum", "rollout", "trainer"):
        line = next(ln for ln in out.splitlines() if f" {service} " in ln)
        assert "SERVING" in line, line
    web = next(ln for ln in out.splitlines() if " web " in ln)  # `wolfpack web` too, with its URL
    assert "http://127.0.0.1:" in web and "SERVING" in web, web
    assert "all services SERVING" in out
    assert not (tmp_path / "run" / "up.json").exists(), "state file must be removed on shutdown"
    assert not (tmp_path / "run" / "redis" / "redis.pid").exists(), "embedded redis must be stopped"


def test_bad_settings_give_a_readable_error(tmp_path: Path) -> None:
    result = run(["status"], tmp_path, WOLFPACK_BASE_PORT="eighty")
    assert result.returncode == 2
    assert "WOLFPACK_BASE_PORT" in result.stdout and "Traceback" not in result.stdout + result.stderr


def test_status_reports_unreachable_services(tmp_path: Path) -> None:
    result = run(["status"], tmp_path, WOLFPACK_BASE_PORT="1")
    assert result.returncode == 1
    assert "UNREACHABLE" in result.stdout


def test_every_command_has_help(tmp_path: Path) -> None:
    for cmd in (
        ["--help"],
        ["up", "--help"],
        ["status", "--help"],
        ["serve", "--help"],
        ["config", "--help"],
        ["web", "--help"],
    ):
        result = run(cmd, tmp_path, timeout=60)
        assert result.returncode == 0 and "Usage" in result.stdout, cmd


def test_up_streams_prefixed_logs_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("WOLFPACK_")}
    env.update(
        {
            "WOLFPACK_RUN_DIR": str(tmp_path / "run"),
            "COLUMNS": "200",
            "WOLFPACK_LOG_LEVEL": "INFO",
            "WOLFPACK_INFERENCE_MODEL": "tiny",
        }
    )
    proc = subprocess.Popen(
        [*WOLFPACK, "up", "--base-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C to stop" in line:
            break
    assert any("Ctrl-C to stop" in ln for ln in lines), "".join(lines)
    state = (tmp_path / "run" / "up.json").read_text()
    assert "environment" in state
    status = run(["status"], tmp_path)
    assert status.returncode == 0, status.stdout
    # the web view `up` started: its URL (the page to open) and its health, as in the `up` table
    web = next(ln for ln in status.stdout.splitlines() if " web " in ln)
    assert "http://127.0.0.1:" in web and "SERVING" in web, status.stdout
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    output = "".join(lines) + rest
    assert proc.returncode == 0, output
    assert any(ln.strip().startswith("environment |") for ln in output.splitlines()), "logs are prefixed"
    assert "stopped." in output
    assert not (tmp_path / "run" / "redis" / "redis.pid").exists()


def test_serve_on_a_taken_port_is_one_clear_line(tmp_path: Path) -> None:
    """A real socket holds the port first: ``wolfpack serve`` exits 1 with one line naming the service and
    the address, not a grpcio RuntimeError traceback."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = run(["serve", "reward", "--address", f"127.0.0.1:{port}"], tmp_path, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    ours = [ln for ln in result.stderr.splitlines() if ln.startswith("reward: ")]
    assert len(ours) == 1 and ours[0].startswith(f"reward: cannot listen on 127.0.0.1:{port}: "), (
        result.stderr
    )
    assert "in use" in ours[0] and "WOLFPACK_REWARD_ADDR" in ours[0]


def test_serve_on_port_0_reports_the_bound_port(tmp_path: Path) -> None:
    """``--address host:0 --ready-file F``: the server binds a port the kernel picks and writes it to F;
    the port read back answers health checks (no port is guessed beforehand, so none can be taken)."""
    import json
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("WOLFPACK_")}
    env["WOLFPACK_RUN_DIR"] = str(tmp_path / "run")
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [*WOLFPACK, "serve", "reward", "--address", "127.0.0.1:0", "--ready-file", str(ready)],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120  # bounded wait for start-up (imports on a loaded machine)
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        host, _, port = info["address"].rpartition(":")
        assert (
            host == "127.0.0.1" and int(port) > 0 and info["service"] == "reward" and info["pid"] == proc.pid
        )
        from wolfpack import rpc

        assert asyncio.run(rpc.check_health(info["address"], timeout_s=30)) == "SERVING"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
