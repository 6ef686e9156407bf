"""``train.share_policy`` with two policy ids: one training step is ONE update of the shared learner over the
samples of both policies (one old-log-prob pass, one optimiser step sequence), each policy's advantages
computed on its own samples as under IPPO, and the result is exactly the learner's update on the batch merged
by hand from the two policies' batches (which have different padding widths).

Real parts throughout: the tiny model, ultimatum episodes played in process, the trainer's batch, verl's
GRPO / GAE, the CPU learner. The only instrumentation is a pass-through record of what the learner is called
with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from wolfpack_inference.models import tiny_model
from wolfpack_trainer import algos
from wolfpack_trainer.batch import build_samples, collate, narrow, split_by_policy
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.learners.base import Learner, TrainBatch, get_learner
from wolfpack_trainer.train import Trainer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model(tmp_path_factory.mktemp("models"), max_positions=2048))


def _trainer(tmp_path: Path, cfg: TrainConfig) -> Trainer:
    t = Trainer(cfg, tmp_path / "run", "redis://unused", cache_dir=tmp_path)
    t.setup()
    return t


def _params(learner: Any) -> list[torch.Tensor]:
    out = [p.detach().clone() for p in learner.model.parameters()]
    if learner.value_head is not None:
        out += [p.detach().clone() for p in learner.value_head.parameters()]
    return out


def _record(learner: Learner, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[TrainBatch]]:
    """Pass-through record of the batches the learner's passes and updates are called with."""
    calls: dict[str, list[TrainBatch]] = {}
    for name in ("update", "compute_log_probs", "compute_ref_log_probs", "compute_values"):
        real = getattr(learner, name)

        def spy(batch: TrainBatch, _real: Any = real, _name: str = name) -> Any:
            calls.setdefault(_name, []).append(batch)
            return _real(batch)

        monkeypatch.setattr(learner, name, spy)
    return calls


def _hand_merge(batches: list[TrainBatch], pad: int) -> TrainBatch:
    """Stack batches of different widths: prompts left-padded, every [B, R] tensor right-padded."""
    p = max(b.prompts.shape[1] for b in batches)
    r = max(b.response_length for b in batches)

    def cat(key: str, left: int | None = None, value: float = 0) -> torch.Tensor | None:
        parts = [getattr(b, key) for b in batches]
        if any(x is None for x in parts):
            assert all(x is None for x in parts), key
            return None
        return torch.cat(
            [F.pad(x, (p - x.shape[1], 0) if left else (0, r - x.shape[1]), value=value) for x in parts]
        )

    prompts = cat("prompts", left=1, value=pad)
    responses = cat("responses", value=pad)
    assert prompts is not None and responses is not None
    attention = torch.cat(
        [
            torch.cat([F.pad(b.attention_mask[:, : b.prompts.shape[1]], (p - b.prompts.shape[1], 0)),
                       F.pad(b.attention_mask[:, b.prompts.shape[1] :], (0, r - b.response_length))], dim=1)
            for b in batches
        ]
    )  # fmt: skip
    lists: dict[str, Any] = {
        k: [x for b in batches for x in getattr(b, k)]
        for k in ("uids", "trajectory_ids", "policy_ids", "roles", "policy_versions", "turn_indices")
    }
    tensors = {
        k: cat(k)
        for k in (
            "response_mask",
            "rollout_log_probs",
            "token_level_rewards",
            "advantages",
            "returns",
            "values",
        )
    }
    return TrainBatch(
        prompts=prompts, responses=responses, input_ids=torch.cat([prompts, responses], dim=1),
        attention_mask=attention, position_ids=(attention.cumsum(dim=1) - 1).clamp(min=0), **tensors, **lists,
    )  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.parametrize("estimator", ["grpo", "gae", "reinforce_pp"])
def test_shared_policy_is_one_update_over_both_policies_samples(
    tmp_path: Path, tiny: str, estimator: str, monkeypatch: pytest.MonkeyPatch, two_seat_config: Any
) -> None:
    cfg = two_seat_config(tiny, estimator, share_policy=True)
    t = _trainer(tmp_path, cfg)
    learner: Any = t.learners["proposer"]
    assert t.learners["responder"] is learner
    trajs = t.play_local(t.tasks([1, 2], 2, "u0"), 1.0)
    # The random tiny model's answers are all invalid, so every seat scores the same and GRPO's advantages
    # would be 0: spread the seats' returns by hand so that both roles have a gradient from their groups.
    for i, traj in enumerate(trajs):
        for o in traj.outcomes:
            o.final_reward = float(i if o.seat == 0 else -i)
    pad = int(t.tokenizer.pad_token_id or 0)
    own = split_by_policy(build_samples(trajs, cfg.batch_config(pad)))
    assert list(own) == ["proposer", "responder"]
    alone = {pid: collate(s, pad) for pid, s in own.items()}
    widths = {pid: (b.prompts.shape[1], b.response_length) for pid, b in alone.items()}
    assert widths["proposer"] != widths["responder"], widths  # the merge has padding to do

    # the reference: a second learner built alike, updated once by hand on the hand-merged batch
    ref: Any = get_learner("cpu")(
        cfg.learner_config(cfg.policies[0], str(tmp_path), model=t.state.model_path)
    )
    for a, b in zip(_params(ref), _params(learner), strict=True):
        assert torch.equal(a, b)
    merged = _hand_merge(list(alone.values()), pad)
    if estimator == "gae":  # V(s) of the learner's batch, each policy's rows at its own widths
        merged.values = ref.compute_values(merged)
        start = 0
        for b in alone.values():
            b.values = merged.values[start : start + len(b), : b.response_length]
            start += len(b)
    for pid, b in alone.items():
        adv = algos.compute_advantages(b, own[pid], cfg.algo_config())
        b.advantages, b.returns = adv.advantages, adv.returns
        assert adv.advantages.abs().max() > 0, pid
    merged = _hand_merge(list(alone.values()), pad)
    merged.old_log_probs = ref.compute_log_probs(merged)
    merged.is_weights = algos.truncated_is_weights(
        merged.old_log_probs, merged.rollout_log_probs, merged.response_mask, 2.0
    )
    merged.ref_log_prob = ref.compute_ref_log_probs(merged)
    expected = ref.update(merged)

    calls = _record(learner, monkeypatch)
    metrics = t.train_step(trajs)
    # one update, one old-log-prob pass, one reference pass (and one value pass), all over both roles' rows
    assert learner.step == 1
    assert {k: len(v) for k, v in calls.items()} == {
        "update": 1, "compute_log_probs": 1, "compute_ref_log_probs": 1, **({"compute_values": 1} if estimator == "gae" else {}),
    }  # fmt: skip
    (got,) = calls["update"]
    assert got.policy_ids == merged.policy_ids and got.roles == merged.roles
    assert {"proposer", "responder"} == set(got.policy_ids)
    for key in ("input_ids", "attention_mask", "position_ids", "response_mask", "advantages", "returns"):
        assert torch.equal(getattr(got, key), getattr(merged, key)), key
    steps = 2 * -(-len(merged) // 4)  # ppo_epochs x mini-batches of 4 over both roles' rows
    assert metrics["actor/optimizer_steps"] == expected["actor/optimizer_steps"] == steps
    for a, b in zip(_params(learner), _params(ref), strict=True):
        assert torch.equal(a, b)
    # per-policy advantage metrics as under IPPO; the learner's metrics once
    if estimator == "grpo":
        for pid in own:
            assert metrics[f"{pid}/adv/episodes"] == 4, (
                pid
            )  # each role's own seats: 4 episodes, one seat each
    assert metrics["actor/pg_loss"] == expected["actor/pg_loss"]
    assert not any(k.endswith("/actor/pg_loss") for k in metrics)


def test_narrow_gives_one_policys_own_batch(tmp_path: Path, tiny: str, two_seat_config: Any) -> None:
    cfg = two_seat_config(tiny, "grpo", share_policy=True)
    t = _trainer(tmp_path, cfg)
    trajs = t.play_local(t.tasks([3, 4], 2, "n"), 1.0)
    pad = int(t.tokenizer.pad_token_id or 0)
    own = split_by_policy(build_samples(trajs, cfg.batch_config(pad)))
    both = collate([s for pid in own for s in own[pid]], pad)
    start = 0
    for samples in own.values():
        alone = collate(samples, pad)
        part = narrow(both.select(list(range(start, start + len(samples)))))
        start += len(samples)
        for key, value in alone.tensors().items():
            assert torch.equal(getattr(part, key), value), key
        assert part.policy_ids == alone.policy_ids and part.uids == alone.uids


def test_ippo_still_updates_each_learner_once_on_its_own_samples(
    tmp_path: Path, tiny: str, monkeypatch: pytest.MonkeyPatch, two_seat_config: Any
) -> None:
    cfg = two_seat_config(tiny, "grpo", share_policy=False)
    t = _trainer(tmp_path, cfg)
    trajs = t.play_local(t.tasks([1, 2], 2, "u0"), 1.0)
    calls = {pid: _record(t.learners[pid], monkeypatch) for pid in ("proposer", "responder")}
    metrics = t.train_step(trajs)
    for pid in ("proposer", "responder"):
        (got,) = calls[pid]["update"]
        assert set(got.policy_ids) == {pid}
        assert t.learners[pid].step == 1
        assert f"{pid}/actor/pg_loss" in metrics and f"{pid}/adv/grpo_groups" in metrics
