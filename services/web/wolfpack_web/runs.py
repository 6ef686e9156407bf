"""Training runs for the training page: which run directories exist, their curves, their sample games.

A run directory is what ``wolfpack train`` writes (``<WOLFPACK_RUN_DIR>/train/<name>``): ``metrics.jsonl``
(one JSON row per update, a resumed step's rows overwrite on read), and ``tb/`` whose text entries
(``transcripts/eval/<i>``, ``transcripts/train/<i>``) are the sample games of each evaluation as text, and
``eval/update_<step>/episode_<i>.pb``, a few evaluated episodes of each evaluation as ``Trajectory`` files
(the trainer's ``evaluate.save_episodes``), which the replay page opens turn by turn. The page
is named by a run's directory name only; the name is looked up among the configured roots, so no path
from a request ever reaches the file system.

Why panels are built here and not in the browser: which keys make a curve and which pairs make its 95%
band (``<key>_lo``/``_hi``, or ``<key without _mean>_lo``/``_hi``) is the metrics file's contract, tested
in Python beside the writer's names.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from wolfpack.v1 import trajectory_pb2
from wolfpack_web import replay

RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_METRICS_BYTES = 64 << 20
"""A metrics file larger than this is read from its last 64 MiB (older updates are dropped)."""
MAX_SAMPLES = 12
MAX_SAMPLE_CHARS = 40_000
EVAL_DIR = re.compile(r"^update_(\d{6,9})$")
EPISODE_FILE = re.compile(r"^episode_\d{2}\.pb$")
"""The trainer's layout of evaluated episodes (``<run>/eval/update_<step>/episode_<i>.pb``); nothing else
under ``eval/`` is listed or opened."""
MAX_EPISODES_LISTED = 48
MAX_EPISODE_BYTES = 16 << 20


class RunError(LookupError):
    """No such run (or not a valid name); the message lists what exists."""


@dataclass(frozen=True)
class Run:
    name: str
    path: Path

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"


def find_runs(roots: Iterable[Path]) -> dict[str, Run]:
    """Runs under ``roots``: a root holding ``metrics.jsonl`` is a run itself, else each subdirectory
    holding one is. The first root to name a run wins."""
    runs: dict[str, Run] = {}
    for root in roots:
        candidates = [root] if (root / "metrics.jsonl").is_file() else _subdirs(root)
        for path in candidates:
            if (path / "metrics.jsonl").is_file() and RUN_NAME.match(path.name):
                runs.setdefault(path.name, Run(path.name, path))
    return runs


def _subdirs(root: Path) -> list[Path]:
    try:
        return sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return []


def get_run(roots: Iterable[Path], name: str) -> Run:
    if not RUN_NAME.match(name):
        raise RunError("a run name is letters, digits, '.', '_' or '-' (at most 128)")
    runs = find_runs(roots)
    if name not in runs:
        raise RunError(f"no run {name!r}; runs: {', '.join(sorted(runs)) or 'none yet'}")
    return runs[name]


def read_rows(path: Path) -> list[dict[str, float]]:
    """Rows by step, the last written row of a step winning; lines or values that do not parse (a line
    being written, a NaN spelled oddly) are skipped, so a file growing under a running trainer reads."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            if size > MAX_METRICS_BYTES:
                fh.seek(size - MAX_METRICS_BYTES)
                fh.readline()  # a partial line
            data = fh.read(MAX_METRICS_BYTES)
    except OSError:
        return []
    merged: dict[int, dict[str, float]] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            row = json.loads(line)
            step = int(row["step"])
        except (ValueError, KeyError, TypeError):
            continue
        if not isinstance(row, dict):
            continue
        values = merged.setdefault(step, {"step": float(step)})
        for key, value in row.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                values[str(key)[:200]] = float(value)
    return [merged[k] for k in sorted(merged)]


PANELS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("reward (train, held-out eval, references)", re.compile(r"^(charts|eval|reference/[^/]+)/reward_mean$")),
    ("win rate (train, held-out eval, references)", re.compile(r"^(charts|eval|reference/[^/]+)/win_rate$")),
    ("win rate by policy and role", re.compile(r"^charts/[^/]+/[^/]+/win_rate$")),
    ("KL", re.compile(r"^(.+/)?actor/(ppo_kl|kl_loss)$")),
    ("entropy", re.compile(r"^(.+/)?actor/entropy$")),
    ("loss", re.compile(r"^(.+/)?(actor/pg_loss|critic/vf_loss)$")),
    ("invalid-answer rate", re.compile(r"^charts/invalid_rate$")),
)
"""Each panel's title and the metric keys that draw a line in it."""


def _band_keys(key: str, keys: set[str]) -> tuple[str, str] | None:
    for base in (key, key.removesuffix("_mean")):
        if f"{base}_lo" in keys and f"{base}_hi" in keys:
            return f"{base}_lo", f"{base}_hi"
    return None


def panels(rows: Sequence[Mapping[str, float]]) -> list[dict[str, Any]]:
    """The training page's charts: per panel, its series (points ``[step, value]``, and the 95% band
    ``[step, lo, hi]`` where the file has one). Panels with no data are left out."""
    keys = {k for r in rows for k in r} - {"step"}
    out = []
    for title, pattern in PANELS:
        series = []
        for key in sorted(k for k in keys if pattern.match(k)):
            points = [[r["step"], r[key]] for r in rows if key in r]
            band_keys = _band_keys(key, keys)
            band = (
                [
                    [r["step"], r[band_keys[0]], r[band_keys[1]]]
                    for r in rows
                    if band_keys[0] in r and band_keys[1] in r
                ]
                if band_keys
                else []
            )
            series.append({"key": key, "points": points, "band": band})
        if series:
            out.append({"title": title, "series": series})
    return out


def latest(rows: Sequence[Mapping[str, float]], keys: Sequence[str]) -> dict[str, float]:
    """The newest value of each of ``keys`` (for the page's headline numbers)."""
    out: dict[str, float] = {}
    for row in rows:
        for key in keys:
            if key in row:
                out[key] = row[key]
    return out


@dataclass
class _Tail:
    """An event file read so far: its loader (which yields only records appended since its last call)
    and the newest transcripts found in it."""

    loader: Any
    found: list[dict[str, Any]] = field(default_factory=list)


_TAILS: OrderedDict[Path, _Tail] = OrderedDict()
_TAILS_LOCK = threading.Lock()
MAX_TAILED_FILES = 64


def samples(run: Run, limit: int = MAX_SAMPLES) -> list[dict[str, Any]]:
    """The newest sample games the trainer logged as TensorBoard text (``transcripts/…``), newest step
    first. Each event file is read once and then only from where it stopped (a long run's scalars are
    not re-parsed on every poll). Empty when the run has no ``tb/`` or tensorboard is not installed (the
    trainer extra has it)."""
    try:
        from tensorboard.backend.event_processing.event_file_loader import (  # type: ignore[import-untyped]
            EventFileLoader,
        )
    except ImportError:
        return []
    found: list[dict[str, Any]] = []
    for path in sorted((run.path / "tb").glob("events.out.tfevents.*")):
        with _TAILS_LOCK:
            tail = _TAILS.get(path)
            try:
                if tail is None:
                    if path.stat().st_size > MAX_METRICS_BYTES:
                        continue
                    tail = _TAILS[path] = _Tail(EventFileLoader(str(path)))
                    while len(_TAILS) > MAX_TAILED_FILES:
                        _TAILS.popitem(last=False)
                _TAILS.move_to_end(path)
                _read_transcripts(tail)
            except Exception:  # a damaged file: skip it, the page shows the others
                _TAILS.pop(path, None)
                continue
            found.extend(tail.found)
    found.sort(key=lambda s: (-s["step"], s["tag"]))
    return found[:limit]


def _read_transcripts(tail: _Tail) -> None:
    for event in tail.loader.Load():
        for value in event.summary.value:
            if not value.tag.startswith("transcripts/") or not value.tensor.string_val:
                continue
            text = value.tensor.string_val[0].decode("utf-8", "replace")
            tag = value.tag.removesuffix("/text_summary")
            tail.found.append({"step": int(event.step), "tag": tag, "text": text[:MAX_SAMPLE_CHARS]})
    if len(tail.found) > 4 * MAX_SAMPLES:
        tail.found.sort(key=lambda s: -s["step"])
        del tail.found[4 * MAX_SAMPLES :]


# --- evaluated episodes ---------------------------------------------------------------------------------


def _episode_path(run: Run, step: int, file: str) -> Path:
    if not EPISODE_FILE.match(file) or not 0 <= step < 10**9:
        raise RunError("an evaluated episode is update <step> and a file named episode_<nn>.pb")
    return run.path / "eval" / f"update_{step:06d}" / file


def read_episode(run: Run, step: int, file: str) -> trajectory_pb2.Trajectory:
    """One evaluated episode's ``Trajectory``; ``RunError`` when it is not there (or too big to be one)."""
    path = _episode_path(run, step, file)
    try:
        if path.stat().st_size > MAX_EPISODE_BYTES:
            raise RunError(f"{path.name} of update {step} is larger than {MAX_EPISODE_BYTES >> 20} MiB")
        data = path.read_bytes()
    except OSError:
        raise RunError(f"run {run.name!r} has no evaluated episode {file} at update {step}") from None
    try:
        return trajectory_pb2.Trajectory.FromString(data)
    except DecodeError:
        raise RunError(f"{file} of update {step} is not a Trajectory") from None


def eval_episodes(run: Run, limit: int = MAX_EPISODES_LISTED) -> list[dict[str, Any]]:
    """The run's evaluated episodes, newest evaluation first, each with the replay list's summary (seed,
    turns, winner) and its mean trainee reward; at most ``limit`` (older evaluations are left out). A file
    that does not parse is listed with an ``error`` instead of hiding the rest."""
    try:
        dirs = [(int(m.group(1)), p) for p in (run.path / "eval").iterdir() if (m := EVAL_DIR.match(p.name))]
    except OSError:
        return []
    out: list[dict[str, Any]] = []
    for step, directory in sorted(dirs, key=lambda d: -d[0]):
        try:
            files = sorted(p.name for p in directory.iterdir() if EPISODE_FILE.match(p.name))
        except OSError:
            continue
        for name in files:
            if len(out) >= limit:
                return out
            row: dict[str, Any] = {"step": step, "file": name}
            try:
                traj = read_episode(run, step, name)
            except RunError as err:
                row["error"] = str(err)
            else:
                row.update(replay.summary_json(traj))
                bound = {b.seat for b in traj.seats if b.policy.policy_id}
                rewards = [o.final_reward for o in traj.outcomes if o.seat in bound]
                row["trainee_reward"] = sum(rewards) / len(rewards) if rewards else None
            out.append(row)
    return out
