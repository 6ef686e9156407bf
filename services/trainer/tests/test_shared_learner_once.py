"""A learner shared by several policy ids (``train.share_policy``) is one learner outside the update too: a
checkpoint saves it once and a resume restores it exactly (a checkpoint of the older layout, the same state
saved again under every id, still resumes), and each published version leaves it once (one version
directory written, one export for PushWeights) while every policy id's inference gets the version. IPPO
keeps one saved state and one export per learner.

Real parts throughout: the tiny model, ultimatum episodes played in process, the CPU learner, a real
inference service (transformers backend, CPU) serving both policy ids. The only instrumentation is a
pass-through count of the learner's ``export_weights``/``save_pretrained`` calls."""

from __future__ import annotations

import os
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
from wolfpack_trainer.batch import Sample, collate
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.learners.base import Learner
from wolfpack_trainer.publish import Publisher
from wolfpack_trainer.train import Trainer

IDS = ("proposer", "responder")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model(tmp_path_factory.mktemp("models"), max_positions=2048))


def _config(tiny: str, *, share: bool, lora_rank: int = 0) -> TrainConfig:
    policy: dict[str, Any] = {"model": tiny, "lr": 1e-2, "mini_batch_size": 4, "lora_rank": lora_rank}
    return TrainConfig.model_validate(
        {
            "name": "shared-once",
            "game": {"id": "ultimatum_v1", "variant": "easy"},
            "policies": [{"id": pid, "seats": [seat], **policy} for seat, pid in enumerate(IDS)],
            "rollout": {
                "episodes_per_update": 4,
                "group_size": 2,
                "max_tokens": 8,
                "max_prompt_tokens": 1500,
            },
            "batch": {"layout": "turn", "group_by": ["group", "role"]},
            "train": {"share_policy": share, "max_staleness": 1},
        }
    )


def _trainer(run: Path, cfg: TrainConfig, cache: Path) -> Trainer:
    t = Trainer(cfg, run, "redis://unused", cache_dir=cache)
    t.setup()
    return t


def _trained(tmp_path: Path, tiny: str, share: bool) -> Trainer:
    """A trainer after one committed update (so the optimiser has state), both roles with a gradient."""
    t = _trainer(tmp_path / "run", _config(tiny, share=share), tmp_path)
    trajs = t.play_local(t.tasks([1, 2], 2, "u0"), 1.0)
    for i, traj in enumerate(trajs):  # the random tiny model's seats all score alike: spread them by hand
        for o in traj.outcomes:
            o.final_reward = float(i if o.seat == 0 else -i)
    t._train_update(trajs)
    assert t.state.step == 1
    return t


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    """Equal nested state (tensors exactly)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _assert_restored(saved: Learner, resumed: Learner) -> None:
    """Weights and optimiser state equal, and not trivially so (the optimiser has moments to restore)."""
    s, r = saved.state_dict(), resumed.state_dict()
    assert s["optimizer"]["state"], "no optimiser state: the test would not see a lost one"
    _assert_same(s["model"], r["model"], "model")
    _assert_same(s["optimizer"], r["optimizer"], "optimizer")
    assert saved.step == resumed.step == 1


def test_a_shared_learner_is_checkpointed_once_and_resumes_exactly(tmp_path: Path, tiny: str) -> None:
    t = _trained(tmp_path, tiny, share=True)
    ckpt = t.checkpoint()
    assert sorted(p.name for p in ckpt.iterdir()) == ["learner-proposer", "state.json"]
    again = _trainer(tmp_path / "run", t.cfg, tmp_path)
    assert again.resumed_from == 1
    assert again.learners["responder"] is again.learners["proposer"]
    _assert_restored(t.learners["proposer"], again.learners["proposer"])


def test_an_old_checkpoint_with_the_shared_learner_under_every_id_still_resumes(
    tmp_path: Path, tiny: str
) -> None:
    t = _trained(tmp_path, tiny, share=True)
    ckpt = t.checkpoint()
    t.learners["responder"].save(ckpt / "learner-responder")  # what the per-id loop wrote besides
    again = _trainer(tmp_path / "run", t.cfg, tmp_path)
    assert again.resumed_from == 1 and again.learners["responder"] is again.learners["proposer"]
    _assert_restored(t.learners["proposer"], again.learners["proposer"])
    again.state.step += 1
    assert sorted(p.name for p in again.checkpoint().iterdir()) == ["learner-proposer", "state.json"]


def test_ippo_still_checkpoints_and_resumes_each_learner(tmp_path: Path, tiny: str) -> None:
    t = _trained(tmp_path, tiny, share=False)
    ckpt = t.checkpoint()
    assert sorted(p.name for p in ckpt.iterdir()) == ["learner-proposer", "learner-responder", "state.json"]
    again = _trainer(tmp_path / "run", t.cfg, tmp_path)
    assert again.learners["proposer"] is not again.learners["responder"]
    for pid in IDS:
        _assert_restored(t.learners[pid], again.learners[pid])
    a, b = (t.learners[pid].state_dict()["model"] for pid in IDS)
    assert any(not torch.equal(a[k], b[k]) for k in a)  # two learners, two states (not one saved twice)


# --- publishing --------------------------------------------------------------------------------------


@pytest.fixture
async def inference(tiny: str, tmp_path: Path) -> AsyncIterator[str]:
    """A real inference service serving both policy ids, each with its own engine, on the tiny model."""
    configs = [
        PolicyConfig(policy_id=pid, model=tiny, device="cpu", dtype="float32")  # type: ignore[arg-type]
        for pid in IDS
    ]
    registry = PolicyRegistry.from_configs(configs, tmp_path / "inference")
    server = await rpc.start_server(
        "inference", lambda s: register(s, InferenceServicer(registry)), load_settings(), "127.0.0.1:0"
    )
    yield f"127.0.0.1:{server.port}"
    await server.stop(0)
    await registry.close()


def _count(learner: Learner, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Pass-through count of the calls that take the weights out of the learner."""
    calls = {"export_weights": 0, "save_pretrained": 0}
    for name in calls:
        real = getattr(learner, name)

        def spy(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(learner, name, spy)
    return calls


def _change(learner: Any, scale: float) -> None:
    """A visible change of the policy (LoRA B starts at zero)."""
    with torch.no_grad():
        for name, p in learner.model.named_parameters():
            if p.requires_grad and ("lora_B" in name or (learner.config.lora_rank == 0 and "mlp" in name)):
                p.add_(torch.randn_like(p) * scale)


async def _served_logprobs(addr: str, pid: str) -> tuple[int, Sample]:
    """The version ``pid`` serves and a greedy completion of it with the served logprobs."""
    async with rpc.channel(addr, load_settings(rpc_timeout_s=60)) as ch:
        req = inf_pb.GenerateRequest(policy_id=pid)
        req.tokens.token_ids.extend([5, 6, 7, 8])
        req.sampling.max_tokens = 6
        req.sampling.temperature = 0.0
        req.sampling.logprobs = True
        resp = await inf_grpc.InferenceServiceStub(ch).Generate(req)
    c = resp.completions[0]
    sample = Sample(
        prompt=list(resp.prompt_token_ids), response=list(c.token_ids), response_mask=[1] * len(c.token_ids),
        logprobs=list(c.logprobs), rewards=[0.0] * len(c.token_ids), uid="u", trajectory_id="t", episode_uid="e",
        policy_id=pid, role="r", seat=0, policy_version=resp.policy.version, turn_index=0,
    )  # fmt: skip
    return resp.policy.version, sample


@pytest.mark.parametrize(
    ("share", "sync", "lora_rank"),
    [(True, "push", 4), (True, "push", 0), (True, "path", 0), (False, "push", 4)],
    ids=["shared-push-lora", "shared-push-full", "shared-path-full", "ippo-push-lora"],
)
async def test_each_version_leaves_a_learner_once_and_reaches_every_policy_id(
    inference: str,
    tiny: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    share: bool,
    sync: str,
    lora_rank: int,
) -> None:
    t = _trainer(tmp_path / "run", _config(tiny, share=share, lora_rank=lora_rank), tmp_path)
    t.publisher = Publisher(tmp_path / "run" / "policies", inference_addr=inference, weight_sync=sync)  # type: ignore[arg-type]
    learners = list({id(lr): lr for lr in t.learners.values()}.values())
    assert len(learners) == (1 if share else 2)
    counts = [_count(lr, monkeypatch) for lr in learners]
    for version in (1, 2):
        for i, lr in enumerate(learners):  # a new version: weights unlike the served ones (per learner)
            _change(lr, 0.5 * (i + 1))
        await (t.publish_current() if version == 1 else t._publish(freeze=False))
        # per learner and version: one directory written, one export when pushing (none by path)
        for c in counts:
            assert c == {"export_weights": version * (sync == "push"), "save_pretrained": version}, c
        assert t.state.versions == dict.fromkeys(IDS, version)
        recent = t.state.published[-len(IDS) :]
        assert [(p["policy_id"], p["version"], p["sync"]) for p in recent] == [
            (pid, version, sync) for pid in IDS
        ]
        served = []
        for pid in IDS:  # every id's own engine serves the new version: its learner's weights
            got, sample = await _served_logprobs(inference, pid)
            assert got == version, pid
            ours = t.learners[pid].compute_log_probs(collate([sample]))[0]
            assert torch.allclose(ours, torch.tensor(sample.logprobs), atol=1e-4), pid
            served.append(sample.logprobs)
        dirs = [Path(p["path"]) for p in recent]
        assert [d.name for d in dirs] == [f"v{version:06d}"] * 2 and [d.parent.name for d in dirs] == list(
            IDS
        )
        weights = "adapter_model.safetensors" if lora_rank else "model.safetensors"
        # one write of a shared learner's weights: the other id's directory links the same file
        assert os.path.samefile(dirs[0] / weights, dirs[1] / weights) == share
        if not share:
            assert served[0] != served[1]  # two learners, each id its own weights
