"""``wolfpack play`` is a purely local command: it must not load gRPC, OpenTelemetry, Redis or torch; nor
must the other local commands (help, ``config``, ``scenarios`` with a file store). Every ``wolfpack`` command imports each service's CLI module to mount its commands, so a module
that imports a client at its top drags the whole RPC stack into local commands (it did: ~0.25 s and
18 MiB through ``wolfpack_rollout.summary`` -> ``wolfpack_curriculum.client`` -> ``wolfpack.rpc``).

The command runs in a fresh interpreter, as a user runs it; the module set is read at its exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

HEAVY = ("grpc", "opentelemetry", "redis", "torch", "transformers", "wolfpack.rpc", "wolfpack.telemetry")

PROBE = """
import atexit, json, sys
atexit.register(lambda: sys.stderr.write("MODULES " + json.dumps(sorted(sys.modules)) + "\\n"))
sys.argv = ["wolfpack", *sys.argv[1:]]
from wolfpack.cli.main import main
main()
"""


def modules_of(*args: str) -> tuple[str, set[str]]:
    """(stdout, modules loaded at exit) of ``wolfpack *args`` in a fresh interpreter; ``{tmp}`` in an
    argument is a scratch directory of this call."""
    # A run dir of its own: with ``wolfpack up`` running in the checkout's ``.wolfpack``, ``play`` would
    # (rightly) go through that stack and load gRPC.
    with tempfile.TemporaryDirectory() as run_dir:
        done = subprocess.run(
            [sys.executable, "-c", PROBE, *(a.replace("{tmp}", run_dir) for a in args)],
            capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "WOLFPACK_RUN_DIR": run_dir},
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES "))
    return done.stdout, set(json.loads(line.removeprefix("MODULES ")))


def heavy_in(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_wolfpack_play_loads_no_rpc_telemetry_redis_or_torch() -> None:
    out, modules = modules_of("play", "werewolf", "--seed", "3")
    assert "Summary: werewolf_v1/6p seed 3" in out  # the command really ran
    assert "wolfpack_games.werewolf" in modules
    assert heavy_in(modules) == []
    # nor what only other commands use: the event loop, protobuf, the rollout's config and summary
    # (every service's CLI module is imported to mount its commands; ~0.1 s of the command's ~0.5 s)
    unused: tuple[str, ...] = (
        "asyncio",
        "google.protobuf",
        "wolfpack_rollout.config",
        "wolfpack_rollout.summary",
    )
    unused += ("wolfpack_games.scenarios",)  # a Werewolf game loads only the Werewolf package
    assert sorted(m for m in unused if m in modules) == []


LOCAL_COMMANDS = {
    "help": (("--help",), "Commands"),
    "play help": (("play", "--help"), "Usage: wolfpack play"),
    "play werewolf 12p zh": (
        ("play", "werewolf", "--players", "12", "--seed", "3", "--lang", "zh"),
        "Summary",
    ),
    "play bargaining": (("play", "bargaining", "--seed", "3", "--bots", "heuristic"), "Summary"),
    "config": (("config",), "WOLFPACK_RUN_DIR"),
    "scenarios generate": (
        ("scenarios", "generate", "--n", "2", "--family", "bargaining", "--store", "{tmp}/store"),
        "2 new in the store",
    ),
    "scenarios list": (("scenarios", "list", "--store", "{tmp}/store"), "family"),
    "train help": (("train", "--help"), "Usage: wolfpack train"),
}


@pytest.mark.parametrize("name", sorted(LOCAL_COMMANDS))
def test_local_commands_load_no_rpc_telemetry_redis_or_torch(name: str) -> None:
    """Every command that talks to no service: none of the RPC stack, telemetry, Redis or torch (a service
    CLI, a game package or a shared module that imports one at its top shows here)."""
    args, shown = LOCAL_COMMANDS[name]
    out, modules = modules_of(*args)
    assert shown in out  # the command really ran
    assert heavy_in(modules) == []


def test_the_probe_sees_heavy_modules_where_a_command_loads_them() -> None:
    """The control case: ``wolfpack config`` is local too, but ``serve``-side imports are visible to the
    probe when something loads them (here ``-c`` imports ``wolfpack.rpc`` before the command)."""
    done = subprocess.run(
        [sys.executable, "-c", "import wolfpack.rpc\n" + PROBE, "config"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES "))
    modules = set(json.loads(line.removeprefix("MODULES ")))
    assert "grpc" in heavy_in(modules) and "wolfpack.telemetry" in heavy_in(modules)
