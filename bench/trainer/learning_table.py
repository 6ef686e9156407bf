"""The learning table of GPU runs, read from their metrics CSVs: one row per run with its training minutes and
updates (training minutes: the trainer's own clock, ``time/train_min``, which leaves out set-up and
evaluations), the held-out metric at update 0 and at the end (95% CI), the base model and the references measured
in the same run, and the gain over the base model per training minute (issue 19's learning per GPU-minute).

Why a script: `configs/README.md` keeps that table for every recipe's latest run; typing it from the results
files by hand invites slips. This prints it from the files the runs wrote (`metrics.csv`, copied into
`bench/results/` by each hold), so the table can be checked and regenerated.

    python bench/trainer/learning_table.py                     # every *-metrics.csv in bench/results/
    python bench/trainer/learning_table.py A-metrics.csv B-metrics.csv:reward_mean

A file's metric is ``win_rate`` unless ``:reward_mean`` follows its name (IPPO's recipe is judged on the two
seats' mean reward). Runs without a held-out evaluation at update 0 and at the end are listed as such.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
NOT_REFERENCES = {"base", "initial", "heuristic"}
"""``reference/<name>/...`` columns that are not the "best reference but heuristic": the base model and the
heuristic bot have their own columns, ``initial`` is update 0 itself."""


@dataclass(frozen=True)
class Row:
    run: str
    minutes: float | None
    updates: int
    start: float | None
    final: float | None
    final_lo: float | None
    final_hi: float | None
    base: float | None
    best_reference: tuple[str, float] | None
    heuristic: float | None

    def per_minute(self) -> float | None:
        """Gain of the final policy over the base model per training minute."""
        if self.final is None or self.base is None or not self.minutes:
            return None
        return (self.final - self.base) / self.minutes


def _number(value: str | None) -> float | None:
    if value is None or value.strip() == "":
        return None
    number = float(value)
    return None if math.isnan(number) else number


def _first(rows: list[dict[str, str]], key: str) -> float | None:
    return next((v for r in rows if (v := _number(r.get(key))) is not None), None)


def read_run(path: Path, metric: str = "win_rate") -> Row:
    """One run's row from its metrics CSV (the trainer's ``metrics.csv``: one line per logged step)."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    evals = [r for r in rows if _number(r.get(f"eval/{metric}")) is not None]
    updates = [int(float(r["step"])) for r in rows if _number(r.get("perf/update_s")) is not None]
    minutes = [m for r in rows if (m := _number(r.get("time/train_min"))) is not None]
    refs: dict[str, float] = {}
    for key in rows[0].keys() if rows else ():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "reference" and parts[2] == metric:
            value = _first(rows, key)
            if value is not None:
                refs[parts[1]] = value
    others = {k: v for k, v in refs.items() if k not in NOT_REFERENCES}
    best = max(others.items(), key=lambda kv: kv[1]) if others else None
    first, last = (evals[0], evals[-1]) if evals else ({}, {})
    bounds = f"eval/{metric.removesuffix('_mean')}"  # eval/win_rate_lo, eval/reward_lo (no "_mean" there)
    return Row(
        run=path.name.removesuffix("-metrics.csv"),
        minutes=max(minutes) if minutes else None,
        updates=max(updates) if updates else 0,
        start=_number(first.get(f"eval/{metric}")),
        final=_number(last.get(f"eval/{metric}")) if len(evals) > 1 else None,
        final_lo=_number(last.get(f"{bounds}_lo")) if len(evals) > 1 else None,
        final_hi=_number(last.get(f"{bounds}_hi")) if len(evals) > 1 else None,
        base=refs.get("base"),
        best_reference=best,
        heuristic=refs.get("heuristic"),
    )


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def table(rows: list[tuple[Row, str]]) -> str:
    """A markdown table, one line per run."""
    out = [
        "| run | metric | training min (updates) | update 0 -> final (95% CI) | base model | best reference but"
        " heuristic | heuristic bot | over base per minute |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row, metric in rows:
        signed = metric != "win_rate"
        minutes = "—" if row.minutes is None else f"{row.minutes:.1f}"
        if row.final is None:
            learned = f"{_fmt(row.start, signed)} -> (no final evaluation)"
        else:
            ci = f"{_fmt(row.final_lo, signed)}..{_fmt(row.final_hi, signed)}"
            learned = f"{_fmt(row.start, signed)} -> {_fmt(row.final, signed)} ({ci})"
        best = (
            "—"
            if row.best_reference is None
            else f"{row.best_reference[0]} {_fmt(row.best_reference[1], signed)}"
        )
        rate = row.per_minute()
        per_minute = "—" if rate is None else (f"{rate:+.3f}" if signed else f"{100 * rate:+.1f} points")
        out.append(
            f"| {row.run} | {metric} | {minutes} ({row.updates}) | {learned} | {_fmt(row.base, signed)} | {best} |"
            f" {_fmt(row.heuristic, signed)} | {per_minute} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="*", help="metrics CSVs, each optionally FILE:reward_mean")
    args = parser.parse_args(argv)
    specs = args.files or [str(p) for p in sorted(RESULTS.glob("*-metrics.csv"))]
    rows = []
    for spec in specs:
        name, _, metric = spec.partition(":")
        path = Path(name)
        if not path.exists():
            print(f"learning_table: no such file {path}", file=sys.stderr)
            return 2
        metric = metric or "win_rate"
        rows.append((read_run(path, metric), metric))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
