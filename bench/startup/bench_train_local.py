"""``wolfpack train`` in local mode (``rollout.mode: local``): what it costs to load, and the whole run, of
revisions side by side (one table).

Cells, in interleaved rounds (the revisions' order alternates each round), min / median / max:

- ``imports``: ``python -c "import wolfpack_trainer.config, wolfpack_trainer.train"`` (what the command
  loads before it does anything: torch, the learner, the driver, the reward library, the stream), wall and
  CPU seconds, with the number of modules loaded and whether gRPC / OpenTelemetry are among them;
- ``train``: ``wolfpack train -c CONFIG --updates 1 --fresh`` with a run directory of its own (models and
  the warm start's clone come from the checkout's cache, as for a user's second run), wall and CPU seconds
  of the whole command (set-up, one update, the evaluations), ``OVERRIDES`` appended.

``--revs REV...``: as ``bench_startup.py`` (``.`` this tree; another revision's ``libs`` and ``services``
from ``git archive``, first on ``PYTHONPATH``). Ratios are to the first revision, per round (this shared
2-core machine's load moves between rounds).

    .venv/bin/python bench/startup/bench_train_local.py --revs d8b2286 . --rounds 4
    .venv/bin/python bench/startup/bench_train_local.py --revs d8b2286 . --cells imports --rounds 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_startup import ROOT, WOLFPACK, revision, run_command

PROBE = (
    "import json, sys, wolfpack_trainer.config, wolfpack_trainer.train; "
    "print(json.dumps([len(sys.modules), any(m.split('.')[0] in ('grpc', 'opentelemetry') for m in sys.modules)]))"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--revs", nargs="+", default=["."])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cells", nargs="+", default=["imports", "train"], choices=["imports", "train"])
    ap.add_argument("--config", default="configs/demo-ultimatum-local.yaml")
    ap.add_argument("--overrides", nargs="*", default=[], help="key=value overrides of the train cell")
    args = ap.parse_args()

    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    notes: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        scratch = Path(tmp)
        paths = {rev: stack.enter_context(revision(rev, scratch)) for rev in args.revs}
        base_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

        def env_for(rev: str) -> dict[str, str]:
            return {**base_env, "PYTHONPATH": paths[rev]} if paths[rev] else dict(base_env)

        for rev in args.revs:  # what each revision loads (and that it runs)
            out = subprocess.run(
                [sys.executable, "-c", PROBE], env=env_for(rev), capture_output=True, text=True, check=True
            )
            n, heavy = json.loads(out.stdout.strip().splitlines()[-1])
            notes[rev] = f"{n} modules, gRPC/OpenTelemetry {'loaded' if heavy else 'not loaded'}"
        for r in range(args.rounds):
            revs = args.revs if r % 2 == 0 else args.revs[::-1]
            for cell in args.cells:
                for rev in revs:
                    if cell == "imports":
                        cmd = [sys.executable, "-c", PROBE]
                    else:
                        run_dir = scratch / f"run-{r}-{len(results)}"
                        cmd = [
                            *WOLFPACK, "train", "-c", str(ROOT / args.config), "--updates", "1", "--fresh",
                            "--run-dir", str(run_dir), *args.overrides,
                        ]  # fmt: skip
                    wall, cpu = run_command(cmd, env_for(rev))
                    results.setdefault((cell, rev), []).append((wall, cpu))
                    print(
                        f"  round {r} {cell} [{rev}] wall {wall:.2f} s CPU {cpu:.2f} s "
                        f"(load {os.getloadavg()[0]:.1f})",
                        file=sys.stderr,
                        flush=True,
                    )

    def span(xs: list[float]) -> str:
        return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"

    first = args.revs[0]
    print(f"rounds {args.rounds}; " + "; ".join(f"{rev}: {notes[rev]}" for rev in args.revs))
    print(f"| cell | rev | wall s | CPU s | wall / {first} | CPU / {first} |")
    print("| --- | --- | --- | --- | --- | --- |")
    for cell in args.cells:
        for rev in args.revs:
            runs = results[(cell, rev)]
            row = f"| {cell} | {rev} | {span([w for w, _ in runs])} | {span([c for _, c in runs])} |"
            if rev == first:
                row += " | |"
            else:
                base = results[(cell, first)]
                row += f" {span([w / b[0] for (w, _), b in zip(runs, base, strict=True)])} |"
                row += f" {span([c / b[1] for (_, c), b in zip(runs, base, strict=True)])} |"
            print(row)


if __name__ == "__main__":
    main()
