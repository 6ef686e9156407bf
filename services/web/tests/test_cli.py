"""``wolfpack web`` as a user runs it: prints its URL, serves, stops on SIGTERM; refuses a public bind
while spectating is on; settings errors are one readable line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)
WOLFPACK = [sys.executable, "-m", "wolfpack.cli.main"]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WOLFPACK_")}
    return env | {"WOLFPACK_RUN_DIR": str(tmp_path / "run"), "WOLFPACK_LOG_FORMAT": "json"} | extra


def test_web_prints_its_url_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*WOLFPACK, "web", "--address", "127.0.0.1:0", "--env", "127.0.0.1:1", "--runs", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("wolfpack web on http://127.0.0.1:"), line
        url = line.split(" on ")[1].strip()
        with urllib.request.urlopen(url + "healthz", timeout=10) as resp:
            assert json.load(resp) == {"status": "SERVING", "spectate": True, "stream": False}
        with urllib.request.urlopen(url, timeout=10) as resp:
            page = resp.read().decode()
            assert "<title>Wolfpack</title>" in page and resp.headers["Content-Security-Policy"]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_web_refuses_a_public_bind_while_spectating(tmp_path: Path) -> None:
    result = subprocess.run(
        [*WOLFPACK, "web", "--address", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(tmp_path),
    )
    assert result.returncode == 1 and "WOLFPACK_WEB_TRUST_NETWORK" in result.stderr, result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_bad_web_settings_are_one_readable_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [*WOLFPACK, "web"], capture_output=True, text=True, timeout=30,
        env=_env(tmp_path, WOLFPACK_WEB_MAX_UPLOAD_MB="lots"),
    )  # fmt: skip
    assert result.returncode == 2 and "WOLFPACK_WEB_MAX_UPLOAD_MB" in result.stdout, result.stdout
    assert "Traceback" not in result.stdout + result.stderr
