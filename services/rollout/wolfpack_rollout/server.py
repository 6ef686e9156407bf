"""gRPC server of the rollout service: a self-play worker (``RolloutDriver``) plus ``GetRolloutStatus``.

With ``WOLFPACK_ROLLOUT_CONFIG`` (YAML of ``RolloutConfig`` fields plus ``episodes``: 0 = serve status
only, -1 = play forever, N = play N episodes) the process pulls tasks from the curriculum and appends
trajectories to the stream; run several replicas to scale out. On SIGTERM it stops taking tasks and
drains the episodes in flight before it exits. Start it with ``wolfpack serve rollout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import grpc
import yaml

from wolfpack import rpc
from wolfpack.settings import Settings
from wolfpack.v1 import rollout_service_pb2 as pb
from wolfpack.v1 import rollout_service_pb2_grpc as pb_grpc
from wolfpack_rollout.client import connect
from wolfpack_rollout.config import RolloutConfig
from wolfpack_rollout.driver import RolloutStats

SERVICE = "rollout"
log = logging.getLogger(__name__)


def status(stats: RolloutStats, worker_id: str, elapsed_s: float) -> pb.GetRolloutStatusResponse:
    resp = pb.GetRolloutStatusResponse(
        episodes_in_flight=stats.in_flight, episodes_finished=stats.episodes_finished,
        episodes_failed=stats.episodes_failed, turns=stats.turns, worker_id=worker_id,
        turns_per_second=stats.turns / elapsed_s if elapsed_s > 0 else 0.0,
        backpressure_wait_s=stats.backpressure_wait_s,
    )  # fmt: skip
    for reason, count in sorted(stats.failures.items()):
        resp.failures.add(reason=reason, count=count)
    return resp


class RolloutServicer(pb_grpc.RolloutServiceServicer):
    def __init__(self) -> None:
        self.stats = RolloutStats()
        self.worker_id = ""

    async def GetRolloutStatus(
        self, request: pb.GetRolloutStatusRequest, context: Any
    ) -> pb.GetRolloutStatusResponse:
        loop = asyncio.get_running_loop()
        return status(self.stats, self.worker_id, loop.time() - self.stats.started_at)


def register(server: grpc.aio.Server, servicer: RolloutServicer | None = None) -> Sequence[str]:
    """Add this service's servicers to ``server`` and return their full names."""
    pb_grpc.add_RolloutServiceServicer_to_server(servicer or RolloutServicer(), server)
    return [pb.DESCRIPTOR.services_by_name["RolloutService"].full_name]


def load_config(settings: Settings) -> tuple[RolloutConfig, int]:
    raw: Any = yaml.safe_load(settings.rollout_config.read_text()) if settings.rollout_config else {}
    raw = raw or {}
    data: dict[str, Any] = dict(raw.get("rollout", raw))
    episodes = int(data.pop("episodes", 0))
    return RolloutConfig.from_mapping(data), episodes


async def main(settings: Settings, address: str | None = None) -> None:
    config, episodes = load_config(settings)
    servicer = RolloutServicer()
    worker: asyncio.Task[None] | None = None
    stopping = asyncio.Event()

    async def work() -> None:
        """Play until ``episodes`` are done (or forever); a failing batch (curriculum or Redis away) is
        logged and retried after a pause, so a worker outlives its dependencies' restarts."""
        async with connect(settings, config) as driver:
            servicer.stats, servicer.worker_id = driver.stats, driver.worker_id
            driver.stop_event = stopping
            left = episodes
            while left != 0 and not stopping.is_set():
                batch = config.concurrency * 4 if left < 0 else left
                try:
                    summary = await driver.run(batch)
                except Exception:
                    log.exception("rollout batch failed; retrying in 5 s")
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stopping.wait(), timeout=5.0)
                    continue
                log.info("rollout batch done", extra={"episodes": summary.episodes, "failed": summary.failed})
                left = -1 if left < 0 else max(0, left - summary.episodes - summary.failed)

    if episodes:
        worker = asyncio.create_task(work())

    async def on_stop() -> None:  # drain: no new tasks, in-flight episodes finish and are appended
        stopping.set()
        if worker is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    await rpc.serve(SERVICE, lambda s: register(s, servicer), settings, address, on_stop=on_stop)
