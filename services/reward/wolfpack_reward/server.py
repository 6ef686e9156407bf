"""gRPC adapter of the reward service: proto in, ``specs`` scoring, proto out.

All reward rules live in ``specs``/``outcome``/``shaping``/``credit``; this module only maps requests to a
spec and wraps the call in a "score" span (a ``ScoreError`` becomes INVALID_ARGUMENT in the shared
``rpc.ErrorInterceptor``). Start it with
``wolfpack serve reward``; ``WOLFPACK_REWARD_SPECS`` may name a YAML file of extra spec variants.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from wolfpack import rpc, telemetry
from wolfpack.settings import Settings
from wolfpack.v1 import reward_service_pb2 as pb
from wolfpack.v1 import reward_service_pb2_grpc as pb_grpc
from wolfpack.v1 import trajectory_pb2
from wolfpack_rewards import shaping
from wolfpack_rewards.config import SpecConfig
from wolfpack_rewards.result import ScoreError, ScoreResult, to_response
from wolfpack_rewards.specs import SPECS, load_specs, resolve_spec

SERVICE = "reward"
MAX_TURNS = 100_000
"""Most turns one Score accepts (the message size limit bounds the bytes; this bounds per-turn work)."""
HEAVY_WORK = 1_000_000
"""Calls whose prediction shaping compares more character pairs than this (~0.1-0.3 s of CPU) are scored
in ``_HEAVY``, a one-thread pool of their own (each is bounded by ``shaping.MAX_PREDICTION_WORK``)."""
HEAVY_TURNS = 2_000
"""Calls with more turns than this are scored in ``_HEAVY`` too: near the 64 MiB message limit (60,000
turns) scoring and building the response take ~2 s of CPU each, and three clients looping such calls
through the shared pool held a trivial Score for 5 s (the GIL split among their threads and the loop)."""
_HEAVY = ThreadPoolExecutor(max_workers=1, thread_name_prefix="score-heavy")


def _work(traj: trajectory_pb2.Trajectory, config: SpecConfig) -> int:
    return shaping.prediction_work(shaping.prediction_pairs(traj.turns, config.prediction), config.prediction)


def _score(
    score: Callable[[trajectory_pb2.Trajectory], ScoreResult], traj: trajectory_pb2.Trajectory
) -> tuple[ScoreResult, pb.ScoreResponse]:
    """The score and its response, built in the worker too (the response of a large trajectory takes as
    long to build as the score, and used to be built on the event loop)."""
    result = score(traj)
    return result, to_response(traj, result)


log = logging.getLogger(__name__)
tracer = telemetry.tracer(__name__)


class RewardServicer(pb_grpc.RewardServiceServicer):
    async def Score(
        self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ScoreResponse:
        traj = request.trajectory
        attributes: dict[str, str | int] = {
            "wolfpack.game": traj.game.game_id,
            "wolfpack.trajectory_id": traj.trajectory_id,
            "wolfpack.turns": len(traj.turns),
        }
        # The trajectory's own trace context (its episode's root span) parents the score span, so scoring
        # joins the episode's trace whichever worker sends it; without one, the call's context does.
        parent = telemetry.extract_from(traj.trace) if traj.trace.traceparent else None
        with tracer.start_as_current_span("score", context=parent, attributes=attributes) as span:
            # a ScoreError ends the call INVALID_ARGUMENT (rpc.ErrorInterceptor) and the span records it
            if not request.HasField("trajectory"):
                raise ScoreError("trajectory is required")
            spec = resolve_spec(request.spec, traj.game.game_id)
            span.set_attribute("wolfpack.reward_spec", spec.key)
            if len(traj.turns) > MAX_TURNS:
                raise ScoreError(f"trajectory.turns: at most {MAX_TURNS} turns, got {len(traj.turns)}")
            # Off the loop (health stays free). A costly call (by its prediction work, counted in one
            # linear pass) runs in its own one-thread pool: worst-case calls queue behind each other
            # instead of filling the pool every other Score uses.
            loop = asyncio.get_running_loop()
            work = await loop.run_in_executor(None, _work, traj, spec.config)
            pool = _HEAVY if work > HEAVY_WORK or len(traj.turns) > HEAVY_TURNS else None
            ctx = contextvars.copy_context()  # the score span stays current in the worker
            result, response = await loop.run_in_executor(pool, ctx.run, _score, spec.score, traj)
            for key, note in result.notes.items():
                if "mismatch" in key:
                    span.set_attribute(f"wolfpack.reward.{key}", note)
                    log.warning("outcome mismatch", extra={"trajectory_id": traj.trajectory_id, key: note})
            return response

    async def ListRewardSpecs(
        self, request: pb.ListRewardSpecsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListRewardSpecsResponse:
        resp = pb.ListRewardSpecsResponse()
        for key, spec in sorted(SPECS.items()):
            resp.specs.add(spec=key, description=spec.description, game_ids=list(spec.game_ids))
        return resp


def register(server: grpc.aio.Server, servicer: RewardServicer | None = None) -> Sequence[str]:
    """Add this service's servicers to ``server`` and return their full names."""
    pb_grpc.add_RewardServiceServicer_to_server(servicer or RewardServicer(), server)
    return [pb.DESCRIPTOR.services_by_name["RewardService"].full_name]


async def main(settings: Settings, address: str | None = None) -> None:
    if settings.reward_specs is not None:
        load_specs(str(settings.reward_specs))
    await rpc.serve(SERVICE, register, settings, address)
