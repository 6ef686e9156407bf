"""Start-up cost: each service alone, ``wolfpack up --check``, and a local command (one table, one run).

Why: ``wolfpack up --check`` is the first thing anyone runs, and a slow one hides where the time goes
(imports, model load, the launcher's waiting loops). Each cell runs its command as a user would, in a
fresh process, and reports wall clock and CPU seconds (user + system of the process and every child it
waited for, from ``getrusage``/``/proc``): on this shared 2-core machine the wall clock depends on other
tenants' load, CPU seconds much less, and on an idle 2-core machine the wall clock of ``up --check`` is
at least its CPU seconds over 2.

Cells, in interleaved rounds (the order rotates each round), min / median / max over rounds:

- ``serve SERVICE``: one service alone (``wolfpack serve SERVICE --address 127.0.0.1:0 --ready-file``, as
  a container runs it; embedded Redis for those that need one is started once, outside the cell): seconds
  to its ready file (imports + set-up + bind), to SERVING on the health check, and its own CPU seconds at
  SERVING;
- ``import SERVICE``: ``python -c "import wolfpack_SERVICE.server"`` alone (what imports cost of the above);
- ``up --check``: the whole stack (embedded Redis, every service, the web view, health table, shutdown),
  with ``--base-port 0`` (ports the services pick; what tests use) and with fixed ports (the default
  ``WOLFPACK_BASE_PORT`` mode; a free range is picked per run);
- ``up parts``: ``wolfpack up --base-port 0`` until its table, then each process's own CPU seconds at that
  moment (the launcher, every service, the web view, Redis) — where ``up --check``'s CPU goes — and the
  seconds from SIGTERM to the launcher's exit;
- ``play werewolf``: ``wolfpack play werewolf --seed 3`` (a local command: no RPC, no Redis); ``play
  werewolf 12p``: the README's first ``play`` line (12 players, heuristic bots); ``play help``: ``wolfpack
  play --help``.

``--revs REV...`` measures other revisions in the same rounds, side by side (``.``: this working tree;
another: ``git archive REV libs services``, first on ``PYTHONPATH`` for every process it starts, its own
launcher included), and prints each cell's ratio to the first revision per round (CPU and wall), because
this machine's load swings between rounds.

``--bytecode cached`` (or ``both``, side by side) runs every command with Python's bytecode cache on, in a
``PYTHONPYCACHEPREFIX`` of the bench filled by one unrecorded run of each command first: as on a normal
install, where the first run writes ``__pycache__``. ``off`` (the default) runs them as this environment
does (``PYTHONDONTWRITEBYTECODE=1``, no ``__pycache__`` in the checkout): every process compiles the
repository's own modules from source each time. A variant ``REV+pyc`` in the tables is ``REV`` cached.

    .venv/bin/python bench/startup/bench_startup.py                 # ~2-3 minutes
    .venv/bin/python bench/startup/bench_startup.py --rounds 3 --cells up play
    .venv/bin/python bench/startup/bench_startup.py --revs 1f766e4 . --cells up parts --rounds 5
    .venv/bin/python bench/startup/bench_startup.py --cells up play --bytecode both --rounds 5
    .venv/bin/python bench/startup/bench_startup.py --cells up --entries app main --rounds 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from wolfpack import SERVICES, rpc
from wolfpack.redis_server import EmbeddedRedis

WOLFPACK = [sys.executable, "-m", "wolfpack.cli.main"]
SCRIPT = "import sys; sys.argv[0] = 'wolfpack'; from wolfpack.cli.main import {0}; sys.exit({0}())"
"""What the installed ``wolfpack`` script does for the entry point ``wolfpack.cli.main:{0}`` (``--entries``)."""


def wolfpack_command(variant: str) -> list[str]:
    """How ``variant`` runs ``wolfpack``: ``REV[+pyc]@app`` / ``@main`` as the console script with that entry
    point does, otherwise ``python -m wolfpack.cli.main``."""
    entry = variant.rpartition("@")[2] if "@" in variant else ""
    return [sys.executable, "-c", SCRIPT.format(entry)] if entry else WOLFPACK


ROOT = Path(__file__).resolve().parents[2]


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


@contextmanager
def revision(rev: str, scratch: Path) -> Iterator[str]:
    """The ``PYTHONPATH`` that runs ``rev``'s code ("" for this tree): its ``libs`` and every service
    package root, extracted from ``git archive`` (ahead of the editable install's finder on the path)."""
    if rev == ".":
        yield ""
        return
    into = scratch / f"rev-{rev.replace('/', '_')}"
    into.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "libs", "services"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    roots = [into / "libs", *sorted(p for p in (into / "services").iterdir() if p.is_dir())]
    yield os.pathsep.join(str(p) for p in roots)


def free_range(count: int) -> int:
    """A first port of ``count`` consecutive ports free right now (racy, as any such pick: a bench only)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + count >= 65535:
            continue
        try:
            with ExitStack() as stack:
                for port in range(base, base + count):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port range")


async def serve_one(
    service: str, env: dict[str, str], scratch: Path, wolfpack: list[str]
) -> dict[str, float]:
    """Start ``wolfpack serve SERVICE`` on port 0; seconds to ready file and SERVING, CPU at SERVING."""
    ready = scratch / f"{service}.ready.json"
    ready.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*wolfpack, "serve", service, "--address", "127.0.0.1:0", "--ready-file", str(ready)],
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


def up_parts(env: dict[str, str], run_dir: Path, wolfpack: list[str]) -> dict[str, float]:
    """``wolfpack up --base-port 0`` until its table; each process's CPU then; SIGTERM to exit."""
    cpu0, t0 = children_cpu(), time.perf_counter()
    launcher = subprocess.Popen(
        [*wolfpack, "up", "--base-port", "0"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert launcher.stdout is not None
    seen = b""
    try:
        while b"Ctrl-C to stop" not in seen:
            line = launcher.stdout.readline()
            if not line:
                raise RuntimeError(f"up exited before its table: {seen.decode()[-2000:]}")
            seen += line
        parts = {"to table": time.perf_counter() - t0, "launcher": proc_cpu(launcher.pid)}
        state = json.loads((run_dir / "up.json").read_text())
        for name, pid in state["pids"].items():
            parts[name] = proc_cpu(int(pid))
        parts["redis"] = proc_cpu(int((run_dir / "redis" / "redis.pid").read_text()))
        t_stop = time.perf_counter()
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=120)
        parts["stop"] = time.perf_counter() - t_stop
        parts["all (to exit)"] = children_cpu() - cpu0
        return parts
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cells", nargs="+", default=["serve", "import", "up", "parts", "play"],
                    choices=["serve", "import", "up", "parts", "play"])  # fmt: skip
    ap.add_argument("--revs", nargs="+", default=["."], help="Revisions side by side ('.': this tree).")
    ap.add_argument("--bytecode", choices=["off", "cached", "both"], default="off",
                    help="Python's bytecode cache: off (as here), cached (warmed first), or both.")  # fmt: skip
    ap.add_argument("--entries", nargs="+", default=["module"], choices=["module", "app", "main"],
                    help="How wolfpack runs: python -m wolfpack.cli.main (module), or as the installed script "
                    "does with the entry point wolfpack.cli.main:app or :main; several: side by side.")  # fmt: skip
    ap.add_argument("--verbose", action="store_true", help="Print each measurement (stderr) as it comes.")
    args = ap.parse_args()
    suffixes = {"off": [""], "cached": ["+pyc"], "both": ["", "+pyc"]}[args.bytecode]
    entries = ["" if e == "module" else f"@{e}" for e in args.entries]
    variants = [rev + s + e for rev in args.revs for s in suffixes for e in entries]  # side by side
    results: dict[tuple[str, str], dict[str, list[float]]] = {}
    parts: dict[str, dict[str, list[float]]] = {}
    loads: list[float] = []

    def record(cell: str, rev: str, **values: float) -> None:
        for key, value in values.items():
            results.setdefault((cell, rev), {}).setdefault(key, []).append(value)
        if args.verbose:  # each measurement as it comes, with the load at that moment
            shown = " ".join(f"{k}={v:.2f}" for k, v in values.items())
            print(f"  {cell} [{rev}] {shown} (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        scratch = Path(tmp)
        paths = {rev: stack.enter_context(revision(rev, scratch)) for rev in args.revs}
        redis = EmbeddedRedis(scratch / "redis").start()
        base_env = {
            k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("WOLFPACK_")
        }
        base_env.update(
            {
                "WOLFPACK_INFERENCE_MODEL": os.environ.get("WOLFPACK_INFERENCE_MODEL", "tiny"),
                "WOLFPACK_LOG_LEVEL": "WARNING",
            }
        )

        def env_for(variant: str, run: str, **extra: str) -> dict[str, str]:
            env = {**base_env, "WOLFPACK_RUN_DIR": str(scratch / run), **extra}
            rev = variant.partition("@")[0].removesuffix("+pyc")
            if paths[rev]:
                env["PYTHONPATH"] = paths[rev]
            if variant.partition("@")[0].endswith(
                "+pyc"
            ):  # bytecode written once, then read (a path per source file)
                env.pop("PYTHONDONTWRITEBYTECODE", None)
                env["PYTHONPYCACHEPREFIX"] = str(scratch / "pycache")
            return env

        cells: list[str] = []
        if "serve" in args.cells:
            cells += [f"serve {s}" for s in SERVICES]
        if "import" in args.cells:
            cells += [f"import {s}" for s in SERVICES]
        if "up" in args.cells:
            cells += ["up --check (port 0)", "up --check (fixed ports)"]
        if "parts" in args.cells:
            cells.append("up parts")
        if "play" in args.cells:
            cells += ["play werewolf", "play werewolf 12p", "play help"]
        play_args = {
            "play werewolf": ["werewolf", "--seed", "3"],
            "play werewolf 12p": ["werewolf", "--players", "12", "--seed", "3", "--bots", "heuristic"],
            "play help": ["--help"],
        }
        try:
            for variant in variants:  # the cache filled before any measurement (not recorded)
                if variant.partition("@")[0].endswith("+pyc"):
                    print(f"filling the bytecode cache for {variant}", file=sys.stderr, flush=True)
                    wolfpack = wolfpack_command(variant)
                    run_command([*wolfpack, "play", "werewolf", "--seed", "3"], env_for(variant, "warm"))
                    run_command([*wolfpack, "up", "--check", "--base-port", "0"], env_for(variant, "warm"))
                    for service in ("reward", "environment"):  # what the serve/import cells add
                        run_command([sys.executable, "-c", f"import wolfpack_{service}.server"],
                                    env_for(variant, "warm"))  # fmt: skip
            for r in range(args.rounds):
                shift = r % len(cells)
                revs = variants if r % 2 == 0 else variants[::-1]  # each cell's variants back to back
                for name, rev in [(c, v) for c in cells[shift:] + cells[:shift] for v in revs]:
                    served = env_for(rev, "run", WOLFPACK_REDIS_URL=redis.url)
                    wolfpack = wolfpack_command(rev)
                    if name.startswith("serve "):
                        service = name.split()[1]
                        record(name, rev, **asyncio.run(serve_one(service, served, scratch, wolfpack)))
                    elif name.startswith("import "):
                        module = f"wolfpack_{name.split()[1]}.server"
                        wall, cpu = run_command([sys.executable, "-c", f"import {module}"], served)
                        record(name, rev, serving=wall, cpu=cpu)
                    elif name == "up --check (port 0)":  # up starts its own Redis
                        cmd = [*wolfpack, "up", "--check", "--base-port", "0"]
                        wall, cpu = run_command(cmd, env_for(rev, f"up-{r}"))
                        record(name, rev, serving=wall, cpu=cpu)
                    elif name == "up --check (fixed ports)":
                        base = free_range(len(SERVICES) + 1)
                        web = f"127.0.0.1:{base + len(SERVICES)}"
                        cmd = [*wolfpack, "up", "--check", "--base-port", str(base)]
                        wall, cpu = run_command(cmd, env_for(rev, f"upf-{r}", WOLFPACK_WEB_ADDR=web))
                        record(name, rev, serving=wall, cpu=cpu)
                    elif name == "up parts":
                        got = up_parts(env_for(rev, f"parts-{r}"), scratch / f"parts-{r}", wolfpack)
                        record(name, rev, serving=got.pop("to table"), stop=got.pop("stop"),
                               cpu=got.pop("all (to exit)"))  # fmt: skip
                        for proc_name, cpu in got.items():
                            parts.setdefault(rev, {}).setdefault(proc_name, []).append(cpu)
                    else:
                        wall, cpu = run_command([*wolfpack, "play", *play_args[name]], served)
                        record(name, rev, serving=wall, cpu=cpu)
                loads.append(os.getloadavg()[0])
                print(f"round {r + 1}/{args.rounds} done (load {loads[-1]:.1f})", file=sys.stderr, flush=True)
        finally:
            redis.stop()

    def stat(values: list[float] | None) -> str:
        if not values:
            return ""
        return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"

    def ratio(name: str, rev: str, key: str) -> str:
        """Per round, this revision's value over the first revision's; median (min–max)."""
        first, mine = results.get((name, variants[0]), {}).get(key), results.get((name, rev), {}).get(key)
        if rev == variants[0] or not first or not mine:
            return ""
        per_round = [m / f for m, f in zip(mine, first, strict=False) if f > 0]
        return f"{statistics.median(per_round):.2f} ({min(per_round):.2f}–{max(per_round):.2f})"

    print(
        f"{args.rounds} interleaved rounds; median (min–max) seconds; load average per round "
        f"{', '.join(f'{x:.1f}' for x in loads)}\n"
    )
    many = len(variants) > 1
    head = "| cell | rev | to ready file | wall (to SERVING / table / exit) | CPU s | stop after SIGTERM |"
    print(head + (" CPU / first rev | wall / first rev |" if many else ""))
    print("| --- " * (head.count("|") - 1 + (2 if many else 0)) + "|")
    for name in cells:
        for rev in variants:
            values = results.get((name, rev), {})
            row = (
                f"| {name} | {rev} | {stat(values.get('ready'))} | {stat(values.get('serving'))} "
                f"| {stat(values.get('cpu'))} | {stat(values.get('stop'))} |"
            )
            if many:
                row += f" {ratio(name, rev, 'cpu')} | {ratio(name, rev, 'serving')} |"
            print(row)
    if parts:
        print("\n`up parts`: each process's own CPU seconds when the table printed, median (min–max)\n")
        names = list(dict.fromkeys(n for rev in variants for n in parts.get(rev, {})))
        print("| process | " + " | ".join(variants) + " |")
        print("| --- " * (len(variants) + 1) + "|")
        for n in names:
            print(f"| {n} | " + " | ".join(stat(parts.get(rev, {}).get(n)) for rev in variants) + " |")


if __name__ == "__main__":
    main()
