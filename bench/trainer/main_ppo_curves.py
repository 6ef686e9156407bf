"""Curves of a stock verl ``main_ppo`` run from its console log: one CSV row per step (every numeric
``key:value`` verl printed, plus the wall clock ``wall_s``: the running sum of ``timing_s/step``) and a PNG
of the training reward, the critic's value loss and the actor's KL/clip against the wall clock.

    python bench/trainer/main_ppo_curves.py MAIN_PPO_LOG OUT_PREFIX      # writes OUT_PREFIX.csv, OUT_PREFIX.png

The log parser is ``vs_main_ppo.main_ppo_steps`` (the line format of verl's console logger).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_main_ppo import main_ppo_steps

PLOTTED = (
    "critic/score/mean",
    "critic/rewards/mean",
    "critic/vf_loss",
    "actor/ppo_kl",
    "actor/pg_clipfrac",
    "response_length/mean",
)


def with_wall_clock(steps: list[dict[str, float]]) -> list[dict[str, float]]:
    """Each step with ``wall_s``: seconds of steps so far (the sum of verl's ``timing_s/step``)."""
    wall = 0.0
    out = []
    for row in steps:
        wall += float(row.get("timing_s/step", 0.0))
        out.append({**row, "wall_s": wall})
    return out


def main(argv: list[str] | None = None) -> None:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2:
        raise SystemExit("usage: main_ppo_curves.py MAIN_PPO_LOG OUT_PREFIX")
    log, prefix = Path(args[0]), args[1]
    rows = with_wall_clock(main_ppo_steps(log))
    if not rows:
        raise SystemExit(f"{log}: no 'step:N - key:value' lines")
    keys = sorted({k for r in rows for k in r})
    with open(f"{prefix}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} steps, {rows[-1]['wall_s']:.0f} s of steps -> {prefix}.csv")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no PNG")
        return
    shown = [k for k in PLOTTED if any(k in r for r in rows)]
    if not shown:
        return
    fig, axes = plt.subplots(len(shown), 1, figsize=(7, 2.2 * len(shown)), sharex=True)
    for ax, key in zip([axes] if len(shown) == 1 else axes, shown, strict=True):
        pts = [(r["wall_s"] / 60, r[key]) for r in rows if key in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".")
        ax.set_ylabel(key, fontsize=7)
    fig.supxlabel("training minutes (sum of timing_s/step)")
    fig.tight_layout()
    fig.savefig(f"{prefix}.png", dpi=110)
    print(f"-> {prefix}.png")


if __name__ == "__main__":
    main()
