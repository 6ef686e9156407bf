"""The TrainerService servicer: status and checkpoints of a training job, as protobuf.

Two sources: a live ``Trainer`` in this process (``wolfpack train --serve``), or the run directories under
``<run_dir>/train`` (``wolfpack serve trainer``: the latest checkpoint of each run, read-only). The
training loop is single-threaded asyncio; handlers run between its awaits, i.e. between updates, so a
checkpoint written here never sees half an update.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import grpc

from wolfpack.errors import ServiceError
from wolfpack.v1 import common_pb2
from wolfpack.v1 import trainer_service_pb2 as pb
from wolfpack.v1 import trainer_service_pb2_grpc as pb_grpc
from wolfpack_trainer.train import RunState, Trainer


def _last_metrics(run_dir: Path) -> dict[str, float]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {}
    merged: dict[str, float] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            merged.update({k: float(v) for k, v in json.loads(line).items() if k != "step"})
    return merged


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
    def __init__(self, trainer: Trainer | None = None, runs_dir: Path | None = None) -> None:
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
            raise ServiceError(f"no training run {request.run or '(any)'} found", grpc.StatusCode.NOT_FOUND)
        pointer = run_dir / "checkpoints" / "LATEST"
        state = RunState(
            **json.loads((run_dir / "checkpoints" / pointer.read_text() / "state.json").read_text())
        )
        return _status(state, run_dir.name, _last_metrics(run_dir))

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
        path = self.trainer.checkpoint()
        if request.directory:
            target = Path(request.directory) / path.name
            shutil.copytree(path, target, dirs_exist_ok=True)
            path = target
        return pb.SaveCheckpointResponse(path=str(path), step=self.trainer.state.step)
