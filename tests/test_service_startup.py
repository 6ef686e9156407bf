"""How a service process starts and ends under ``python -m wolfpack.cli.serve`` (what ``wolfpack up`` runs),
with real processes: the cyclic collector is off during start-up and on again once the server is up, with
start-up's imports frozen out of its reach; only the inference service loads torch and transformers, and
it never loads Redis (``launcher.WITHOUT_REDIS`` starts it before Redis is up); a stopped server exits
through ``exit_now``, which still runs every ``atexit`` handler and flushes its output.

Start-up time itself is measured in ``bench/startup`` (``up --check``), not here."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from wolfpack import SERVICES, rpc
from wolfpack.cli import launcher
from wolfpack.cli.serve import serve_service
from wolfpack.settings import load_settings

PROBE = """
import gc, json, os, signal, sys, threading, time
from pathlib import Path
from wolfpack.cli.serve import exit_now, serve_service

service, ready, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])

def look():
    while not ready.exists():
        time.sleep(0.01)
    time.sleep(0.2)  # the server's own set-up after its bind (``rpc.serve`` tunes the collector)
    out.write_text(json.dumps({
        "gc_enabled": gc.isenabled(), "frozen": gc.get_freeze_count(), "threshold": gc.get_threshold(),
        "collected": [g["collected"] for g in gc.get_stats()],
        "modules": sorted(sys.modules),
    }))
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=look, daemon=True).start()
exit_now(serve_service(service, "127.0.0.1:0", ready))
"""


def probe(service: str, tmp_path: Path) -> dict[str, Any]:
    """Start ``service`` as ``wolfpack up`` does, read its state once it has bound, stop it (SIGTERM)."""
    ready, out = tmp_path / f"{service}.ready.json", tmp_path / f"{service}.probe.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WOLFPACK_")}
    env.update(
        WOLFPACK_RUN_DIR=str(tmp_path / "run"), WOLFPACK_LOG_LEVEL="WARNING", WOLFPACK_INFERENCE_MODEL="tiny"
    )
    if service not in launcher.WITHOUT_REDIS:  # a URL to connect to later; nothing here writes to it
        env["WOLFPACK_REDIS_URL"] = "redis://127.0.0.1:1/0"
    if service == "rollout":  # it needs the others' addresses at start (nothing is called at start)
        env.update({f"WOLFPACK_{s.upper()}_ADDR": "127.0.0.1:1" for s in SERVICES if s != "rollout"})
    done = subprocess.run(
        [sys.executable, "-c", PROBE, service, str(ready), str(out)],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return dict(json.loads(out.read_text()))


HEAVY = ("torch", "transformers")


@pytest.mark.parametrize("service", [s for s in SERVICES if s != "inference"])
def test_a_service_collects_again_once_up_and_loads_no_torch(service: str, tmp_path: Path) -> None:
    state = probe(service, tmp_path)
    assert state["gc_enabled"] is True, "the collector stays off after start-up"
    assert state["frozen"] > 10_000, "start-up was not frozen"
    assert state["threshold"] == [50_000, 20, 100]
    # one full collection so far (``tune_gc``'s), over what set-up allocated after the imports were frozen
    # (``rpc.freeze_imports``): none of the imports' own garbage (~500-700 objects) is among what it found
    assert state["collected"][2] < 200, state["collected"]
    modules = set(state["modules"])
    assert f"wolfpack_{service}.server" in modules  # the probe saw a real start
    assert sorted(m for m in modules if m.split(".")[0] in HEAVY) == []


def test_the_inference_service_loads_its_model_collects_again_and_never_loads_redis(tmp_path: Path) -> None:
    state = probe("inference", tmp_path)
    assert state["gc_enabled"] is True
    assert state["frozen"] > 100_000  # torch's modules among them
    # torch's and transformers' imports were frozen before the model loaded: the one collection found only
    # the model load's garbage (~300 objects), not the imports' (~10,000)
    assert state["collected"][2] < 2_000, state["collected"]
    modules = set(state["modules"])
    assert {"torch", "transformers", "transformers.models.qwen2.modeling_qwen2"} <= modules
    # ``launcher.WITHOUT_REDIS``: it is started before Redis, without its URL
    assert sorted(m for m in modules if m == "redis" or m.startswith("redis.")) == []


def test_serve_service_leaves_the_collector_on_when_it_returns_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """Invalid settings end ``serve_service`` before any server (exit code 2): the collector it turned off
    for start-up is on again (in-process callers, tests, keep collecting)."""
    monkeypatch.setenv("WOLFPACK_BASE_PORT", "eighty")
    assert gc.isenabled()
    assert serve_service("reward", "127.0.0.1:0", None) == 2
    assert gc.isenabled()


EXITS = """
import atexit, sys, threading, time
from wolfpack.cli.serve import exit_now
atexit.register(lambda: print("handler ran", flush=True))
if sys.argv[1] == "thread":
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished"))).start()
sys.stdout.write("buffered, not flushed")
exit_now(3)
"""


def test_exit_now_runs_the_exit_handlers_and_flushes_output() -> None:
    done = subprocess.run([sys.executable, "-c", EXITS, "plain"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "buffered, not flushed" in done.stdout and "handler ran" in done.stdout


def test_exit_now_waits_for_a_running_non_daemon_thread() -> None:
    done = subprocess.run([sys.executable, "-c", EXITS, "thread"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "thread finished" in done.stdout and "handler ran" in done.stdout


def test_services_started_before_redis_get_no_redis_url(tmp_path: Path) -> None:
    settings = load_settings(run_dir=tmp_path, redis_url=None)
    assert "WOLFPACK_REDIS_URL" not in launcher.child_env(settings, None, {})
    assert (
        launcher.child_env(settings, "redis://127.0.0.1:7/0", {})["WOLFPACK_REDIS_URL"]
        == "redis://127.0.0.1:7/0"
    )
    assert launcher.WITHOUT_REDIS == ("inference",) and launcher.START_ORDER[0] == "inference"


def test_the_launcher_module_loads_no_redis_client_nor_settings() -> None:
    """``wolfpack up`` spawns the inference service before it imports pydantic-settings (~0.2 s) to read its
    settings, and before it imports redis-py (~0.1 s) to start Redis."""
    code = textwrap.dedent("""
        import sys
        import wolfpack.cli.launcher
        heavy = ("redis", "wolfpack.redis_server", "wolfpack.settings", "pydantic_settings")
        print(sorted(m for m in sys.modules if m in heavy or m.startswith(tuple(h + "." for h in heavy))))
    """)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_start_on_stdin_binds_where_the_launcher_says(tmp_path: Path) -> None:
    """``serve --start-on-stdin`` (how ``wolfpack up`` starts ``WITHOUT_REDIS`` services before reading its
    settings): it imports, waits for one JSON line, then binds the address and writes the ready file it names,
    with the environment it adds."""
    ready = tmp_path / "reward.ready.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WOLFPACK_")}
    env["WOLFPACK_LOG_LEVEL"] = "WARNING"
    proc = subprocess.Popen(
        [sys.executable, "-m", "wolfpack.cli.serve", "reward", "--start-on-stdin"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
    )  # fmt: skip
    try:
        time.sleep(0.5)
        assert proc.poll() is None and not ready.exists()  # waiting for its instructions
        start = {
            "address": "127.0.0.1:0",
            "ready_file": str(ready),
            "env": {"WOLFPACK_RUN_DIR": str(tmp_path)},
        }
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(start) + "\n")
        proc.stdin.close()
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        address = json.loads(ready.read_text())["address"]
        assert asyncio.run(rpc.check_health(address, timeout_s=5.0)) == "SERVING"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_start_on_stdin_ends_when_the_launcher_sends_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "wolfpack.cli.serve", "reward", "--start-on-stdin"],
        input="", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr


def test_up_refused_by_its_settings_leaves_no_early_process(tmp_path: Path) -> None:
    """``wolfpack up`` spawns the inference service before it reads its settings; when they are invalid it
    exits 2 with the reason, and that process is gone too."""
    marker = f"startup-test-{uuid.uuid4()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WOLFPACK_")}
    env.update(WOLFPACK_RUN_DIR=str(tmp_path), WOLFPACK_BASE_PORT="eighty", STARTUP_MARKER=marker)
    done = subprocess.run(
        [sys.executable, "-m", "wolfpack.cli.main", "up", "--check"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 2 and "WOLFPACK_BASE_PORT" in done.stdout, done.stdout + done.stderr
    time.sleep(0.2)
    left = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and marker.encode() in (d / "environ").read_bytes():
                left.append((d / "cmdline").read_bytes())
        except OSError:
            continue
    assert left == []


CONSOLE_SCRIPT = """
import importlib, sys, tomllib
from pathlib import Path

class Mark:  # its __del__ runs in the interpreter's teardown, which ``exit_now`` skips
    def __del__(self):
        sys.stderr.write("TEARDOWN\\n")

mark = Mark()
# what the ``wolfpack`` script pip generates from pyproject.toml does: import the entry point, exit with it
target = tomllib.loads(Path(sys.argv[1]).read_text())["project"]["scripts"]["wolfpack"]
module, _, attr = target.partition(":")
entry = getattr(importlib.import_module(module), attr)
sys.argv = ["wolfpack", "up", "--check", "--base-port", "0"]
sys.exit(entry())
"""


def test_the_wolfpack_script_ends_up_check_without_the_interpreter_teardown(tmp_path: Path) -> None:
    """The installed ``wolfpack`` command (``[project.scripts]``) goes through ``main``, which ends a stopped
    stack's launcher through ``exit_now`` (~0.1 s of ``up --check``); an entry point straight to the Typer
    ``app`` tore the interpreter down (only ``python -m wolfpack.cli.main`` skipped it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WOLFPACK_")}
    env.update(WOLFPACK_RUN_DIR=str(tmp_path), WOLFPACK_LOG_LEVEL="WARNING", WOLFPACK_INFERENCE_MODEL="tiny")
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    done = subprocess.run(
        [sys.executable, "-c", CONSOLE_SCRIPT, str(pyproject)],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and "all services SERVING" in done.stdout, done.stdout + done.stderr
    assert "TEARDOWN" not in done.stderr
