"""A real local stack for rollout tests: environment, inference (tiny random Qwen2 on CPU, with a spy that
keeps every GenerateBatch result it sent), reward and curriculum servers on free ports, real Redis."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from wolfpack import rpc
from wolfpack.settings import Settings, load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import curriculum_service_pb2 as cur_pb
from wolfpack.v1 import inference_service_pb2 as inf_pb
from wolfpack_environment.server import EnvironmentServicer
from wolfpack_environment.server import register as register_environment
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.models import tiny_model
from wolfpack_inference.policies import PolicyRegistry
from wolfpack_inference.server import InferenceServicer
from wolfpack_inference.server import register as register_inference
from wolfpack_reward.server import register as register_reward

POLICY = "learner"
STRONG = "strong"


class SpyInference(InferenceServicer):
    """The real servicer; every GenerateBatch response it sends is also kept, keyed by request id (the
    batches of a GenerateBatchStream run through GenerateBatch too). ``batches`` counts GenerateBatch
    runs, ``streams`` GenerateBatchStream calls."""

    def __init__(self, registry: PolicyRegistry) -> None:
        super().__init__(registry)
        self.sent: dict[str, inf_pb.GenerateResponse] = {}
        self.prompts: dict[str, list[tuple[str, str]]] = {}
        self.batches = self.streams = 0

    async def GenerateBatchStream(
        self, request_iterator: AsyncIterator[inf_pb.GenerateBatchStreamRequest], context: Any
    ) -> AsyncIterator[inf_pb.GenerateBatchStreamResponse]:
        self.streams += 1
        async for msg in super().GenerateBatchStream(request_iterator, context):
            yield msg

    async def GenerateBatch(
        self, request: inf_pb.GenerateBatchRequest, context: Any
    ) -> AsyncIterator[inf_pb.GenerateBatchResponse]:  # type: ignore[override]
        self.batches += 1
        for req in request.requests:
            self.prompts[req.request_id] = [(m.role, m.content) for m in req.chat.messages]
        async for msg in super().GenerateBatch(request, context):
            for res in msg.results:
                if res.HasField("response"):
                    self.sent[request.requests[res.index].request_id] = res.response
            yield msg


@dataclass
class Stack:
    settings: Settings
    environment: str
    inference: str
    reward: str
    spy: SpyInference
    servers: list[Any] = field(default_factory=list)


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    """Built once per machine: ``tiny_model`` keys its directory by its arguments and writes it atomically,
    so sessions (and the mutation runs, one pytest session per mutant) share it instead of spending ~12 s
    training a tokenizer each time."""
    return tiny_model(Path(tempfile.gettempdir()) / "wolfpack-test-models")


@pytest.fixture
async def stack(tiny_dir: Path, tmp_path: Path) -> AsyncIterator[Stack]:
    settings = load_settings(rpc_timeout_s=60)
    cfg = PolicyConfig(policy_id=POLICY, model=str(tiny_dir), device="cpu", dtype="float32", max_batch=32)
    strong = cfg.model_copy(update={"policy_id": STRONG})  # stands in for an external strong model
    registry = PolicyRegistry.from_configs([cfg, strong], tmp_path)
    spy = SpyInference(registry)
    env = await rpc.start_server(
        "environment", lambda s: register_environment(s, EnvironmentServicer()), settings, "127.0.0.1:0"
    )
    inf = await rpc.start_server("inference", lambda s: register_inference(s, spy), settings, "127.0.0.1:0")
    rew = await rpc.start_server("reward", register_reward, settings, "127.0.0.1:0")
    yield Stack(settings, f"127.0.0.1:{env.port}", f"127.0.0.1:{inf.port}", f"127.0.0.1:{rew.port}", spy,
                [env, inf, rew])  # fmt: skip
    for server in (env, inf, rew):
        await server.stop(0)
    await registry.close()


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def stream_key() -> Iterator[str]:
    yield f"test:rollout:{uuid.uuid4().hex}"


def scripted_task(game: str, variant: str, prefix: str, seed: int, seat: int, group: str = "") -> cur_pb.Task:
    """One episode of ``game/variant`` with ``seat`` the test policy's, the others the heuristic bot."""
    task = cur_pb.Task(
        task_id=f"{prefix}-{seed}", seed=seed, bucket=f"{game}/{variant}", trainee_seats=[seat],
        group_id=group or f"g-{prefix}-{seed}", group_size=1, opponent_kind=cur_pb.OPPONENT_KIND_SCRIPTED,
        opponent_id="scripted:heuristic", split="train",
    )  # fmt: skip
    task.game.game_id, task.game.variant = game, variant
    b = task.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_POLICY)
    b.policy.policy_id = POLICY
    return task


def werewolf_task(seed: int, seat: int = 3, group: str = "") -> cur_pb.Task:
    return scripted_task("werewolf_v1", "6p", "ww", seed, seat, group)


def bargaining_task(seed: int, seat: int = 0) -> cur_pb.Task:
    return scripted_task("bargaining_v1", "easy", "bg", seed, seat)


def ultimatum_task(seed: int, seat: int = 0) -> cur_pb.Task:
    """Ultimatum: short prompts, so that a seat's conversation grows for turns inside a small budget."""
    return scripted_task("ultimatum_v1", "easy", "ug", seed, seat)


@pytest.fixture
def tasks() -> dict[str, Any]:
    return {"werewolf": werewolf_task, "bargaining": bargaining_task, "ultimatum": ultimatum_task}
