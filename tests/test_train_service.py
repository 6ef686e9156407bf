"""The product path of one update: the rollout service's driver plays through real environment, inference
(tiny model) and reward servers, trajectories go through the Redis stream to the trainer, the learner
updates, and the new version is pushed to inference, which then serves it. Before the first rollout the
learner's starting weights (the warm-started clone, when configured) are pushed as version 1, so inference
samples with exactly the weights the learner recomputes logprobs with."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import inference_service_pb2 as inf_pb
from wolfpack.v1 import inference_service_pb2_grpc as inf_grpc
from wolfpack_environment.server import EnvironmentServicer
from wolfpack_environment.server import register as register_environment
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.models import tiny_model
from wolfpack_inference.policies import PolicyRegistry
from wolfpack_inference.server import InferenceServicer
from wolfpack_inference.server import register as register_inference
from wolfpack_reward.server import register as register_reward
from wolfpack_rollout.client import Addresses, connect
from wolfpack_rollout.config import RolloutConfig, SamplingConfig
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.publish import Publisher
from wolfpack_trainer.train import Trainer, _run_serving


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[str, str, str, Path, PolicyRegistry]]:
    tiny = tiny_model(tmp_path / "models")
    settings = load_settings(rpc_timeout_s=60)
    cfg = PolicyConfig(policy_id="responder", model=str(tiny), device="cpu", dtype="float32", max_batch=32)  # type: ignore[arg-type]
    registry = PolicyRegistry.from_configs([cfg], tmp_path / "inference")
    env = await rpc.start_server(
        "environment", lambda s: register_environment(s, EnvironmentServicer()), settings, "127.0.0.1:0"
    )
    servicer = InferenceServicer(registry)
    inf = await rpc.start_server(
        "inference", lambda s: register_inference(s, servicer), settings, "127.0.0.1:0"
    )
    rew = await rpc.start_server("reward", register_reward, settings, "127.0.0.1:0")
    yield f"127.0.0.1:{env.port}", f"127.0.0.1:{inf.port}", f"127.0.0.1:{rew.port}", tiny, registry
    for server in (env, inf, rew):
        await server.stop(0)
    await registry.close()


@pytest.mark.slow
async def test_one_update_through_the_services(
    stack: tuple[str, str, str, Path, PolicyRegistry], redis_url: str, tmp_path: Path
) -> None:
    env_addr, inf_addr, rew_addr, tiny, _ = stack
    stream = f"test:train-service:{tmp_path.name}"
    cfg = TrainConfig.model_validate(
        {
            "name": "service-test",
            "game": {"id": "ultimatum_v1", "variant": "easy", "bot": "heuristic"},
            "policies": [{"id": "responder", "seats": [1], "model": str(tiny), "lr": 1e-3}],
            "rollout": {"mode": "service", "episodes_per_update": 4, "group_size": 2, "max_tokens": 8},
            "train": {"updates": 1, "save_versions": False},
            "eval": {"every": 100, "episodes": 2},
            "stream": {"name": stream},
        }
    )
    settings = load_settings(rpc_timeout_s=60)
    addresses = Addresses(env_addr, inf_addr, rew_addr, None, redis_url, stream)
    rollout = RolloutConfig(concurrency=4, sampling=SamplingConfig(max_tokens=8, temperature=1.0))

    def driver() -> contextlib.AbstractAsyncContextManager[Any]:
        return connect(settings, rollout, addresses, stream=False)

    trainer = Trainer(cfg, tmp_path / "run", redis_url, cache_dir=tmp_path / "models")
    trainer.publisher = Publisher(tmp_path / "policies", settings, inference_addr=inf_addr, save_dirs=False)
    trainer.setup()
    await _run_serving(trainer, None, None, driver)

    assert trainer.state.step == 1 and trainer.state.trajectories_used == 4
    rows = trainer.metrics.rows()
    update = next(r for r in rows if "actor/pg_loss" in r)
    # The learner recomputed the inference server's logprobs for the same token ids (same weights).
    assert update["mismatch/abs_logprob_diff"] < 1e-3
    # Version 1: the starting weights, pushed before the rollout; version 2: the update's.
    assert [(p["version"], p["pushed"]) for p in trainer.state.published] == [(1, True), (2, True)]
    assert trainer.state.versions == {"responder": 2}
    async with rpc.channel(inf_addr, settings) as ch:
        policies = await inf_grpc.InferenceServiceStub(ch).ListPolicies(inf_pb.ListPoliciesRequest())
    assert {(p.policy.policy_id, p.policy.version) for p in policies.policies} == {("responder", 2)}


class _Watched:
    """The rollout driver, with the weights inference serves copied at the first ``play`` (the moment
    before the first rollout samples anything)."""

    def __init__(self, driver: Any, registry: PolicyRegistry) -> None:
        self.driver, self.registry = driver, registry
        self.served_at_first_play: dict[str, torch.Tensor] | None = None
        self.version_at_first_play = -1

    async def play(self, tasks: Any) -> Any:
        if self.served_at_first_play is None:
            policy = self.registry.get("responder")
            self.version_at_first_play = policy.version
            model = policy.backend.torch_model  # type: ignore[attr-defined]
            self.served_at_first_play = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return await self.driver.play(tasks)

    def __getattr__(self, name: str) -> Any:  # everything else (config, stats, ...) is the driver's
        return getattr(self.driver, name)


@pytest.mark.slow
async def test_warm_start_then_service_rollouts(
    stack: tuple[str, str, str, Path, PolicyRegistry], redis_url: str, tmp_path: Path
) -> None:
    env_addr, inf_addr, rew_addr, tiny, registry = stack
    stream = f"test:train-service-warm:{tmp_path.name}"
    cfg = TrainConfig.model_validate(
        {
            "name": "service-warm-test",
            "game": {"id": "ultimatum_v1", "variant": "easy", "bot": "heuristic"},
            "policies": [{"id": "responder", "seats": [1], "model": str(tiny), "lr": 1e-3}],
            "warmstart": {"bot": "random", "episodes": 8, "steps": 3},
            "rollout": {"mode": "service", "episodes_per_update": 4, "group_size": 2, "max_tokens": 8},
            "train": {"updates": 1, "save_versions": False},
            "eval": {"every": 100, "episodes": 2},
            "stream": {"name": stream},
        }
    )
    settings = load_settings(rpc_timeout_s=60)
    addresses = Addresses(env_addr, inf_addr, rew_addr, None, redis_url, stream)
    rollout = RolloutConfig(concurrency=4, sampling=SamplingConfig(max_tokens=8, temperature=1.0))
    watched: list[_Watched] = []

    @contextlib.asynccontextmanager
    async def driver() -> AsyncIterator[_Watched]:
        async with connect(settings, rollout, addresses, stream=False) as opened:
            watched.append(_Watched(opened, registry))
            yield watched[-1]

    trainer = Trainer(cfg, tmp_path / "run", redis_url, cache_dir=tmp_path / "models")
    trainer.publisher = Publisher(tmp_path / "policies", settings, inference_addr=inf_addr, save_dirs=False)
    trainer.setup()
    assert trainer.state.model_path != str(tiny)  # the learner starts from the clone
    learner_start = {k: v.clone() for k, v in trainer.learners["responder"].export_weights().tensors.items()}
    served_base = registry.get("responder").backend.torch_model.state_dict()  # type: ignore[attr-defined]
    assert any(not torch.equal(v, served_base[k]) for k, v in learner_start.items())  # the clone differs

    await _run_serving(trainer, None, None, driver)

    first = watched[0]
    assert first.version_at_first_play == 1 and first.served_at_first_play is not None
    assert first.served_at_first_play.keys() >= learner_start.keys()
    for key, value in learner_start.items():
        assert torch.equal(first.served_at_first_play[key], value), key
    update = next(r for r in trainer.metrics.rows() if "actor/pg_loss" in r)
    assert update["mismatch/abs_logprob_diff"] < 1e-3  # sampled by the clone, recomputed by the clone
    assert trainer.state.versions == {"responder": 2}
