"""gRPC adapter of the curriculum service: requests in, ``CurriculumStore`` (Redis state, pure scheduler,
AIW, league) out; plus the consumer that reads outcomes from the trajectory stream, whose progress is the
service's health (NOT_SERVING while it makes none). Start it with ``wolfpack serve curriculum``;
``WOLFPACK_CURRICULUM_CONFIG`` names its YAML (see ``config.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import redis.asyncio as aioredis
import yaml
from pydantic import ValidationError

from wolfpack import rpc
from wolfpack.settings import Settings
from wolfpack.stream import ProtoStreamConsumer
from wolfpack.v1 import curriculum_service_pb2 as pb
from wolfpack.v1 import curriculum_service_pb2_grpc as pb_grpc
from wolfpack.v1 import trajectory_pb2
from wolfpack_curriculum.config import CurriculumConfig
from wolfpack_curriculum.consumer import ConsumerHealth, consume
from wolfpack_curriculum.store import CurriculumStore

SERVICE = "curriculum"
log = logging.getLogger(__name__)


class CurriculumServicer(pb_grpc.CurriculumServiceServicer):
    """Requests in, ``CurriculumStore`` out. The store raises ``ServiceError`` subclasses (INVALID_ARGUMENT,
    ALREADY_EXISTS, RESOURCE_EXHAUSTED) that ``rpc.ErrorInterceptor`` turns into the call's status. The
    writes (ReportOutcomes, RegisterOpponent) need the service credential (``auth.PRIVILEGED_METHODS``),
    checked before a handler runs."""

    def __init__(self, store: CurriculumStore) -> None:
        self.store = store

    async def NextTasks(self, request: pb.NextTasksRequest, context: Any) -> pb.NextTasksResponse:
        return pb.NextTasksResponse(tasks=await self.store.next_tasks(request.count, request.split))

    async def ReportOutcomes(
        self, request: pb.ReportOutcomesRequest, context: Any
    ) -> pb.ReportOutcomesResponse:
        return pb.ReportOutcomesResponse(recorded=await self.store.record(request.outcomes))

    async def GetStats(self, request: pb.GetStatsRequest, context: Any) -> pb.GetStatsResponse:
        return await self.store.stats()

    async def RegisterOpponent(
        self, request: pb.RegisterOpponentRequest, context: Any
    ) -> pb.RegisterOpponentResponse:
        stored, created = await self.store.register(request.opponent)
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


HEALTH_POLL_S = 0.5


async def watch_health(running: rpc.Server, health: ConsumerHealth, stop: asyncio.Event) -> None:
    """Report the service NOT_SERVING while the stream consumer makes no progress (Redis away: NextTasks
    fails too), SERVING again once it does; each change is logged."""
    serving = True
    while not stop.is_set():
        stalled = health.stalled()
        if stalled == serving:
            serving = not stalled
            await running.set_serving(serving)
            if stalled:
                log.error(
                    "curriculum NOT_SERVING: the trajectory stream consumer has made no progress",
                    extra={"stalled_s": round(health.stall_after_s), "error": health.last_error},
                )
            else:
                log.warning("curriculum SERVING again: the trajectory stream consumer makes progress")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), HEALTH_POLL_S)


@dataclass
class Running:
    """A started curriculum service: its gRPC server, the stream consumer task and its health."""

    server: rpc.Server
    client: aioredis.Redis
    reader: asyncio.Task[int]
    watcher: asyncio.Task[None]
    health: ConsumerHealth
    stop_event: asyncio.Event

    async def stop(self, grace: float | None = None) -> None:
        self.stop_event.set()  # the watcher first: it must not mark a stopping server SERVING again
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(self.watcher, timeout=5)
        await self.server.stop(grace)
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(self.reader, timeout=5)
        await self.client.aclose()


async def start(
    settings: Settings,
    address: str | None = None,
    config: CurriculumConfig | None = None,
    *,
    stall_after_s: float = 15.0,
) -> Running:
    """Start the gRPC server, the stream consumer and the health watcher (``main`` runs this until a
    signal; tests call it directly). The config is checked here, before anything listens."""
    if settings.redis_url is None:
        raise OSError("the curriculum keeps its state in Redis: set WOLFPACK_REDIS_URL")
    config = config or CurriculumConfig.load(settings.curriculum_config)
    client = aioredis.Redis.from_url(settings.redis_url)
    store = CurriculumStore(client, config)
    consumer = ProtoStreamConsumer.from_settings(
        client,
        settings,
        config.stream_group,
        f"{socket.gethostname()}-{os.getpid()}",
        trajectory_pb2.Trajectory,
    )
    health = ConsumerHealth(stall_after_s=stall_after_s)
    stop = asyncio.Event()
    server = await rpc.start_server(
        SERVICE, lambda s: register(s, CurriculumServicer(store)), settings, address
    )
    reader = asyncio.create_task(consume(store, consumer, stop, health))
    watcher = asyncio.create_task(watch_health(server, health, stop))
    return Running(server, client, reader, watcher, health, stop)


async def main(settings: Settings, address: str | None = None) -> None:
    """``wolfpack serve curriculum``: run until SIGTERM/SIGINT, then drain for ``grpc_grace_s``. A config
    that does not validate ends it at once with the reasons (exit status 1, no traceback)."""
    try:
        config = CurriculumConfig.load(settings.curriculum_config)
    except (ValidationError, yaml.YAMLError) as exc:
        raise SystemExit(f"curriculum config {settings.curriculum_config or '(defaults)'}: {exc}") from None
    running = await start(settings, address, config)
    rpc.tune_gc()
    stop = rpc.stop_on_signals()
    try:
        await stop.wait()
        log.info("shutting down: draining in-flight calls", extra={"grace_s": settings.grpc_grace_s})
        started = time.monotonic()
        await running.stop(settings.grpc_grace_s)
        log.info("stopped", extra={"drain_s": round(time.monotonic() - started, 3)})
    finally:
        await running.server.server.stop(0)
