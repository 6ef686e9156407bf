"""Service mode's stack: use the running one, or start one for the job (``wolfpack up`` as a child).

Why a child ``wolfpack up`` rather than a second launcher: one launcher owns process groups, pid files,
orphan reaping and draining; the job only needs its addresses (``up.json``) and to stop it at the end.
The child's inference serves every policy of the config from the same base model the learners load,
so the pushed versions apply to the weights that sampled the trajectories.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from wolfpack import SERVICES, rpc
from wolfpack.settings import Settings
from wolfpack_trainer.config import TrainConfig


def _healthy(addresses: dict[str, str]) -> bool:
    async def check() -> bool:
        names = ("environment", "inference", "reward")
        states = await asyncio.gather(*(rpc.check_health(addresses[n]) for n in names if n in addresses))
        return len(states) == len(names) and all(s == "SERVING" for s in states)

    try:
        return asyncio.run(check())
    except Exception:  # any failure to reach a service means "not running"
        return False


def running_stack(settings: Settings) -> dict[str, str] | None:
    """Addresses of a healthy stack started by ``wolfpack up`` on ``settings.run_dir``, if any."""
    path = settings.run_dir / "up.json"
    if not path.exists():
        return None
    services = json.loads(path.read_text()).get("services", {})
    return services if isinstance(services, dict) and _healthy(services) else None


@contextlib.contextmanager
def child_stack(
    cfg: TrainConfig, run_dir: Path, models: dict[str, str], timeout_s: float = 600.0
) -> Iterator[Path]:
    """Start ``wolfpack up`` in ``run_dir`` serving ``models`` (policy id → checkpoint) and yield its run
    directory once ``up.json`` lists every service healthy; SIGTERM (drain) on exit."""
    run_dir.mkdir(parents=True, exist_ok=True)
    policies = [
        {"policy_id": pid, "model": path, "device": "auto", "dtype": "auto"} for pid, path in models.items()
    ]
    (run_dir / "policies.yaml").write_text(yaml.safe_dump(policies))
    env = {
        **os.environ,
        "WOLFPACK_RUN_DIR": str(run_dir),
        "WOLFPACK_BASE_PORT": "0",
        "WOLFPACK_INFERENCE_POLICIES_FILE": str(run_dir / "policies.yaml"),
    }
    log = (run_dir / "up.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "wolfpack.cli.main", "up", "--base-port", "0", "--timeout", str(timeout_s)],
        env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout_s
        up = run_dir / "up.json"
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"wolfpack up exited ({proc.returncode}); see {run_dir / 'up.log'}")
            if up.exists():
                services = json.loads(up.read_text()).get("services", {})
                if set(services) >= set(SERVICES) and _healthy(services):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the stack did not become healthy in {timeout_s:.0f}s; see {run_dir / 'up.log'}"
                )
            time.sleep(0.5)
        yield run_dir
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
