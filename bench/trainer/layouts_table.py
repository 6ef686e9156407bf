"""The 1-GPU vs 2-GPU table from ``gpu_layouts.sh``'s metrics files (``layout-<name>-metrics.jsonl``).

    python bench/trainer/layouts_table.py OUT_DIR

Per layout, medians over the updates after the first (the first pays for compilation, caches and vLLM's
warm-up): seconds per step (collection + ``perf/update_s``, which is everything after the collection) and its
parts, steps per hour, and the learner's tokens/s (prompt + response
tokens of the batch over the learner's update time) in all and per learner GPU. Ratios are against the
``1gpu`` row of the same run.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

PARTS = [
    ("collect s", "perf/collect_s"),
    ("update s", "perf/update_s"),  # everything after the collection: learner, publish, checkpoint + ack
    ("old logp s", "perf/learner_infer_s"),
    ("learner update s", "perf/learner_train_s"),
    ("publish s", "perf/publish_s"),
]


def layout_rows(out: Path) -> dict[str, list[dict[str, float]]]:
    found = {}
    for path in sorted(out.glob("layout-*-metrics.jsonl")):
        name = path.name[len("layout-") : -len("-metrics.jsonl")]
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        found[name] = [r for r in rows if "perf/update_s" in r]
    return found


def summary(updates: list[dict[str, float]]) -> dict[str, float]:
    steady = updates[1:] or updates

    def med(key: str) -> float:
        vals = [r[key] for r in steady if key in r]
        return statistics.median(vals) if vals else float("nan")

    gpus = med("perf/learner_gpus") or 1.0
    tokens = med("batch/sequence_tokens")
    train = med("perf/learner_train_s")
    row = {label: med(key) for label, key in PARTS}
    row["updates"] = float(len(updates))
    # one training step = its collection + its update (``perf/update_s`` leaves the collection out)
    row["step s"] = statistics.median(r["perf/collect_s"] + r["perf/update_s"] for r in steady)
    row["steps/h"] = 3600.0 / row["step s"]
    row["learner tok/s"] = tokens / train
    row["learner tok/s/GPU"] = tokens / train / gpus
    row["learner GPUs"] = gpus
    return row


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    found = layout_rows(out)
    if not found:
        print(f"no layout-*-metrics.jsonl in {out}")
        return 1
    rows = {name: summary(u) for name, u in found.items() if u}
    cols = ["updates", "learner GPUs", *(label for label, _ in PARTS), "step s", "steps/h", "learner tok/s",
            "learner tok/s/GPU"]  # fmt: skip
    print("| layout | " + " | ".join(cols) + " | steps/h vs 1gpu |")
    print("|" + " --- |" * (len(cols) + 2))
    base = rows.get("1gpu")
    for name, row in rows.items():
        ratio = f"{row['steps/h'] / base['steps/h']:.2f}x" if base else "-"
        cells = [f"{row[c]:.0f}" if c in ("updates", "learner GPUs", "steps/h", "learner tok/s", "learner tok/s/GPU")
                 else f"{row[c]:.2f}" for c in cols]  # fmt: skip
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio} |")
    missing = [n for n, u in found.items() if not u]
    missing += [
        p.name[len("layout-") : -len(".log")]
        for p in sorted(out.glob("layout-*.log"))
        if not p.name.endswith("-up.log") and p.name[len("layout-") : -len(".log")] not in found
    ]
    if missing:
        print(f"\nno update finished: {', '.join(missing)} (see layout-<name>.log)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
