"""gRPC server of the rollout service.

It serves health and reflection today; the Rollout service API (proto/wolfpack/v1/rollout_service.proto)
is added by its own issue. Start it with `wolfpack serve rollout` (or all services with `wolfpack up`).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from wolfpack import rpc
from wolfpack.settings import Settings

SERVICE = "rollout"


def register(server: grpc.aio.Server) -> Sequence[str]:
    """Add this service's servicers to ``server`` and return their full names."""
    return []


async def main(settings: Settings, address: str | None = None) -> None:
    await rpc.serve(SERVICE, register, settings, address)
