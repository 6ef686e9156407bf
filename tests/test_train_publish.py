"""A trainer's new versions reach a real inference service over PushWeights (LoRA adapter and full
weights), are written as loadable directories, and a frozen snapshot lands in the curriculum's league."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import inference_service_pb2 as inf_pb
from wolfpack.v1 import inference_service_pb2_grpc as inf_grpc
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.models import tiny_model
from wolfpack_inference.policies import PolicyRegistry
from wolfpack_inference.server import InferenceServicer, register
from wolfpack_trainer.learners import LearnerConfig, get_learner
from wolfpack_trainer.publish import Publisher, WeightSync, is_local_address


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("models"))


@pytest.fixture
async def inference(tiny_dir: Path, tmp_path: Path) -> AsyncIterator[str]:
    configs = [
        PolicyConfig(policy_id=p, model=str(tiny_dir), device="cpu", dtype="float32")  # type: ignore[arg-type]
        for p in ("lora", "full")
    ]
    registry = PolicyRegistry.from_configs(configs, tmp_path / "inference")
    settings = load_settings(rpc_timeout_s=60)
    servicer = InferenceServicer(registry)
    server = await rpc.start_server("inference", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    yield f"127.0.0.1:{server.port}"
    await server.stop(0)
    await registry.close()


async def _generate(addr: str, policy: str) -> inf_pb.GenerateResponse:
    async with rpc.channel(addr, load_settings(rpc_timeout_s=60)) as ch:
        req = inf_pb.GenerateRequest(policy_id=policy)
        req.tokens.token_ids.extend([5, 6, 7, 8])
        req.sampling.max_tokens = 6
        req.sampling.temperature = 0.0
        req.sampling.logprobs = True
        return await inf_grpc.InferenceServiceStub(ch).Generate(req)


def _changed_learner(tiny_dir: Path, lora_rank: int) -> Any:
    learner = get_learner("cpu")(LearnerConfig(model=str(tiny_dir), lora_rank=lora_rank))
    with torch.no_grad():  # a visible change of the policy (LoRA B starts at zero)
        for name, p in learner.model.named_parameters():
            if p.requires_grad and ("lora_B" in name or (not lora_rank and "mlp" in name)):
                p.add_(torch.randn_like(p) * 0.5)
    return learner


@pytest.mark.parametrize("sync", ["push", "path"])
@pytest.mark.parametrize("lora_rank", [4, 0])
async def test_published_versions_serve(
    inference: str, tiny_dir: Path, tmp_path: Path, lora_rank: int, sync: WeightSync
) -> None:
    """Both ways to inference (PushWeights, LoadPolicy of the version directory) serve the learner's
    weights: the served logprobs are the learner's."""
    policy = "lora" if lora_rank else "full"
    learner = _changed_learner(tiny_dir, lora_rank)
    publisher = Publisher(tmp_path / "policies", inference_addr=inference, weight_sync=sync)
    done = await publisher.publish(policy, 1, learner)
    assert done.pushed and done.sync == sync
    assert Path(done.path, "adapter_config.json" if lora_rank else "config.json").exists()
    async with rpc.channel(inference, load_settings(rpc_timeout_s=60)) as ch:
        listed = await inf_grpc.InferenceServiceStub(ch).ListPolicies(inf_pb.ListPoliciesRequest())
    info = next(p for p in listed.policies if p.policy.policy_id == policy)
    loaded = info.adapter if lora_rank else info.base_model
    # path: inference serves the version directory itself; push: a copy it wrote (or, full weights, its model)
    assert (Path(loaded).resolve() == Path(done.path).resolve()) == (sync == "path"), (loaded, done.path)
    resp = await _generate(inference, policy)
    assert resp.policy.version == 1
    # The served version computes the learner's logprobs for the same tokens.
    c = resp.completions[0]
    from wolfpack_trainer.batch import Sample, collate

    sample = Sample(
        prompt=list(resp.prompt_token_ids), response=list(c.token_ids), response_mask=[1] * len(c.token_ids),
        logprobs=list(c.logprobs), rewards=[0.0] * len(c.token_ids), uid="u", trajectory_id="t", episode_uid="e",
        policy_id=policy, role="r", seat=0, policy_version=1, turn_index=0,
    )  # fmt: skip
    ours = learner.compute_log_probs(collate([sample]))[0]
    assert torch.allclose(ours, torch.tensor(list(c.logprobs)), atol=1e-4)


async def test_frozen_snapshot_joins_the_league(redis_url: str, tiny_dir: Path, tmp_path: Path) -> None:
    import redis.asyncio as aioredis

    from wolfpack_curriculum.client import CurriculumClient
    from wolfpack_curriculum.config import CurriculumConfig
    from wolfpack_curriculum.server import CurriculumServicer
    from wolfpack_curriculum.server import register as register_curriculum
    from wolfpack_curriculum.store import CurriculumStore

    client = aioredis.Redis.from_url(redis_url)
    cfg = CurriculumConfig.model_validate(
        {
            "key_prefix": f"test:league:{tmp_path.name}",
            "buckets": [{"game_id": "ultimatum_v1", "variant": "easy", "seats": {"trainee_seats": [1]}}],
        }
    )
    store = CurriculumStore(client, cfg)
    settings = load_settings()
    server = await rpc.start_server(
        "curriculum", lambda s: register_curriculum(s, CurriculumServicer(store)), settings, "127.0.0.1:0"
    )
    try:
        addr = f"127.0.0.1:{server.port}"
        learner = get_learner("cpu")(LearnerConfig(model=str(tiny_dir)))
        publisher = Publisher(tmp_path / "policies", settings, curriculum_addr=addr, save_dirs=False)
        assert not (await publisher.publish("responder", 3, learner, freeze=False)).frozen
        assert (await publisher.publish("responder", 4, learner, freeze=True)).frozen
        async with CurriculumClient(addr, settings) as cur:
            league = await cur.list_opponents()
        ids = {o.opponent_id: (o.policy.policy_id, o.policy.version) for o in league.opponents}
        assert ids.get("checkpoint:responder@4") == ("responder", 4)
        assert "checkpoint:responder@3" not in ids
    finally:
        await server.stop(0)
        await client.aclose()


def test_auto_weight_sync_takes_the_path_only_for_a_local_inference(tmp_path: Path) -> None:
    def mode(addr: str, save_dirs: bool = True) -> str:
        return Publisher(tmp_path, inference_addr=addr, save_dirs=save_dirs, weight_sync="auto").sync_mode

    assert mode("127.0.0.1:50051") == mode("localhost:7") == mode("[::1]:7") == mode("unix:/tmp/s") == "path"
    assert mode("inference.wolfpack.svc:50051") == mode("10.1.2.3:50051") == "push"
    assert mode("127.0.0.1:50051", save_dirs=False) == "push"  # no directory to name
    assert not is_local_address("127.0.0.1.example.com:1")
    with pytest.raises(ValueError, match="save_dirs"):
        Publisher(tmp_path, inference_addr="127.0.0.1:1", save_dirs=False, weight_sync="path")


class _UnreadableDirs:
    """The real learner, whose version directories inference cannot load (as when inference runs in
    another container that does not see this host's files): the config is there, the weights are not."""

    def __init__(self, learner: Any) -> None:
        self._learner = learner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._learner, name)

    def save_pretrained(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text("{}")
        return directory


async def test_auto_weight_sync_falls_back_to_push_when_inference_cannot_load_the_directory(
    inference: str, tiny_dir: Path, tmp_path: Path
) -> None:
    import grpc

    learner = _changed_learner(tiny_dir, 0)
    unreadable: Any = _UnreadableDirs(learner)
    strict = Publisher(tmp_path / "strict", inference_addr=inference, weight_sync="path")
    with pytest.raises(grpc.aio.AioRpcError) as err:  # an explicit path: the error, no silent push
        await strict.publish("full", 1, unreadable)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    publisher = Publisher(tmp_path / "policies", inference_addr=inference, weight_sync="auto")
    done = await publisher.publish("full", 1, unreadable)
    assert done.sync == "push" and "cannot load" in publisher.fallback
    assert publisher.sync_mode == "push"  # for the rest of the run
    resp = await _generate(inference, "full")
    assert resp.policy.version == 1
    from wolfpack_trainer.batch import Sample, collate

    c = resp.completions[0]
    sample = Sample(
        prompt=list(resp.prompt_token_ids), response=list(c.token_ids), response_mask=[1] * len(c.token_ids),
        logprobs=list(c.logprobs), rewards=[0.0] * len(c.token_ids), uid="u", trajectory_id="t", episode_uid="e",
        policy_id="full", role="r", seat=0, policy_version=1, turn_index=0,
    )  # fmt: skip
    ours = learner.compute_log_probs(collate([sample]))[0]
    assert torch.allclose(ours, torch.tensor(list(c.logprobs)), atol=1e-4)  # the pushed weights serve
