"""gRPC adapter of the reward service: proto in, ``specs`` scoring, proto out.

All reward rules live in ``specs``/``outcome``/``shaping``/``credit``; this module only maps requests to a
spec, wraps the call in a "score" span and maps ``ScoreError`` to INVALID_ARGUMENT. Start it with
``wolfpack serve reward``; ``WOLFPACK_REWARD_SPECS`` may name a YAML file of extra spec variants.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import grpc

from wolfpack import rpc, telemetry
from wolfpack.settings import Settings
from wolfpack.v1 import reward_service_pb2 as pb
from wolfpack.v1 import reward_service_pb2_grpc as pb_grpc
from wolfpack_reward.result import ScoreError, to_response
from wolfpack_reward.specs import SPECS, load_specs, resolve_spec

SERVICE = "reward"
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
            try:
                if not request.HasField("trajectory"):
                    raise ScoreError("trajectory is required")
                spec = resolve_spec(request.spec, traj.game.game_id)
                span.set_attribute("wolfpack.reward_spec", spec.key)
                result = await asyncio.to_thread(spec.score, traj)  # keep the loop free for health
            except ScoreError as exc:
                span.set_attribute("error.type", "invalid_argument")
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                raise AssertionError("unreachable") from exc
            for key, note in result.notes.items():
                if "mismatch" in key:
                    span.set_attribute(f"wolfpack.reward.{key}", note)
                    log.warning("outcome mismatch", extra={"trajectory_id": traj.trajectory_id, key: note})
            return to_response(traj, result)

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
