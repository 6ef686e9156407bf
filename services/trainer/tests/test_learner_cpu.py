"""The CPU learner really updates a real (tiny) model: logprobs match a fresh forward, an update with
positive advantages raises the sampled tokens' logprobs, and checkpoints round-trip exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from wolfpack_inference.models import tiny_model
from wolfpack_trainer import algos
from wolfpack_trainer.batch import Sample, collate
from wolfpack_trainer.learners import LearnerConfig, LossConfig, get_learner
from wolfpack_trainer.learners.base import TrainBatch
from wolfpack_trainer.learners.cpu import CpuLearner, resolve_model_path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model(tmp_path_factory.mktemp("models")))


def _batch() -> TrainBatch:
    samples = [
        Sample(
            prompt=[5, 6, 7, 8][: 2 + i % 3],
            response=[10 + i, 20 + i, 30 + i],
            response_mask=[1, 1, 1],
            logprobs=[-1.0] * 3,
            rewards=[0.0, 0.0, 1.0],
            uid="g",
            trajectory_id=f"t{i}",
            episode_uid="e",
            policy_id="p",
            role="r",
            seat=0,
            policy_version=0,
            turn_index=0,
        )
        for i in range(4)
    ]
    batch = collate(samples)
    batch.advantages = torch.ones_like(batch.response_mask)
    return batch


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_update_raises_logprobs_of_positive_advantage_tokens(model_dir: str, lora_rank: int) -> None:
    cfg = LearnerConfig(model=model_dir, lr=1e-2 if lora_rank else 1e-3, lora_rank=lora_rank, micro_batch_size=2,
                        loss=LossConfig(kl_coef=0.1 if lora_rank else 0.0))  # fmt: skip
    learner = get_learner("cpu")(cfg)
    batch = _batch()
    before = learner.compute_log_probs(batch)
    batch.old_log_probs = before
    if lora_rank:
        batch.ref_log_prob = learner.compute_ref_log_probs(batch)
        assert batch.ref_log_prob is not None and torch.allclose(batch.ref_log_prob, before, atol=1e-5)
    metrics = learner.update(batch)
    after = learner.compute_log_probs(batch)
    assert learner.step == 1
    assert (after - before)[batch.response_mask > 0].mean() > 0
    assert metrics["actor/grad_norm"] > 0 and "actor/entropy" in metrics and "actor/pg_clipfrac" in metrics
    exported = learner.export_weights()
    assert exported.is_adapter == bool(lora_rank)
    if lora_rank:
        assert all("lora_" in k for k in exported.tensors) and '"r": 4' in exported.adapter_config_json


def test_logprobs_do_not_depend_on_padding(model_dir: str) -> None:
    learner = get_learner("cpu")(LearnerConfig(model=model_dir, micro_batch_size=1))
    batch = _batch()
    alone = [learner.compute_log_probs(batch.select([i])) for i in range(len(batch))]
    together = learner.compute_log_probs(batch)
    for i, lp in enumerate(alone):
        n = int(batch.select([i]).response_mask.sum())
        assert torch.allclose(lp[0, :n], together[i, :n], atol=1e-5)


def test_checkpoint_round_trip_is_exact(model_dir: str, tmp_path: Path) -> None:
    cfg = LearnerConfig(model=model_dir, lr=1e-3, value_head=True)
    a = get_learner("cpu")(cfg)
    batch = _batch()
    batch.old_log_probs = a.compute_log_probs(batch)
    a.update(batch)
    a.save(tmp_path / "ckpt")
    b = get_learner("cpu")(cfg)
    b.load(tmp_path / "ckpt")
    assert b.step == 1
    assert torch.equal(a.compute_log_probs(batch), b.compute_log_probs(batch))
    va, vb = a.compute_values(batch), b.compute_values(batch)
    assert va is not None and vb is not None and torch.equal(va, vb)
    # the optimiser state came back too: one more identical update keeps them identical
    for learner in (a, b):
        batch.old_log_probs = learner.compute_log_probs(batch)
        learner.update(batch)
    assert torch.equal(a.compute_log_probs(batch), b.compute_log_probs(batch))


def test_unknown_learner_lists_names() -> None:
    with pytest.raises(KeyError, match="cpu"):
        get_learner("nope")


# --- added for mutation testing (bench/results/2026-11-26-mutation-trainer.md) ------------------------------


def _reference_forward(model_dir: str, batch: TrainBatch, temperature: float = 1.0) -> list[dict[str, Any]]:
    """A second implementation: each sample alone, unpadded, through a freshly loaded copy of the model.
    Per sample: response-token logprobs, entropies and last-layer hidden states at the predicting positions."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)  # in eval mode
    out = []
    for i in range(len(batch)):
        prompt = batch.prompts[i][batch.attention_mask[i, : batch.prompts.shape[1]] > 0].tolist()
        n = int(batch.attention_mask[i, batch.prompts.shape[1] :].sum())
        response = batch.responses[i, :n].tolist()
        with torch.no_grad():
            res = model(input_ids=torch.tensor([prompt + response]), output_hidden_states=True)
        # the token at position k is predicted from the logits at position k - 1
        at = slice(len(prompt) - 1, len(prompt) + n - 1)
        logp = torch.log_softmax(res.logits[0, at] / temperature, dim=-1)
        out.append(
            {
                "logp": logp[torch.arange(n), torch.tensor(response)],
                "entropy": -(logp.exp() * logp).sum(-1),
                "hidden": res.hidden_states[-1][0, at],
            }
        )
    return out


def test_logprobs_match_a_plain_forward_at_the_temperature(model_dir: str) -> None:
    learner = get_learner("cpu")(LearnerConfig(model=model_dir, temperature=2.0, micro_batch_size=3))
    batch = _batch()
    got = learner.compute_log_probs(batch)
    for i, ref in enumerate(_reference_forward(model_dir, batch, temperature=2.0)):
        assert torch.allclose(got[i, : len(ref["logp"])], ref["logp"], atol=1e-5)
    # and the default temperature is 1
    plain = get_learner("cpu")(LearnerConfig(model=model_dir)).compute_log_probs(batch)
    assert torch.allclose(plain[0, :3], _reference_forward(model_dir, batch)[0]["logp"], atol=1e-5)


def test_grad_norm_is_that_of_the_token_mean_ppo_loss(model_dir: str) -> None:
    # At ratio 1 (old = current logprobs) PPO's clipped loss is -A * ratio, whose gradient is that of
    # -token_mean(A * logp). Accumulating micro-batches of 1 must give the whole batch's gradient.
    learner = get_learner("cpu")(LearnerConfig(model=model_dir, micro_batch_size=1, lr=1e-3))
    batch = _batch()
    batch.advantages = torch.tensor([[1.0], [-2.0], [0.5], [3.0]]).expand(4, 3).clone()
    batch.old_log_probs = learner.compute_log_probs(batch)
    metrics = learner.update(batch)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    losses = []
    for i in range(len(batch)):
        prompt = batch.prompts[i][batch.attention_mask[i, : batch.prompts.shape[1]] > 0].tolist()
        response = batch.responses[i].tolist()
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
        logp = torch.log_softmax(logits, dim=-1)[torch.arange(3), torch.tensor(response)]
        losses.append(-(batch.advantages[i] * logp))
    torch.stack(losses).mean().backward()  # type: ignore[no-untyped-call]  # every sample has 3 valid tokens: the token mean
    norm = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])
    )
    assert metrics["actor/grad_norm"] == pytest.approx(float(norm), rel=1e-4)


def test_metrics_average_over_every_micro_step(model_dir: str) -> None:
    # lr 0: the weights never move, so every micro-step sees ratio 1 and its pg_loss is -token_mean(A)
    cfg = LearnerConfig(
        model=model_dir, lr=0.0, ppo_epochs=2, mini_batch_size=2, micro_batch_size=1, value_head=True
    )
    learner = get_learner("cpu")(cfg)
    batch = _batch()
    rows = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    batch.advantages = rows.expand(4, 3).clone()
    batch.old_log_probs = learner.compute_log_probs(batch)
    batch.values = learner.compute_values(batch)
    assert batch.values is not None and torch.equal(batch.values, torch.zeros(4, 3))  # zero-initialised head
    batch.returns = rows.expand(4, 3).clone()
    batch.ref_log_prob = batch.old_log_probs  # present, but kl_coef is 0: no KL term, no KL metric
    metrics = learner.update(batch)
    assert "actor/kl_loss" not in metrics
    # 2 epochs x 4 micro-steps of one sample each: the mean of -A over the samples
    assert metrics["actor/pg_loss"] == pytest.approx(-2.5, abs=1e-5)
    assert metrics["actor/pg_clipfrac"] == 0.0 and metrics["actor/lr"] == 0.0
    # values 0, returns R: 0.5 * R^2 per sample (no clipping: the clipped prediction is also 0), mean 3.75
    assert metrics["critic/vf_loss"] == pytest.approx(0.5 * (1 + 4 + 9 + 16) / 4, abs=1e-5)
    assert metrics["critic/vf_clipfrac"] == 0.0
    # the entropy metric: each sample's token-mean entropy, averaged (each sample counted once per epoch)
    ref = _reference_forward(model_dir, batch)
    assert metrics["actor/entropy"] == pytest.approx(
        float(torch.stack([r["entropy"].mean() for r in ref]).mean()), rel=1e-4
    )
    assert learner.step == 1


def _k3(before: torch.Tensor, after: torch.Tensor) -> float:
    r = after - before
    return float((torch.exp(r) - 1 - r).mean())


def test_target_kl_stops_the_update_before_the_step_that_would_go_past_it(model_dir: str) -> None:
    """Why: with a learning rate that is too large for one batch, the optimiser steps of one update
    (``ppo_epochs`` x mini-batches) can carry the policy far from the one that sampled it (seen on the demo:
    a PPO KL of 0.44 within one update, then a policy that no longer spelled its answers). ``target_kl``
    ends the update at the first mini-batch whose KL from the update's start is past it, without its step."""

    def run(target_kl: float) -> tuple[dict[str, float], float]:
        cfg = LearnerConfig(model=model_dir, lr=3e-2, ppo_epochs=4, mini_batch_size=1, micro_batch_size=1,
                            target_kl=target_kl, loss=LossConfig(clip_ratio=10.0))  # fmt: skip
        learner = get_learner("cpu")(cfg)
        batch = _batch()
        batch.old_log_probs = before = learner.compute_log_probs(batch)
        metrics = learner.update(batch)
        return metrics, _k3(before, learner.compute_log_probs(batch))

    free, moved = run(0.0)
    assert free["actor/optimizer_steps"] == 16 and "actor/kl_early_stop" not in free
    assert free["actor/approx_kl_max"] > 0.05 and moved > 0.05  # unguarded, the update goes far
    stopped, kept = run(0.05)
    assert stopped["actor/kl_early_stop"] == 1.0
    assert 1 <= stopped["actor/optimizer_steps"] < 16
    # each mini-batch is checked before its step: every step taken started within the bound
    assert stopped["actor/approx_kl_max"] > 0.05
    assert kept < moved


def test_values_come_from_the_last_hidden_state_at_the_predicting_positions(model_dir: str) -> None:
    learner = CpuLearner(LearnerConfig(model=model_dir, value_head=True, micro_batch_size=3))
    head = learner.value_head
    assert head is not None
    torch.manual_seed(1)
    with torch.no_grad():
        head.weight.normal_()
        head.bias.fill_(0.25)
    batch = _batch()
    values = learner.compute_values(batch)
    assert values is not None
    for i, ref in enumerate(_reference_forward(model_dir, batch)):
        want = ref["hidden"] @ head.weight[0] + 0.25
        assert torch.allclose(values[i], want, atol=1e-4)


def test_no_value_head_no_values_and_no_kl_no_reference(model_dir: str) -> None:
    learner = get_learner("cpu")(LearnerConfig(model=model_dir))
    batch = _batch()
    assert learner.compute_values(batch) is None
    assert learner.compute_ref_log_probs(batch) is None


def test_full_finetune_reference_is_the_frozen_initial_policy(model_dir: str) -> None:
    learner = get_learner("cpu")(LearnerConfig(model=model_dir, lr=1e-2, loss=LossConfig(kl_coef=0.1)))
    batch = _batch()
    initial = learner.compute_log_probs(batch)
    batch.old_log_probs = initial
    batch.ref_log_prob = learner.compute_ref_log_probs(batch)
    assert batch.ref_log_prob is not None and torch.allclose(batch.ref_log_prob, initial, atol=1e-6)
    metrics = learner.update(batch)
    assert metrics["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # policy == reference in this step
    assert not torch.allclose(learner.compute_log_probs(batch), initial, atol=1e-4)
    assert torch.equal(learner.compute_ref_log_probs(batch), batch.ref_log_prob)  # type: ignore[arg-type]


def test_update_preconditions(model_dir: str) -> None:
    learner = get_learner("cpu")(LearnerConfig(model=model_dir, loss=LossConfig(kl_coef=0.1)))
    batch = _batch()
    with pytest.raises(ValueError, match="old_log_probs"):
        learner.update(batch)  # advantages set, old logprobs not
    batch.old_log_probs = learner.compute_log_probs(batch)
    with pytest.raises(ValueError, match="ref_log_prob"):
        learner.update(batch)
    assert learner.step == 0


def test_lora_checkpoint_round_trip_holds_only_the_adapter(model_dir: str, tmp_path: Path) -> None:
    cfg = LearnerConfig(model=model_dir, lr=1e-2, lora_rank=4)
    a = get_learner("cpu")(cfg)
    batch = _batch()
    batch.old_log_probs = a.compute_log_probs(batch)
    a.update(batch)
    state = a.state_dict()
    assert state["model"] and all("lora_" in k for k in state["model"])
    a.save(tmp_path / "ckpt")
    b = get_learner("cpu")(cfg)
    b.load(tmp_path / "ckpt")
    assert torch.equal(a.compute_log_probs(batch), b.compute_log_probs(batch))
    state["model"]["not.a.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match="lacks"):
        b.load_state_dict(state)


def test_full_export_is_the_whole_state_dict(model_dir: str) -> None:
    learner = get_learner("cpu")(LearnerConfig(model=model_dir))
    exported = learner.export_weights()
    assert not exported.is_adapter and exported.adapter_config_json == ""
    assert set(exported.tensors) == set(learner.model.state_dict())  # type: ignore[attr-defined]


def test_generation_model_is_eval_and_no_grad(model_dir: str) -> None:
    learner = CpuLearner(LearnerConfig(model=model_dir))
    learner.model.train()  # type: ignore[attr-defined]
    with learner.generation_model() as model:
        assert not model.training and not torch.is_grad_enabled()
    assert torch.is_grad_enabled()


def test_model_specs_resolve_through_the_inference_package(model_dir: str) -> None:
    # "tiny" is built (here: found, already built) in the cache directory; other specs pass through
    assert resolve_model_path("tiny", str(Path(model_dir).parent)) == model_dir
    assert resolve_model_path("org/some-model", "/nonexistent") == "org/some-model"
    assert resolve_model_path(model_dir, "/nonexistent") == model_dir


def test_kl_term_pulls_the_policy_towards_the_reference(model_dir: str) -> None:
    # zero advantages: the only gradient is the KL term's; a reference 1 nat below the policy on every
    # sampled token must be approached (the KL shrinks), never fled
    cfg = LearnerConfig(model=model_dir, lr=1e-3, loss=LossConfig(kl_coef=1.0, kl_type="low_var_kl"))
    learner = get_learner("cpu")(cfg)
    batch = _batch()
    batch.advantages = torch.zeros_like(batch.response_mask)
    batch.old_log_probs = learner.compute_log_probs(batch)
    batch.ref_log_prob = batch.old_log_probs - 1.0
    mask = batch.response_mask
    loss_cfg = cfg.loss
    before = algos.kl_loss(batch.old_log_probs, batch.ref_log_prob, mask, loss_cfg).item()
    learner.update(batch)
    after = algos.kl_loss(learner.compute_log_probs(batch), batch.ref_log_prob, mask, loss_cfg).item()
    assert after < before


def test_version_directories_get_the_tokenizer_files_save_pretrained_writes(
    model_dir: str, tmp_path: Path
) -> None:
    """``write_tokenizer``: byte for byte the files of ``AutoTokenizer.save_pretrained``, the tokenizer
    loaded once per model path however many versions are written."""
    from wolfpack_trainer.learners.base import _tokenizer_files, write_tokenizer

    AutoTokenizer.from_pretrained(model_dir).save_pretrained(tmp_path / "theirs")
    _tokenizer_files.cache_clear()
    for v in range(3):
        (tmp_path / f"v{v}").mkdir()
        write_tokenizer(model_dir, tmp_path / f"v{v}")
    theirs = {f.name: f.read_bytes() for f in (tmp_path / "theirs").iterdir()}
    assert theirs and "tokenizer_config.json" in theirs
    for v in range(3):
        assert {f.name: f.read_bytes() for f in (tmp_path / f"v{v}").iterdir()} == theirs
    info = _tokenizer_files.cache_info()
    assert (info.misses, info.hits) == (1, 2)
    with pytest.raises(OSError):  # no tokenizer there: raised as from_pretrained raises, each time
        write_tokenizer(str(tmp_path / "nowhere"), tmp_path / "v0")


def test_save_pretrained_full_model_loads_by_path_with_its_tokenizer(model_dir: str, tmp_path: Path) -> None:
    learner = CpuLearner(LearnerConfig(model=model_dir))
    out = learner.save_pretrained(tmp_path / "hf")
    # the tokenizer files are in the directory itself (loading alone is not a check: in this environment
    # AutoTokenizer also succeeded on a directory saved without them)
    assert (out / "tokenizer_config.json").is_file()
    assert AutoTokenizer.from_pretrained(out) is not None
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    for key, value in learner.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
