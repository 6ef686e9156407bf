"""A running stack (``wolfpack up``) that does not serve the run's policies: they are registered on its
inference before any work (``LoadPolicy``), or the run stops at once with one line saying why. Real
inference gRPC server with a tiny model; ``register_policies`` is what ``wolfpack train`` calls."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from wolfpack import rpc
from wolfpack.settings import Settings, load_settings
from wolfpack.v1 import inference_service_pb2 as pb
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.models import perturbed_copy, tiny_model
from wolfpack_inference.policies import PolicyRegistry
from wolfpack_inference.server import InferenceServicer, register
from wolfpack_trainer.config import load_config
from wolfpack_trainer.stack import StackError, register_policies

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("models"))


@pytest.fixture
async def inference(tiny_dir: Path, tmp_path: Path) -> AsyncIterator[tuple[str, Settings]]:
    """``wolfpack up``'s inference as a fresh stack has it: one policy, ``default``."""
    registry = PolicyRegistry.from_configs(
        [PolicyConfig(policy_id="default", model=str(tiny_dir), device="cpu", dtype="float32")], tmp_path
    )
    settings = load_settings(rpc_timeout_s=60, run_dir=tmp_path)
    server = await rpc.start_server(
        "inference", lambda s: register(s, InferenceServicer(registry)), settings, "127.0.0.1:0"
    )
    yield f"127.0.0.1:{server.port}", settings
    await server.stop(0)
    await registry.close()


async def served(target: str, settings: Settings) -> dict[str, pb.PolicyInfo]:
    async with rpc.channel(target, settings) as channel:
        listed = await pb_grpc.InferenceServiceStub(channel).ListPolicies(pb.ListPoliciesRequest())
    return {p.policy.policy_id: p for p in listed.policies}


async def test_the_runs_policies_are_registered_then_found(
    inference: tuple[str, Settings], tiny_dir: Path
) -> None:
    target, settings = inference
    cfg = load_config(CONFIGS / "demo-ultimatum.yaml")
    models = {"responder": str(tiny_dir)}
    lines = await register_policies(cfg, settings, models, target)
    assert lines == [f"registered policy responder ({tiny_dir}) on the running inference at {target}"]
    now = await served(target, settings)
    assert set(now) == {"default", "responder"}
    assert now["responder"].base_model == str(tiny_dir) and now["responder"].policy.version == 0
    assert await register_policies(cfg, settings, models, target) == []  # a rerun finds them


async def test_what_cannot_be_served_is_one_line_before_any_work(
    inference: tuple[str, Settings], tiny_dir: Path, tmp_path: Path
) -> None:
    target, settings = inference
    cfg = load_config(CONFIGS / "demo-ultimatum.yaml")
    other = perturbed_copy(tiny_dir, tmp_path / "other", scale=0.5)
    with pytest.raises(StackError, match=r"serves policy 'default' from .* this run trains it from .*other"):
        await register_policies(cfg, settings, {"default": str(other)}, target)
    with pytest.raises(StackError, match="could not load policy 'responder' from /nonexistent"):
        await register_policies(cfg, settings, {"responder": "/nonexistent/model"}, target)
    strong = load_config(
        CONFIGS / "demo-ultimatum.yaml",
        [
            "opponent_policies=[{id: strong, backend: openai, base_url: 'http://127.0.0.1:9/v1', remote_model: big}]",
            "policies.0.seats=[1]",
            "rollout.opponents=[{policy: strong, fraction: 0.5}]",
            "warmstart=null",
        ],
    )
    with pytest.raises(StackError, match="does not serve opponent policy 'strong' \\(backend openai\\)"):
        await register_policies(strong, settings, {"responder": str(tiny_dir)}, target)
    aiw = load_config(CONFIGS / "werewolf-gigpo-aiw.yaml")
    with pytest.raises(StackError, match=r"curriculum: the running stack .* keeps its own curriculum"):
        await register_policies(aiw, settings, {}, target)
    assert set(await served(target, settings)) == {"default"}  # refused before anything was loaded


async def test_a_served_checkpoint_opponent_is_loaded(
    inference: tuple[str, Settings], tiny_dir: Path
) -> None:
    target, settings = inference
    cfg = load_config(
        CONFIGS / "demo-ultimatum.yaml",
        [
            f"opponent_policies=[{{id: frozen, model: '{tiny_dir}'}}]",
            "rollout.opponents=[{policy: frozen, fraction: 0.5}]",
        ],
    )
    lines = await register_policies(cfg, settings, {"responder": str(tiny_dir)}, target)
    assert [line.split(" (")[0] for line in lines] == [
        "registered policy responder",
        "registered policy frozen",
    ]
