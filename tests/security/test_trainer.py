"""Regression tests over the real wire for issue 20's trainer items: SaveCheckpoint needs the service
credential and writes only inside the job's run directory (``directory=<any path>`` wrote 1.9 MB
wherever asked; a file path or ``/proc`` answered INTERNAL); GetTrainerStatus over a corrupt run answers
FAILED_PRECONDITION naming the file, not INTERNAL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
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

from .conftest import SECRET


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trainer]:
    """One live job (a tiny model built from a config) for the module: building it takes seconds."""
    root = tmp_path_factory.mktemp("trainer")
    cfg = TrainConfig.model_validate(
        {
            "name": "served",
            "game": {"id": "ultimatum_v1", "variant": "easy"},
            "policies": [{"id": "responder", "seats": [1], "model": "tiny"}],
            "train": {"updates": 3},
        }
    )
    t = Trainer(cfg, root / "runs" / "served", "redis://unused", cache_dir=root / "models")
    t.setup()
    yield t


@pytest.fixture
async def live(trainer: Trainer) -> AsyncIterator[str]:
    running = await rpc.start_server(
        "trainer", register_live(trainer), load_settings(admin_secret=SECRET), "127.0.0.1:0"
    )
    yield f"127.0.0.1:{running.port}"
    await running.stop(0)


async def code_of(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code(), err.value.details() or ""


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")} if root.exists() else set()


async def test_save_checkpoint_needs_the_credential(live: str, trainer: Trainer, tmp_path: Path) -> None:
    before = files_under(trainer.run_dir)
    for secret, code in (("", grpc.StatusCode.UNAUTHENTICATED), ("wrong", grpc.StatusCode.PERMISSION_DENIED)):
        async with rpc.channel(live, load_settings(admin_secret=secret)) as ch:
            stub = pb_grpc.TrainerServiceStub(ch)
            request = pb.SaveCheckpointRequest(directory=str(tmp_path / "stolen"))
            assert (await code_of(stub.SaveCheckpoint(request)))[0] == code
            assert (await stub.GetTrainerStatus(pb.GetTrainerStatusRequest())).live, "status stays open"
    assert not (tmp_path / "stolen").exists()
    assert files_under(trainer.run_dir) == before, "nothing written"


@pytest.mark.parametrize(
    "where",
    ["outside", "dotdot", "proc", "a_file", "checkpoints", "symlink_out"],
)
async def test_save_checkpoint_writes_only_inside_the_run_directory(
    live: str, trainer: Trainer, tmp_path: Path, where: str
) -> None:
    a_file = trainer.run_dir / "notes.txt"
    a_file.write_text("x")
    link = trainer.run_dir / "escape"
    if not link.is_symlink():
        link.symlink_to(tmp_path, target_is_directory=True)
    directory = {
        "outside": str(tmp_path / "copy"),
        "dotdot": "../../elsewhere",
        "proc": "/proc/self",
        "a_file": str(a_file),
        "checkpoints": "checkpoints",
        "symlink_out": "escape/copy",
    }[where]
    async with rpc.channel(live, load_settings(admin_secret=SECRET)) as ch:
        stub = pb_grpc.TrainerServiceStub(ch)
        code, details = await code_of(stub.SaveCheckpoint(pb.SaveCheckpointRequest(directory=directory)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "directory" in details
    assert list(tmp_path.iterdir()) == [], "nothing written outside"


async def test_save_checkpoint_copies_inside_the_run_directory(live: str, trainer: Trainer) -> None:
    async with rpc.channel(live, load_settings(admin_secret=SECRET)) as ch:
        stub = pb_grpc.TrainerServiceStub(ch)
        saved = await stub.SaveCheckpoint(pb.SaveCheckpointRequest(directory="exports/best"))
        plain = await stub.SaveCheckpoint(pb.SaveCheckpointRequest())
        inside = await stub.SaveCheckpoint(
            pb.SaveCheckpointRequest(directory=str(trainer.run_dir / "exports" / "abs"))
        )
    copy = Path(saved.path)
    assert copy.parent == (trainer.run_dir / "exports" / "best").resolve()
    assert json.loads((copy / "state.json").read_text())["step"] == saved.step
    assert Path(plain.path).parent == trainer.run_dir / "checkpoints"
    assert Path(inside.path).parent == (trainer.run_dir / "exports" / "abs").resolve()


@pytest.mark.parametrize("corruption", ["missing_target", "escaping_pointer", "bad_state", "bad_metrics"])
async def test_status_of_a_corrupt_run_is_failed_precondition(tmp_path: Path, corruption: str) -> None:
    run = tmp_path / "runs" / "broken"
    ckpt = run / "checkpoints"
    (ckpt / "update_000002").mkdir(parents=True)
    (ckpt / "update_000002" / "state.json").write_text(json.dumps({"step": 2}))
    (ckpt / "LATEST").write_text("update_000002")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 2, "charts/win_rate": 0.5}) + "\n")
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    (secret_dir / "state.json").write_text(json.dumps({"step": 99}))
    if corruption == "missing_target":
        (ckpt / "LATEST").write_text("update_000009")
    elif corruption == "escaping_pointer":
        (ckpt / "LATEST").write_text("../../../secret")
    elif corruption == "bad_state":
        (ckpt / "update_000002" / "state.json").write_text("{not json")
    else:
        (run / "metrics.jsonl").write_text('{"step": 3, "loss": "NaN-ish"}\n{broken\n')
    running = await rpc.start_server(
        "trainer", registrar(TrainerServicer(runs_dir=tmp_path / "runs")), load_settings(), "127.0.0.1:0"
    )
    try:
        async with rpc.channel(f"127.0.0.1:{running.port}", load_settings()) as ch:
            stub = pb_grpc.TrainerServiceStub(ch)
            if corruption == "bad_metrics":  # unreadable metric lines are skipped, the status still answers
                status = await stub.GetTrainerStatus(pb.GetTrainerStatusRequest(run="broken"))
                assert status.step == 2 and dict(status.metrics) == {}
                return
            code, details = await code_of(stub.GetTrainerStatus(pb.GetTrainerStatusRequest(run="broken")))
            assert code == grpc.StatusCode.FAILED_PRECONDITION, (code, details)
            assert "LATEST" in details or "state.json" in details
    finally:
        await running.stop(0)
