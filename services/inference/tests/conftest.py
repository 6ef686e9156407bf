"""A real inference gRPC server on a free port, serving tiny random Qwen2 policies on CPU."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.models import perturbed_copy, tiny_model
from wolfpack_inference.policies import PolicyRegistry
from wolfpack_inference.server import InferenceServicer, register


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_v2_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return perturbed_copy(tiny_dir, tmp_path_factory.mktemp("models") / "tiny-v2", scale=0.5)


def tiny_config(policy_id: str, path: Path, **kw: object) -> PolicyConfig:
    return PolicyConfig(policy_id=policy_id, model=str(path), device="cpu", dtype="float32", **kw)  # type: ignore[arg-type]


@pytest.fixture
async def registry(tiny_dir: Path, tmp_path: Path) -> AsyncIterator[PolicyRegistry]:
    reg = PolicyRegistry.from_configs(
        [
            tiny_config("tiny", tiny_dir, context_budget=200),
            tiny_config("strict", tiny_dir, compress=False),
            tiny_config("thinker", tiny_dir, strip_think=True),
        ],
        tmp_path,
    )
    yield reg
    await reg.close()


@pytest.fixture
async def stub(registry: PolicyRegistry) -> AsyncIterator[pb_grpc.InferenceServiceStub]:
    settings = load_settings(rpc_timeout_s=60)
    servicer = InferenceServicer(registry)
    server = await rpc.start_server("inference", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    channel: grpc.aio.Channel = rpc.channel(f"127.0.0.1:{server.port}", settings)
    async with channel:
        yield pb_grpc.InferenceServiceStub(channel)
    await server.stop(0)
