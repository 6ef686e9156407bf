"""``wolfpack train`` in local mode (``rollout.mode: local``) starts no service: the learner's model plays in
process, the reward library scores, the trajectories go through the Redis stream. It must not load gRPC
or OpenTelemetry (Redis it uses). It did, through the rollout driver (gRPC status codes and error type,
OpenTelemetry spans), the stream (its backlog gauge, trace context in entries), the reward library's error
class and the clients the rollout package publishes for service mode.

A real one-update run of the demo config in a fresh interpreter, as a user runs it; the module set is read
at its exit (``test_play_imports.py`` does the same for the other local commands).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
UNUSED = ("grpc", "opentelemetry", "wolfpack.rpc", "wolfpack.telemetry")

PROBE = """
import atexit, json, sys
atexit.register(lambda: sys.stderr.write("MODULES " + json.dumps(sorted(sys.modules)) + "\\n"))
sys.argv = ["wolfpack", *sys.argv[1:]]
from wolfpack.cli.main import main
main()
"""


def test_a_local_mode_training_run_loads_no_grpc_or_opentelemetry(tmp_path: Path) -> None:
    args = [
        "train", "-c", str(REPO / "configs" / "demo-ultimatum-local.yaml"), "--run-dir", str(tmp_path / "run"),
        "--updates", "1", "rollout.episodes_per_update=8", "eval.episodes=4",
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "learning: win_rate" in done.stdout  # the run really trained and evaluated
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES "))
    modules = set(json.loads(line.removeprefix("MODULES ")))
    # what the run does use: the driver, the reward library, the stream over Redis
    assert {"wolfpack_rollout.driver", "wolfpack_rewards", "wolfpack.stream", "redis"} <= modules
    assert sorted(m for m in modules if any(m == u or m.startswith(u + ".") for u in UNUSED)) == []
