"""The TrainerService servicer: status and checkpoints of a training job, as protobuf.

Two sources: a live ``Trainer`` in this process (``wolfpack train --serve``), or the run directories under
``<run_dir>/train`` (``wolfpack serve trainer``: the latest checkpoint of each run, read-only). The
loop runs its model work in a worker thread, so these handlers answer during an update; a checkpoint
asked for here runs in a thread too and takes the trainer's lock, so it never sees half an update.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from wolfpack.errors import ServiceError
from wolfpack.v1 import common_pb2
from wolfpack.v1 import trainer_service_pb2 as pb
from wolfpack.v1 import trainer_service_pb2_grpc as pb_grpc
from wolfpack_trainer.state import RunState

if TYPE_CHECKING:
    from wolfpack_trainer.config import TrainConfig


class LiveJob(Protocol):
    """What the servicer reads of a job running in this process (``train.Trainer`` is one). A protocol,
    not an import of the loop: the loop starts this service in front of itself (``train._run_serving``),
    so importing it here would close an import cycle."""

    @property
    def cfg(self) -> TrainConfig: ...

    @property
    def state(self) -> RunState: ...

    @property
    def run_dir(self) -> Path: ...

    def checkpoint(self) -> Path:
        """Write a checkpoint under the job's lock (never half an update); its directory."""
        ...


def _last_metrics(run_dir: Path) -> dict[str, float]:
    """The latest value of each metric in ``metrics.jsonl``; a line or value that does not parse (a
    half-written last line, a hand edit) is skipped: the status must answer anyway."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {}
    merged: dict[str, float] = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line) if line.strip() else {}
        except ValueError:
            continue
        for k, v in row.items() if isinstance(row, dict) else ():
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool):
                merged[k] = float(v)
    return merged


def _read_run(run_dir: Path) -> RunState:
    """The state of a run's latest checkpoint. ``LATEST`` must name a checkpoint directory beside it (one
    path component: a pointer like ``../../x`` is refused, not followed) holding a readable
    ``state.json``; anything else is FAILED_PRECONDITION naming the file (it used to answer INTERNAL)."""
    ckpts = run_dir / "checkpoints"
    try:
        name = (ckpts / "LATEST").read_text(errors="replace").strip()
    except OSError as exc:
        raise _corrupt(run_dir, f"checkpoints/LATEST cannot be read ({exc.strerror})") from None
    if not name or name in (".", "..") or Path(name).name != name or name.startswith(".") or "\0" in name:
        raise _corrupt(run_dir, f"checkpoints/LATEST names no checkpoint directory ({name[:64]!r})")
    state_file = ckpts / name / "state.json"
    try:
        data = json.loads(state_file.read_text())
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        known = {f.name for f in fields(RunState)}
        state = RunState(**{k: v for k, v in data.items() if k in known})
        _status(state, run_dir.name, {})  # the types must fit the response, too
    except FileNotFoundError:
        raise _corrupt(run_dir, f"checkpoints/LATEST names {name!r}, which has no state.json") from None
    except (OSError, ValueError, TypeError) as exc:
        raise _corrupt(run_dir, f"checkpoints/{name}/state.json is unreadable ({exc})") from None
    return state


def _corrupt(run_dir: Path, what: str) -> ServiceError:
    return ServiceError(f"training run {run_dir.name}: {what}", grpc.StatusCode.FAILED_PRECONDITION)


def export_dir(run_dir: Path, directory: str) -> Path:
    """Where ``SaveCheckpoint(directory)`` may copy to: ``directory`` taken relative to the run directory
    (an absolute path must lie inside it), symlinks resolved, outside ``checkpoints/`` (whose pruning and
    ``LATEST`` belong to the trainer), not an existing file. Anything else is INVALID_ARGUMENT: the copy
    used to go wherever asked (1.9 MB per call, any path the trainer could write)."""
    root = run_dir.resolve()
    try:
        target = (root / directory).resolve()
    except (OSError, ValueError) as exc:  # a NUL byte, a symlink loop
        raise ServiceError(
            f"directory {directory[:200]!r}: {exc}", grpc.StatusCode.INVALID_ARGUMENT
        ) from None
    if target != root and root not in target.parents:
        raise ServiceError(
            f"directory {directory[:200]!r} is outside the run directory {root}: checkpoints are only "
            "copied inside it (give a path relative to it, e.g. 'exports/best')",
            grpc.StatusCode.INVALID_ARGUMENT,
        )
    ckpts = (root / "checkpoints").resolve()
    if target == ckpts or ckpts in target.parents:
        raise ServiceError(
            f"directory {directory[:200]!r} is inside checkpoints/, which the trainer prunes",
            grpc.StatusCode.INVALID_ARGUMENT,
        )
    if target.exists() and not target.is_dir():
        raise ServiceError(f"directory {directory[:200]!r} is a file", grpc.StatusCode.INVALID_ARGUMENT)
    return target


def _status(state: RunState, run: str, metrics: dict[str, float], **kw: Any) -> pb.GetTrainerStatusResponse:
    return pb.GetTrainerStatusResponse(
        step=state.step,
        trajectories_consumed=state.trajectories_used,
        policies=[common_pb2.PolicyRef(policy_id=p, version=v) for p, v in sorted(state.versions.items())],
        metrics=metrics,
        run=run,
        dropped_stale=state.dropped_stale,
        **kw,
    )


class TrainerServicer(pb_grpc.TrainerServiceServicer):
    def __init__(self, trainer: LiveJob | None = None, runs_dir: Path | None = None) -> None:
        self.trainer = trainer
        self.runs_dir = runs_dir

    async def GetTrainerStatus(
        self, request: pb.GetTrainerStatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetTrainerStatusResponse:
        t = self.trainer
        if t is not None and request.run in ("", t.cfg.name):
            return _status(
                t.state,
                t.cfg.name,
                _last_metrics(t.run_dir),
                algorithm=t.cfg.algo_config().estimator,
                total_steps=t.cfg.train.updates,
                live=True,
            )
        run_dir = self._find_run(request.run)
        if run_dir is None:
            raise ServiceError(
                f"no training run {request.run[:200] or '(any)'} found", grpc.StatusCode.NOT_FOUND
            )
        state = await asyncio.to_thread(_read_run, run_dir)
        return _status(state, run_dir.name, await asyncio.to_thread(_last_metrics, run_dir))

    def _find_run(self, name: str) -> Path | None:
        if self.runs_dir is None or not self.runs_dir.exists():
            return None
        runs = [p for p in self.runs_dir.iterdir() if (p / "checkpoints" / "LATEST").exists()]
        if name:
            runs = [p for p in runs if p.name == name]
        return max(runs, key=lambda p: (p / "checkpoints" / "LATEST").stat().st_mtime, default=None)

    async def SaveCheckpoint(
        self, request: pb.SaveCheckpointRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.SaveCheckpointResponse:
        if self.trainer is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no training job runs in this process")
            raise AssertionError("unreachable")
        # The credential is checked before this handler runs (auth.PRIVILEGED_METHODS); the directory is
        # checked before anything is written.
        export = export_dir(self.trainer.run_dir, request.directory) if request.directory else None
        path = await asyncio.to_thread(self.trainer.checkpoint)
        if export is not None:
            target = export / path.name
            try:
                await asyncio.to_thread(shutil.copytree, path, target, dirs_exist_ok=True)
            except OSError as exc:
                raise ServiceError(
                    f"checkpoint {path.name} written, but not copied to {request.directory[:200]!r}: {exc}",
                    grpc.StatusCode.FAILED_PRECONDITION,
                ) from None
            path = target
        return pb.SaveCheckpointResponse(path=str(path), step=self.trainer.state.step)
