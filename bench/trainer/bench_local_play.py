"""Local-mode rollouts: the old hand-written player against the rollout driver over in-process backends.

    .venv/bin/python bench/trainer/bench_local_play.py [--rounds 5] [--episodes 128] [--old-rev 78af75d]

Why: the trainer's local mode became the rollout driver (``wolfpack_rollout``) over in-process
environment, inference and reward backends (``wolfpack_trainer.local_rollout``) instead of a player of its
own. This measures what that costs on the demo's task: the ultimatum ``outside`` variant, the responder
seat played by the tiny model (random weights: same sampling cost as the trained one), heuristic proposer,
groups of 4, 8 new tokens, prompts cropped to the last 64 tokens. The old player is loaded from git
(``--old-rev``: a commit before the change) into a module of its own. Rounds interleave the two players on
the same tasks; the table gives min / median / max seconds per update's episodes and the ratio of medians.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from wolfpack.models import resolve_model
from wolfpack.v1 import common_pb2
from wolfpack_trainer import local_rollout as new
from wolfpack_trainer.train import service_task

ROOT = Path(__file__).resolve().parents[2]
OLD_PATH = "services/trainer/wolfpack_trainer/local_rollout.py"


def load_old(rev: str) -> Any:
    source = subprocess.run(
        ["git", "show", f"{rev}:{OLD_PATH}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "old_local_rollout.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_local_rollout", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_local_rollout"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--old-rev", default="78af75d")
    args = ap.parse_args()
    torch.set_num_threads(1)
    old = load_old(args.old_rev)
    path = resolve_model("tiny", Path(tempfile.gettempdir()) / "wolfpack-bench-models")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    eos = [
        tok.convert_tokens_to_ids("<|im_end|>"),
        *([tok.eos_token_id] if tok.eos_token_id is not None else []),
    ]
    gen = torch.Generator().manual_seed(0)
    max_tokens, crop, group = 8, 64, 4

    def sample(prompts: list[list[int]], temperature: float) -> list[Any]:
        return new.sample(model, prompts, max_tokens=max_tokens, temperature=temperature, eos_ids=eos,
                          pad_id=int(tok.pad_token_id or 0), generator=gen)  # fmt: skip

    seeds = [s for s in range(args.episodes // group) for _ in range(group)]
    old_tasks = [old.Task("ultimatum_v1", "outside", s, {1: "responder"}, group_size=group) for s in seeds]
    planned = [new.Task("ultimatum_v1", "outside", s, {1: "responder"}, group_id=f"g{s}", group_size=group)
               for s in seeds]  # fmt: skip
    config = new.RolloutConfig(
        concurrency=len(seeds), prompt_mode="memory", max_prompt_tokens=crop,
        sampling=new.SamplingConfig(max_tokens=max_tokens, temperature=1.0),
    )  # fmt: skip
    sampling = common_pb2.SamplingParams(max_tokens=max_tokens, temperature=1.0, logprobs=True)

    def run_old() -> int:
        trajs = old.play(old_tasks, lambda pid, prompts: sample(prompts, 1.0), tok, sampling=sampling,
                         max_prompt_tokens=crop)  # fmt: skip
        return len(trajs)

    def run_new() -> int:
        driver = new.local_driver(config, tok, lambda pid, prompts, s: sample(prompts, s.temperature),
                                  lambda: {"responder": 0})  # fmt: skip
        tasks = [service_task(t, i) for i, t in enumerate(planned)]  # timed: the trainer does this per update
        return len(new.play(tasks, driver))

    times: dict[str, list[float]] = {"old player": [], "driver, in process": []}
    run_old(), run_new()  # warm-up (tokenizer caches, first model calls)
    for _ in range(args.rounds):
        for name, fn in (("old player", run_old), ("driver, in process", run_new)):
            t0 = time.perf_counter()
            n = fn()
            times[name].append(time.perf_counter() - t0)
            assert n == len(seeds), f"{name}: {n} of {len(seeds)} episodes"
    base = statistics.median(times["old player"])
    print(
        f"{args.episodes} ultimatum/outside episodes per round, tiny model, {args.rounds} interleaved rounds"
    )
    print(f"{'player':<22} {'min s':>7} {'median s':>9} {'max s':>7} {'ratio':>6}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<22} {min(ts):7.2f} {med:9.2f} {max(ts):7.2f} {med / base:6.2f}")


if __name__ == "__main__":
    main()
