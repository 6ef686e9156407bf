"""gRPC server of the trainer service: ``TrainerService`` (status, checkpoints) over ``service.py``.

``wolfpack serve trainer`` reports the runs under ``<run_dir>/train`` (read-only: no job in the process);
``wolfpack train --serve`` serves the live job it runs (``register_live``). Training itself is
``wolfpack train`` (``train.py``); see README.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc

from wolfpack import rpc
from wolfpack.settings import Settings
from wolfpack.v1 import trainer_service_pb2 as pb
from wolfpack.v1 import trainer_service_pb2_grpc as pb_grpc
from wolfpack_trainer.service import LiveJob, TrainerServicer

SERVICE = "trainer"
FULL_NAME = pb.DESCRIPTOR.services_by_name["TrainerService"].full_name


def registrar(servicer: TrainerServicer) -> Callable[[grpc.aio.Server], Sequence[str]]:
    def register(server: grpc.aio.Server) -> Sequence[str]:
        pb_grpc.add_TrainerServiceServicer_to_server(servicer, server)
        return [FULL_NAME]

    return register


def register_live(trainer: LiveJob) -> Callable[[grpc.aio.Server], Sequence[str]]:
    """The registrar of a server in front of the job running in this process."""
    return registrar(TrainerServicer(trainer=trainer, runs_dir=trainer.run_dir.parent))


async def main(settings: Settings, address: str | None = None) -> None:
    servicer = TrainerServicer(runs_dir=settings.run_dir / "train")
    await rpc.serve(SERVICE, registrar(servicer), settings, address)
