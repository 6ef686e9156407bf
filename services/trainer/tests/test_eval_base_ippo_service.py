"""``eval.base`` with several trained policies, through real services: IPPO's proposer and responder both
start from the tiny model and are warm-started; the base they share is served once (``base-proposer``, one
engine for both), and each policy's base score counts its own seats only.

The environment, inference and reward servers are started here (no job set them up), serving only the
trained policies, so the trainer itself has inference load the base (``stack.serve_missing``). The logprobs
inference recorded in the base's episodes are the configured model's (teacher-forced here), not the clone's:
the test fails if the base were the clone."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2, trajectory_pb2
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
from wolfpack_trainer import evaluate as ev
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.local_rollout import rollout_config
from wolfpack_trainer.publish import Publisher
from wolfpack_trainer.train import EvalResult, Trainer, _eval_from_json, _run_serving


def _gap(model: Any, trajs: list[trajectory_pb2.Trajectory]) -> float:
    """The largest gap between the logprobs inference recorded for the policy turns and ``model``'s."""
    gap = 0.0
    for traj in trajs:
        for turn in traj.turns:
            if turn.policy.policy_id and turn.response_token_ids:
                prompt, response = list(turn.prompt_token_ids), list(turn.response_token_ids)
                with torch.no_grad():
                    logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
                want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]
                gap = max(gap, float((torch.tensor(list(turn.response_logprobs)) - want).abs().max()))
    return gap


@contextlib.asynccontextmanager
async def _stack(tiny: Path, tmp: Path, redis_url: str, stream: str) -> AsyncIterator[Addresses]:
    settings = load_settings(rpc_timeout_s=60)
    configs = [
        PolicyConfig(policy_id=pid, model=str(tiny), device="cpu", dtype="float32", max_batch=32)  # type: ignore[arg-type]
        for pid in ("proposer", "responder")
    ]
    registry = PolicyRegistry.from_configs(configs, tmp / "inference")
    env = await rpc.start_server(
        "environment", lambda s: register_environment(s, EnvironmentServicer()), settings, "127.0.0.1:0"
    )
    servicer = InferenceServicer(registry)
    inf = await rpc.start_server(
        "inference", lambda s: register_inference(s, servicer), settings, "127.0.0.1:0"
    )
    rew = await rpc.start_server("reward", register_reward, settings, "127.0.0.1:0")
    try:
        yield Addresses(
            f"127.0.0.1:{env.port}", f"127.0.0.1:{inf.port}", f"127.0.0.1:{rew.port}", None, redis_url, stream
        )
    finally:
        for server in (env, inf, rew):
            await server.stop(0)
        await registry.close()


@pytest.mark.slow
async def test_ippo_policies_share_one_served_base_scored_seat_by_seat(
    redis_url: str, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    tiny = tiny_model(tmp_path / "models")
    stream = f"test:eval-base-ippo:{tmp_path.name}"
    cfg = TrainConfig.model_validate(
        {
            "name": "eval-base-ippo",
            "game": {"id": "ultimatum_v1", "variant": "easy"},
            "policies": [
                {"id": "proposer", "seats": [0], "model": str(tiny)},
                {"id": "responder", "seats": [1], "model": str(tiny)},
            ],
            "warmstart": {"bot": "random", "episodes": 8, "steps": 10},
            "rollout": {
                "mode": "service",
                "episodes_per_update": 4,
                "group_size": 2,
                "max_tokens": 6,
                "max_prompt_tokens": 64,
            },
            "train": {"updates": 0, "save_versions": False},
            "eval": {"every": 100, "episodes": 4},
            "stream": {"name": stream},
        }
    )
    assert cfg.eval_base and ev.base_policy_ids(cfg) == {
        "proposer": "base-proposer",
        "responder": "base-proposer",
    }
    settings = load_settings(rpc_timeout_s=60)
    async with _stack(tiny, tmp_path, redis_url, stream) as addresses:
        rollout = rollout_config(cfg, concurrency=4)

        def driver() -> contextlib.AbstractAsyncContextManager[Any]:
            return connect(settings, rollout, addresses, stream=False)

        trainer = Trainer(cfg, tmp_path / "run", redis_url, cache_dir=tmp_path / "models")
        trainer.publisher = Publisher(
            tmp_path / "policies", settings, inference_addr=addresses.inference, save_dirs=False
        )
        trainer.setup()
        evals = await _run_serving(trainer, None, None, driver)
        async with rpc.channel(addresses.inference, settings) as ch:
            listed = await inf_grpc.InferenceServiceStub(ch).ListPolicies(inf_pb.ListPoliciesRequest())

    served = {p.policy.policy_id: p.base_model for p in listed.policies}
    assert served["base-proposer"] == str(tiny) and len(served) == 3  # one base for both policies
    base = evals[0].base
    assert base is not None and base.failed == 0 and base.win_rate.n == 4
    assert set(base.policies) == {"proposer", "responder"}
    played = base.trajectories
    assert {b.policy.policy_id for t in played for b in t.seats} == {"base-proposer"}  # both seats: the base
    # each policy's base score reads its own seat: the seat's outcome in every episode
    for pid, seat in (("proposer", 0), ("responder", 1)):
        wins = [
            o.outcome == common_pb2.OUTCOME_KIND_WIN for t in played for o in t.outcomes if o.seat == seat
        ]
        assert base.policies[pid].win_rate.mean == pytest.approx(sum(wins) / len(wins))
    original: Any = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32).eval()
    clone: Any = AutoModelForCausalLM.from_pretrained(trainer.state.model_path, dtype=torch.float32).eval()
    assert _gap(original, played) < 1e-3 and _gap(clone, played) > 1e-2
    assert _gap(clone, evals[0].trajectories) < 1e-3  # update 0 is the clone's

    rows = {k: v for r in trainer.metrics.rows() if r.get("step") == 0 for k, v in r.items()}
    for key in (
        "reference/base/win_rate",
        "reference/base/proposer/win_rate",
        "reference/base/responder/win_rate",
    ):
        assert key in rows, sorted(rows)
    lines = ev.base_policy_lines("win_rate", base.policies, evals[-1].policies)
    assert len(lines) == 4, lines
    for line, pid in zip(lines[::2], ("proposer", "responder"), strict=True):
        assert line.startswith(
            f"reference[{pid}]: base win_rate {base.policies[pid].win_rate.mean:.2f} (95% CI "
        )
    for line, pid in zip(lines[1::2], ("proposer", "responder"), strict=True):
        assert line.startswith(f"  final[{pid}] win_rate 95% CI lower bound ") and line.endswith("above base")
    # resumable: the first evaluation's record carries the base
    again = EvalResult(**_eval_from_json(trainer.state.evals[0]))
    assert again.base is not None and again.base.win_rate == base.win_rate and again.base.failed == 0
    assert set(again.base.policies) == {"proposer", "responder"}
