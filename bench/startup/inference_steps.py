"""The inference service's start-up, step by step: CPU seconds of each step in one fresh process.

Why: with the tiny model, ``wolfpack up --check``'s critical path is the inference service (spawned first,
the slowest to bind); ``bench_startup.py`` says how long the stack takes, this says how much of the floor
is the inference service's own imports and load, which no launcher change can remove.

Each run is a fresh interpreter (``-c``) doing what the service does before it binds, in its order:
``wolfpack.rpc`` (gRPC, settings, the OpenTelemetry API), then ``import_backends`` split into its parts
(``import torch``; ``torch._dynamo``, which transformers' ``masking_utils`` imports; ``transformers`` itself;
the auto classes), then ``PolicyRegistry.from_configs`` (model and tokenizer load). ``interpreter`` is the
process's CPU before the first step (interpreter start, ``site``). The cyclic collector is off, as in the
service's start-up. CPU counts every thread (torch starts some). Runs in sequence, min/median/max.

    .venv/bin/python bench/startup/inference_steps.py --runs 5       # the tiny model
    WOLFPACK_INFERENCE_MODEL=smollm2 .venv/bin/python bench/startup/inference_steps.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

STEPS = """
import gc, json, os, sys, time
gc.disable()  # as ``serve`` starts every service (the collector back on once it is set up)
def cpu():
    t = os.times()
    return t.user + t.system
out = {"interpreter": cpu()}
def step(name, fn):
    c0, w0 = cpu(), time.perf_counter()
    fn()
    out[name] = cpu() - c0
    out[name + " (wall)"] = time.perf_counter() - w0
def rpc():
    import wolfpack.rpc
def torch_():
    import torch
def dynamo():
    import torch._dynamo
def transformers_():
    import transformers
def backends():
    from wolfpack_inference.settings import InferenceSettings
    from wolfpack_inference.backends import import_backends
    import_backends([p.backend for p in InferenceSettings().policies()])
def load():
    from wolfpack_inference.settings import InferenceSettings
    from wolfpack_inference.policies import PolicyRegistry
    s = InferenceSettings()
    PolicyRegistry.from_configs(s.policies(), s.cache_dir)
step("wolfpack.rpc (gRPC, settings, OTel API)", rpc)
step("import torch", torch_)
step("import torch._dynamo (transformers' masking_utils)", dynamo)
step("import transformers", transformers_)
step("import_backends (the auto classes, the backend)", backends)
step("models load (PolicyRegistry.from_configs)", load)
out["total"] = cpu()
sys.stdout.write(json.dumps(out) + "\\n")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    env = {**os.environ, "WOLFPACK_LOG_LEVEL": "WARNING"}
    env.setdefault("WOLFPACK_INFERENCE_MODEL", "tiny")
    runs: list[dict[str, float]] = []
    loads: list[float] = []
    for _ in range(args.runs):
        done = subprocess.run(
            [sys.executable, "-c", STEPS], env=env, capture_output=True, text=True, check=True
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        loads.append(os.getloadavg()[0])
    print(
        f"model {env['WOLFPACK_INFERENCE_MODEL']}, {args.runs} runs, load average "
        f"{', '.join(f'{x:.1f}' for x in loads)}; median (min–max)\n"
    )
    print("| step | CPU s | wall s |")
    print("| --- | --- | --- |")
    for key in runs[0]:
        if key.endswith(" (wall)"):
            continue

        def stat(name: str) -> str:
            values = [r[name] for r in runs if name in r]
            if not values:
                return ""
            return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"

        print(f"| {key} | {stat(key)} | {stat(key + ' (wall)')} |")


if __name__ == "__main__":
    main()
