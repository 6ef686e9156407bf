"""Where ``wolfpack up --check``'s wall clock goes: one run, every process on one time line.

``bench_startup.py`` says how long ``up --check`` takes; this says why: for the launcher and each process
it starts (every service, the web view, Redis), seconds from the launcher's start to when the process began
running Python, to when it first imported a few marker modules (torch, transformers, gRPC…), to its ready
file (bound), to its exit, with its CPU seconds; and when the launcher printed its table and exited. The
process that binds last and the gap after it are the critical path.

How: a ``sitecustomize`` module, put first on ``PYTHONPATH`` of the launcher (its children inherit it),
records in each Python process its start, the first import of each marker (a meta-path finder that only
looks) and, at exit (``atexit``: ``serve.exit_now`` runs it too), its CPU time, one JSON line per process.
Redis's exit is seen by polling ``/proc``. The markers cost ~1 µs per import; nothing else is changed.

    .venv/bin/python bench/startup/timeline.py            # one run, --base-port 0, the tiny model
    .venv/bin/python bench/startup/timeline.py --runs 3 --revs dea0275 .   # interleaved, per revision
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_startup import revision  # noqa: E402  (the same ``git archive`` PYTHONPATH per revision)

MARKERS = ("wolfpack.settings", "grpc", "redis", "torch", "transformers", "torch._dynamo", "aiohttp")

SITECUSTOMIZE = """
import atexit, importlib.abc, json, os, sys, time
_start = time.time()
_out = os.environ.get("WOLFPACK_TIMELINE_OUT")
_marks = {}
_watch = set(MARKERS)

class _Marker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in _watch and name not in _marks:
            _marks[name] = time.time()
        return None

sys.meta_path.insert(0, _Marker())

def _record():
    t = os.times()
    line = {"pid": os.getpid(), "argv": sys.argv, "start": _start, "exit": time.time(),
            "cpu": t.user + t.system, "marks": _marks}
    with open(_out, "a") as fh:
        fh.write(json.dumps(line) + "\\n")

if _out:
    atexit.register(_record)
""".replace("MARKERS", repr(MARKERS))


def watch_redis(stop: threading.Event, run_dir: Path, exits: list[float], t0: float) -> None:
    """When the run's ``redis-server`` exits (it runs no Python): its pid from its pid file, then polled."""
    pid_file, pid = run_dir / "redis" / "redis.pid", 0
    while not stop.is_set():
        if not pid:
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text())
        elif not Path(f"/proc/{pid}").exists():
            exits.append(time.time() - t0)
            return
        time.sleep(0.005)


def one_run(scratch: Path, pythonpath: str, tag: str) -> dict[str, object]:
    run_dir, out = scratch / f"run-{tag}", scratch / f"timeline-{tag}.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("WOLFPACK_")}
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(scratch / "site"), pythonpath) if p),
        WOLFPACK_TIMELINE_OUT=str(out), WOLFPACK_RUN_DIR=str(run_dir), WOLFPACK_LOG_LEVEL="WARNING",
        WOLFPACK_INFERENCE_MODEL=os.environ.get("WOLFPACK_INFERENCE_MODEL", "tiny"),
    )  # fmt: skip
    redis_exits: list[float] = []
    stop = threading.Event()
    t0 = time.time()
    watcher = threading.Thread(target=watch_redis, args=(stop, run_dir, redis_exits, t0), daemon=True)
    watcher.start()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "wolfpack.cli.main", "up", "--check", "--base-port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert launcher.stdout is not None
    table = 0.0
    for raw in launcher.stdout:
        if b"all services SERVING" in raw or b"not healthy" in raw:
            table = time.time() - t0
    code = launcher.wait()
    end = time.time() - t0
    stop.set()
    watcher.join()
    rows = []
    for line in out.read_text().splitlines():
        rec = json.loads(line)
        argv = rec["argv"]
        name = "launcher" if "up" in argv else (argv[1] if len(argv) > 1 else "?")
        ready = run_dir / "ready" / f"{name}.json"
        rows.append(
            {
                "process": name,
                "start": rec["start"] - t0,
                "marks": {k: v - t0 for k, v in rec["marks"].items()},
                "bound": ready.stat().st_mtime - t0 if ready.exists() else None,
                "exit": rec["exit"] - t0,
                "cpu": rec["cpu"],
            }
        )
    rows.sort(key=lambda r: r["start"])  # type: ignore[arg-type,return-value]
    return {
        "code": code,
        "table": table,
        "end": end,
        "rows": rows,
        "redis_exit": max(redis_exits, default=0.0),
    }


def show(tag: str, run: dict[str, object]) -> None:
    print(
        f"\n### {tag}: exit code {run['code']}, table at {run['table']:.2f} s, launcher gone at {run['end']:.2f} s"
    )
    print("\n| process | python from | first imports | bound (ready file) | exit | CPU s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in run["rows"]:  # type: ignore[attr-defined]
        marks = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["marks"].items(), key=lambda kv: kv[1]))
        bound = f"{r['bound']:.2f}" if r["bound"] is not None else ""
        print(f"| {r['process']} | {r['start']:.2f} | {marks} | {bound} | {r['exit']:.2f} | {r['cpu']:.2f} |")
    print(f"| redis-server | | | | {run['redis_exit']:.2f} | |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--revs", nargs="+", default=["."], help="Revisions, interleaved ('.': this tree).")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        (scratch / "site").mkdir()
        (scratch / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        with ExitStack() as stack:
            paths = {rev: stack.enter_context(revision(rev, scratch)) for rev in args.revs}
            for i in range(args.runs):
                for rev in args.revs if i % 2 == 0 else args.revs[::-1]:
                    show(f"{rev} run {i + 1}", one_run(scratch, paths[rev], f"{rev.replace('/', '_')}-{i}"))
                    print(f"(load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
