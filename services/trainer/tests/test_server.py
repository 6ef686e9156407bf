"""TrainerService over real gRPC: a live job's status and an on-demand checkpoint; the read-only view of
finished runs; the status codes."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import trainer_service_pb2 as pb
from wolfpack.v1 import trainer_service_pb2_grpc as pb_grpc
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.server import register_live, registrar
from wolfpack_trainer.service import TrainerServicer
from wolfpack_trainer.train import Trainer


@pytest.fixture
def trainer(tmp_path: Path) -> Trainer:
    cfg = TrainConfig.model_validate(
        {
            "name": "served",
            "game": {"id": "ultimatum_v1", "variant": "easy"},
            "policies": [{"id": "responder", "seats": [1], "model": "tiny"}],
            "train": {"updates": 7},
        }
    )
    t = Trainer(cfg, tmp_path / "runs" / "served", "redis://unused", cache_dir=tmp_path / "models")
    t.setup()
    return t


async def test_live_status_and_checkpoint(trainer: Trainer, tmp_path: Path) -> None:
    settings = load_settings()
    server = await rpc.start_server("trainer", register_live(trainer), settings, "127.0.0.1:0")
    try:
        async with rpc.channel(f"127.0.0.1:{server.port}", settings) as ch:
            stub = pb_grpc.TrainerServiceStub(ch)
            status = await stub.GetTrainerStatus(pb.GetTrainerStatusRequest())
            assert status.live and status.run == "served" and status.total_steps == 7
            assert status.algorithm == "grpo" and status.step == 0
            assert [(p.policy_id, p.version) for p in status.policies] == [("responder", 0)]
            trainer.state.step = 3  # as if three updates were committed
            saved = await stub.SaveCheckpoint(pb.SaveCheckpointRequest(directory="copy"))  # in the run dir
            assert saved.step == 3
            assert Path(saved.path).parent == (trainer.run_dir / "copy").resolve()
            assert json.loads((Path(saved.path) / "state.json").read_text())["step"] == 3
            assert (Path(saved.path) / "learner-responder" / "learner.pt").exists()
    finally:
        await server.stop(0)

    # A server with no job reports the run from its checkpoint and refuses to checkpoint.
    settings = load_settings()
    readonly = TrainerServicer(runs_dir=tmp_path / "runs")
    server = await rpc.start_server("trainer", registrar(readonly), settings, "127.0.0.1:0")
    try:
        async with rpc.channel(f"127.0.0.1:{server.port}", settings) as ch:
            stub = pb_grpc.TrainerServiceStub(ch)
            status = await stub.GetTrainerStatus(pb.GetTrainerStatusRequest(run="served"))
            assert status.step == 3 and not status.live
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.SaveCheckpoint(pb.SaveCheckpointRequest())
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetTrainerStatus(pb.GetTrainerStatusRequest(run="nope"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await server.stop(0)
