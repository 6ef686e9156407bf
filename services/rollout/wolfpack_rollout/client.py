"""The rollout package's published client side: what another service (the trainer) may import of it.

* ``connect`` — a ready ``RolloutDriver`` from addresses, with every client it needs opened and closed
  for you (the rollout service, ``wolfpack rollout``, the bench and the trainer's service mode):

      async with connect(settings, RolloutConfig(concurrency=32)) as driver:
          summary = await driver.run(100)

  Addresses come from ``Addresses`` (defaults: the settings' ``WOLFPACK_<SERVICE>_ADDR`` / base port, or
  the ``up.json`` of a running ``wolfpack up`` in the run dir). Without a Redis URL there is no stream:
  ``run`` then reports outcomes to the curriculum by RPC and trajectories stay in ``driver.trajectories``.
* the player itself (``RolloutDriver``, ``RolloutConfig``, ``SamplingConfig``) and the ``backends`` seam,
  so the trainer's local mode plays through the same loop over in-process backends.
* ``render_messages`` and ``conversation_turn`` (with ``SeatChat``, ``TokenizerCodec``) — the chat a seat's policy is prompted
  with, as the driver builds it (one turn, or the seat's growing conversation), so that the trainer's warm
  start clones a bot on exactly the prompts the policy will see.

Why the driver is published rather than copied: there is one episode player (docs/architecture.md);
everything here builds on libs and other services' client modules (import-linter's "clients" contract).
What only ``connect`` needs (gRPC: ``wolfpack.rpc``, the environment client) is imported by ``connect``,
and ``BatchItem`` when asked for: the trainer's local mode plays through this module without gRPC.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis

from wolfpack.settings import Settings
from wolfpack.stream import ProtoStreamProducer
from wolfpack.v1 import trajectory_pb2
from wolfpack_curriculum.client import CurriculumClient
from wolfpack_rollout.backends import BatchResult, Environment, EpisodeStream, Inference, Reward
from wolfpack_rollout.config import RolloutConfig, SamplingConfig
from wolfpack_rollout.driver import EpisodeFailed, PromptEncoder, RolloutDriver
from wolfpack_rollout.prompts import SeatChat, TokenizerCodec, conversation_turn, new_lines, render_messages

if TYPE_CHECKING:
    from wolfpack_inference.client import BatchItem

__all__ = [
    "Addresses",
    "BatchItem",
    "BatchResult",
    "Environment",
    "EpisodeFailed",
    "EpisodeStream",
    "Inference",
    "PromptEncoder",
    "Reward",
    "RolloutConfig",
    "RolloutDriver",
    "SamplingConfig",
    "SeatChat",
    "TokenizerCodec",
    "connect",
    "conversation_turn",
    "new_lines",
    "render_messages",
]


def __getattr__(name: str) -> Any:
    if name == "BatchItem":
        from wolfpack_inference.client import BatchItem

        return BatchItem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Addresses:
    environment: str
    inference: str
    reward: str
    curriculum: str | None
    redis_url: str | None
    stream: str

    @classmethod
    def from_settings(cls, settings: Settings, *, use_running_stack: bool = True) -> Addresses:
        """Settings' addresses; those of a running ``wolfpack up`` (``<run_dir>/up.json``) take precedence
        for what the settings leave unset."""
        up: dict[str, object] = {}
        path = settings.run_dir / "up.json"
        if use_running_stack and path.exists():
            up = json.loads(path.read_text())
        services = up.get("services", {}) if isinstance(up.get("services"), dict) else {}
        assert isinstance(services, dict)

        def addr(name: str) -> str:
            explicit: str | None = getattr(settings, f"{name}_addr")
            return explicit or str(services.get(name) or settings.service_addr(name))

        redis_url = settings.redis_url or (str(up["redis_url"]) if up.get("redis_url") else None)
        return cls(
            addr("environment"), addr("inference"), addr("reward"), addr("curriculum"), redis_url,
            settings.stream_trajectories,
        )  # fmt: skip


@asynccontextmanager
async def connect(
    settings: Settings,
    config: RolloutConfig,
    addresses: Addresses | None = None,
    *,
    stream: bool = True,
) -> AsyncIterator[RolloutDriver]:
    """A driver wired to the services at ``addresses`` (and the trajectory stream when ``stream`` and a
    Redis URL is known); everything is closed on exit."""
    from wolfpack import rpc
    from wolfpack_environment.client import EnvironmentClient

    a = addresses or Addresses.from_settings(settings)
    async with AsyncExitStack() as stack:
        env = await stack.enter_async_context(EnvironmentClient(a.environment, settings))
        inference = await stack.enter_async_context(rpc.channel(a.inference, settings))
        reward = await stack.enter_async_context(rpc.channel(a.reward, settings))
        curriculum = (
            await stack.enter_async_context(CurriculumClient(a.curriculum, settings))
            if a.curriculum
            else None
        )
        producer: ProtoStreamProducer[trajectory_pb2.Trajectory] | None = None
        if stream and a.redis_url:
            client = aioredis.Redis.from_url(a.redis_url)
            stack.push_async_callback(client.aclose)
            producer = ProtoStreamProducer.from_settings(
                client, settings, id_of=lambda t: t.trajectory_id, stream=a.stream
            )
        driver = RolloutDriver(
            config, environment=env, inference_channel=inference, reward_channel=reward,
            curriculum=curriculum, producer=producer,
        )  # fmt: skip
        stack.push_async_callback(driver.close)
        yield driver
