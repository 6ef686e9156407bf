"""``wolfpack train --serve``: TrainerService and its health check answer *during* an update, because the
update runs in a worker thread, not on the event loop that serves them. Real gRPC, real Redis, the tiny
model: the update is held open until a client in another thread got its answers, so a loop blocked by the
update could not answer at all (the client's 5 s deadlines would expire and the test fail)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import trainer_service_pb2 as pb
from wolfpack.v1 import trainer_service_pb2_grpc as pb_grpc
from wolfpack.v1 import trajectory_pb2
from wolfpack_inference.models import tiny_model
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.train import Trainer, _run_serving


class HeldUpdate(Trainer):
    """The real update, entered only once ``release`` is set (or 30 s passed)."""

    started = threading.Event()
    release = threading.Event()

    def train_step(self, trajectories: Sequence[trajectory_pb2.Trajectory]) -> dict[str, float]:
        self.started.set()
        self.release.wait(timeout=30)
        return super().train_step(trajectories)


@pytest.mark.slow
async def test_health_and_status_answer_during_an_update(tmp_path: Path, redis_url: str) -> None:
    tiny = tiny_model(tmp_path / "models")
    cfg = TrainConfig.model_validate(
        {
            "name": "served-update",
            "game": {"id": "ultimatum_v1", "variant": "easy", "bot": "heuristic"},
            "policies": [{"id": "responder", "seats": [1], "model": str(tiny), "lr": 1e-3}],
            "rollout": {"episodes_per_update": 2, "group_size": 2, "max_tokens": 4},
            "train": {"updates": 1, "save_versions": False},
            "eval": {"every": 100, "episodes": 1},
            "stream": {"name": f"test:served-update:{tmp_path.name}"},
        }
    )
    trainer = HeldUpdate(cfg, tmp_path / "run", redis_url, cache_dir=tmp_path / "models")
    trainer.setup()
    seen: dict[str, Any] = {}

    def client() -> None:
        """Another thread with its own event loop: asks while the update is held."""
        try:
            if not trainer.started.wait(timeout=120):
                seen["error"] = "the update never started"
                return
            target = f"127.0.0.1:{trainer.serving_port}"
            seen["health"] = asyncio.run(rpc.check_health(target, timeout_s=5.0))

            async def status() -> pb.GetTrainerStatusResponse:
                async with rpc.channel(target, load_settings()) as ch:
                    stub = pb_grpc.TrainerServiceStub(ch)
                    return await stub.GetTrainerStatus(pb.GetTrainerStatusRequest(), timeout=5.0)

            seen["status"] = asyncio.run(status())
        except Exception as exc:  # reported by the assertions below
            seen["error"] = repr(exc)
        finally:
            trainer.release.set()

    asker = threading.Thread(target=client)
    asker.start()
    try:
        await _run_serving(trainer, None, "127.0.0.1:0")
    finally:
        trainer.release.set()
        asker.join(timeout=60)
    assert "error" not in seen, seen.get("error")
    assert seen["health"] == "SERVING"
    status = seen["status"]
    assert status.live and status.run == "served-update"
    assert status.step == 0 and status.total_steps == 1  # answered mid-update: not yet committed
    assert trainer.state.step == 1  # and the update then completed
