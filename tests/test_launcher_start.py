"""How ``wolfpack up`` starts processes that need others' addresses (``serve --await-ready``), with real
processes: the waiting one binds only once the ready files it waits on exist, exports their addresses
before its settings are read, and is stopped (NOT STARTED) when one of them never comes.
The whole stack over it: tests/test_cli.py and tests/security/test_launcher.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from wolfpack import SERVICES, rpc
from wolfpack.cli import launcher
from wolfpack.cli.serve import await_ready


def write_ready(path: Path, address: str) -> None:
    path.write_text(json.dumps({"service": path.stem, "address": address, "pid": 1}))


def test_await_ready_blocks_until_each_file_then_exports_the_addresses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("WOLFPACK_ENVIRONMENT_ADDR", "WOLFPACK_INFERENCE_ADDR"):
        # setenv first so that monkeypatch restores the variable's absence after await_ready exported it
        # (a bare delenv of an unset variable records nothing, and the address leaked into later tests)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    env_file, inf_file = tmp_path / "environment.json", tmp_path / "inference.json"
    write_ready(env_file, "127.0.0.1:1111")
    (tmp_path / "inference.json.tmp").write_text("{")  # a half-written neighbour is not the file
    late = threading.Timer(0.4, write_ready, (inf_file, "127.0.0.1:2222"))
    started = time.monotonic()
    late.start()
    await_ready({"environment": env_file, "inference": inf_file})
    assert time.monotonic() - started >= 0.35, "returned before the inference ready file existed"
    assert os.environ["WOLFPACK_ENVIRONMENT_ADDR"] == "127.0.0.1:1111"
    assert os.environ["WOLFPACK_INFERENCE_ADDR"] == "127.0.0.1:2222"


def serve(service: str, run: Path, *waits: str) -> list[str]:
    return [sys.executable, "-m", "wolfpack.cli.serve", service, "--address", "127.0.0.1:0",
            "--ready-file", str(run / f"{service}.json"), *(f"--await-ready={w}" for w in waits)]  # fmt: skip


async def test_a_waiting_service_binds_once_its_dependency_has(tmp_path: Path) -> None:
    """The reward service waits on the environment's ready file: no port before it exists, SERVING after."""
    env = {**os.environ, "WOLFPACK_RUN_DIR": str(tmp_path), "WOLFPACK_LOG_LEVEL": "WARNING"}
    dep = tmp_path / "environment.json"
    proc = await asyncio.create_subprocess_exec(*serve("reward", tmp_path, f"environment={dep}"), env=env)
    svc = launcher.ServiceProc("reward", "127.0.0.1:0", proc=proc)
    try:
        await asyncio.sleep(3.0)  # its imports are done well before this on an idle machine
        assert proc.returncode is None and not (tmp_path / "reward.json").exists(), (
            "bound without its dependency"
        )
        write_ready(dep, "127.0.0.1:9")
        await launcher._wait_bound(svc, tmp_path / "reward.json", time.monotonic() + 60)
        assert svc.status == "STARTING" and not launcher._port_unknown(svc.address)
        assert await rpc.check_health(svc.address, timeout_s=10) == "SERVING"
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)


async def test_a_service_waiting_for_one_that_never_binds_is_stopped_as_not_started(tmp_path: Path) -> None:
    env = {**os.environ, "WOLFPACK_RUN_DIR": str(tmp_path)}
    dead = launcher.ServiceProc(
        "environment",
        "127.0.0.1:0",
        proc=await asyncio.create_subprocess_exec(sys.executable, "-c", "exit(3)"),
    )
    deadline = time.monotonic() + 60
    dead_bound = asyncio.create_task(launcher._wait_bound(dead, tmp_path / "environment.json", deadline))
    proc = await asyncio.create_subprocess_exec(
        *serve("rollout", tmp_path, f"environment={tmp_path / 'environment.json'}"), env=env
    )
    waiting = launcher.ServiceProc("rollout", "127.0.0.1:0", proc=proc)
    try:
        await asyncio.wait_for(
            launcher._wait_bound_after(waiting, tmp_path / "rollout.json", deadline, [(dead, dead_bound)]), 60
        )
        assert dead.status == "EXITED(3)"
        assert waiting.status == "NOT STARTED"
        assert await asyncio.wait_for(proc.wait(), 30) == -signal.SIGTERM  # stopped, not left waiting
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_the_start_order_has_every_process_once_and_waiters_last() -> None:
    """A service added to ``SERVICES`` but not to ``START_ORDER`` would never start; a waiter placed
    before what it waits for would hold a start slot that its dependency needs (a deadlock on 2 slots)."""
    assert sorted(launcher.START_ORDER) == sorted([*SERVICES, "web"])
    for name, deps in launcher.DEPENDS_ON.items():
        assert all(launcher.START_ORDER.index(d) < launcher.START_ORDER.index(name) for d in deps)
    assert set(launcher.START_ORDER[-len(launcher.DEPENDS_ON) :]) == set(launcher.DEPENDS_ON)
    assert launcher.START_ORDER[0] == "inference"  # the slowest start-up gets a slot first
    assert launcher.start_slots() >= 2
