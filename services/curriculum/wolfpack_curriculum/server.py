"""gRPC adapter of the curriculum service: requests in, ``CurriculumStore`` (Redis state, pure scheduler,
AIW, league) out; plus the consumer that reads outcomes from the trajectory stream. Start it with
``wolfpack serve curriculum``; ``WOLFPACK_CURRICULUM_CONFIG`` names its YAML (see ``config.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Sequence
from typing import Any

import grpc
import redis.asyncio as aioredis

from wolfpack import rpc
from wolfpack.errors import ServiceError
from wolfpack.settings import Settings
from wolfpack.stream import ProtoStreamConsumer
from wolfpack.v1 import curriculum_service_pb2 as pb
from wolfpack.v1 import curriculum_service_pb2_grpc as pb_grpc
from wolfpack.v1 import trajectory_pb2
from wolfpack_curriculum.config import CurriculumConfig
from wolfpack_curriculum.consumer import consume
from wolfpack_curriculum.store import CurriculumStore

SERVICE = "curriculum"


class CurriculumServicer(pb_grpc.CurriculumServiceServicer):
    def __init__(self, store: CurriculumStore) -> None:
        self.store = store

    async def NextTasks(self, request: pb.NextTasksRequest, context: Any) -> pb.NextTasksResponse:
        try:
            return pb.NextTasksResponse(tasks=await self.store.next_tasks(request.count, request.split))
        except (ValueError, KeyError) as exc:
            raise ServiceError(str(exc), grpc.StatusCode.INVALID_ARGUMENT) from exc  # rpc.ErrorInterceptor

    async def ReportOutcomes(
        self, request: pb.ReportOutcomesRequest, context: Any
    ) -> pb.ReportOutcomesResponse:
        try:
            return pb.ReportOutcomesResponse(recorded=await self.store.record(request.outcomes))
        except ValueError as exc:
            raise ServiceError(str(exc), grpc.StatusCode.INVALID_ARGUMENT) from exc  # rpc.ErrorInterceptor

    async def GetStats(self, request: pb.GetStatsRequest, context: Any) -> pb.GetStatsResponse:
        return await self.store.stats()

    async def RegisterOpponent(
        self, request: pb.RegisterOpponentRequest, context: Any
    ) -> pb.RegisterOpponentResponse:
        try:
            stored, created = await self.store.register(request.opponent)
        except ValueError as exc:
            raise ServiceError(str(exc), grpc.StatusCode.INVALID_ARGUMENT) from exc  # rpc.ErrorInterceptor
        return pb.RegisterOpponentResponse(opponent=stored, created=created)

    async def ListOpponents(self, request: pb.ListOpponentsRequest, context: Any) -> pb.ListOpponentsResponse:
        trainee, opponents = await self.store.league()
        resp = pb.ListOpponentsResponse(trainee_rating=trainee.rating, trainee_games=trainee.games)
        resp.opponents.extend(o for _, o in opponents)
        return resp


def register(server: grpc.aio.Server, servicer: CurriculumServicer) -> Sequence[str]:
    """Add this service's servicers to ``server`` and return their full names."""
    pb_grpc.add_CurriculumServiceServicer_to_server(servicer, server)
    return [pb.DESCRIPTOR.services_by_name["CurriculumService"].full_name]


async def main(settings: Settings, address: str | None = None) -> None:
    if settings.redis_url is None:
        raise OSError("the curriculum keeps its state in Redis: set WOLFPACK_REDIS_URL")
    config = CurriculumConfig.load(settings.curriculum_config)
    client = aioredis.Redis.from_url(settings.redis_url)
    store = CurriculumStore(client, config)
    consumer = ProtoStreamConsumer(
        client, settings.stream_trajectories, config.stream_group, f"{socket.gethostname()}-{os.getpid()}",
        trajectory_pb2.Trajectory, claim_idle_ms=settings.stream_claim_idle_ms,
    )  # fmt: skip
    stop = asyncio.Event()
    reader = asyncio.create_task(consume(store, consumer, stop))

    async def on_stop() -> None:
        stop.set()
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(reader, timeout=5)
        await client.aclose()

    await rpc.serve(
        SERVICE, lambda s: register(s, CurriculumServicer(store)), settings, address, on_stop=on_stop
    )
