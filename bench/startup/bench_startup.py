"""Start-up cost: each service alone, ``wolfpack up --check``, and a local command (one table, one run).

Why: ``wolfpack up --check`` is the first thing anyone runs, and a slow one hides where the time goes
(imports, model load, the launcher's waiting loops). Each cell runs its command as a user would, in a
fresh process, and reports wall clock and CPU seconds (user + system of the process and every child it
waited for, from ``getrusage``/``/proc``): on this shared 2-core machine the wall clock depends on other
tenants' load, CPU seconds much less, and on an idle 2-core machine the wall clock of ``up --check`` is
at least its CPU seconds over 2.

Cells, in interleaved rounds (the order rotates each round), min / median / max over rounds:

- ``serve SERVICE``: one service alone (``--address 127.0.0.1:0 --ready-file``; embedded Redis for those
  that need one is started once, outside the cell): seconds to its ready file (imports + set-up + bind),
  to SERVING on the health check, and its own CPU seconds at SERVING;
- ``import SERVICE``: ``python -c "import wolfpack_SERVICE.server"`` alone (what imports cost of the above);
- ``up --check``: the whole stack (embedded Redis, every service, health table, shutdown);
- ``play werewolf``: ``wolfpack play werewolf`` (a local command: no RPC, no Redis).

    .venv/bin/python bench/startup/bench_startup.py                 # ~2-3 minutes
    .venv/bin/python bench/startup/bench_startup.py --rounds 3 --cells up play
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wolfpack import SERVICES, rpc
from wolfpack.redis_server import EmbeddedRedis

WOLFPACK = [sys.executable, "-m", "wolfpack.cli.main"]


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a live process (its waited-for children included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def run_command(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of a command run to its end; it must succeed."""
    cpu0, t0 = children_cpu(), time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args[2:])} exited {done.returncode}: {done.stdout[-800:]}{done.stderr[-800:]}"
        )
    return wall, cpu


async def serve_one(service: str, env: dict[str, str], scratch: Path) -> dict[str, float]:
    """Start ``wolfpack serve SERVICE`` on port 0; seconds to ready file and SERVING, CPU at SERVING."""
    ready = scratch / f"{service}.ready.json"
    ready.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*WOLFPACK, "serve", service, "--address", "127.0.0.1:0", "--ready-file", str(ready)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        while not ready.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"serve {service} exited {proc.returncode}: {proc.stderr.read()[-800:]!r}")  # type: ignore[union-attr]
            await asyncio.sleep(0.005)
        t_ready = time.perf_counter() - t0
        address = json.loads(ready.read_text())["address"]
        while await rpc.check_health(address, timeout_s=5.0) != "SERVING":
            await asyncio.sleep(0.005)
        t_serving = time.perf_counter() - t0
        cpu = proc_cpu(proc.pid)
        t_stop = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 60)
        return {"ready": t_ready, "serving": t_serving, "cpu": cpu, "stop": time.perf_counter() - t_stop}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cells", nargs="+", default=["serve", "import", "up", "play"],
                    choices=["serve", "import", "up", "play"])  # fmt: skip
    args = ap.parse_args()
    results: dict[str, dict[str, list[float]]] = {}

    def record(cell: str, **values: float) -> None:
        for key, value in values.items():
            results.setdefault(cell, {}).setdefault(key, []).append(value)

    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        redis = EmbeddedRedis(scratch / "redis").start()
        env = {
            **os.environ,
            "WOLFPACK_REDIS_URL": redis.url,
            "WOLFPACK_RUN_DIR": str(scratch / "run"),
            "WOLFPACK_LOG_LEVEL": "WARNING",
        }
        up_env = {k: v for k, v in env.items() if k != "WOLFPACK_REDIS_URL"}  # up starts its own Redis
        cells: list[tuple[str, object]] = []
        if "serve" in args.cells:
            cells += [(f"serve {s}", s) for s in SERVICES]
        if "import" in args.cells:
            cells += [(f"import {s}", s) for s in SERVICES]
        if "up" in args.cells:
            cells.append(("up --check", None))
        if "play" in args.cells:
            cells.append(("play werewolf", None))
        try:
            for r in range(args.rounds):
                shift = r % len(cells)
                for name, arg in cells[shift:] + cells[:shift]:
                    if name.startswith("serve "):
                        record(name, **asyncio.run(serve_one(str(arg), env, scratch)))
                    elif name.startswith("import "):
                        wall, cpu = run_command([sys.executable, "-c", f"import wolfpack_{arg}.server"], env)
                        record(name, serving=wall, cpu=cpu)
                    elif name == "up --check":
                        wall, cpu = run_command([*WOLFPACK, "up", "--check", "--base-port", "0"], up_env)
                        record(name, serving=wall, cpu=cpu)
                    else:
                        wall, cpu = run_command([*WOLFPACK, "play", "werewolf", "--seed", "3"], env)
                        record(name, serving=wall, cpu=cpu)
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        finally:
            redis.stop()

    def stat(values: list[float] | None) -> str:
        if not values:
            return ""
        return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"

    print(
        f"{args.rounds} interleaved rounds; median (min–max) seconds; load average {os.getloadavg()[0]:.1f}\n"
    )
    print("| cell | to ready file | wall (to SERVING / to exit) | CPU s | stop after SIGTERM |")
    print("| --- | --- | --- | --- | --- |")
    for name, values in results.items():
        print(
            f"| {name} | {stat(values.get('ready'))} | {stat(values.get('serving'))} | {stat(values.get('cpu'))} "
            f"| {stat(values.get('stop'))} |"
        )


if __name__ == "__main__":
    main()
