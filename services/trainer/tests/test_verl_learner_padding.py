"""The ``verl_fsdp`` learner's micro-batches of rows of like length (``sort_by_length``) and short padding rows
(``short_padding_rows``) on CPU: FSDP2 on gloo, tiny random Qwen2, float32 compute (so that "the same up to
float rounding" is a tight bound).

Oracles: the same learner with both switched off (verl's shuffled order, padding rows as copies of row 0),
restored to the same weights and optimiser state; a plain transformers forward for the log-probs; and, to
show the tolerance means something, an update over a different shuffle of the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl.workers.engine_workers", reason="verl (trainer extra) is not installed")

import torch

from wolfpack_inference.models import tiny_model
from wolfpack_trainer.learners.base import LearnerConfig, LossConfig, TrainBatch, get_learner
from wolfpack_trainer.learners.synthetic import random_batch
from wolfpack_trainer.learners.verl.learner import infer_order, padded_tokens, train_order

P, R = 40, 12
FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def learner(model_dir: Path) -> Iterator[Any]:
    """Actor and critic, mini-batches of 8 in micro-batches of 2, two PPO epochs (the recipe's shape, small)."""
    cfg = LearnerConfig(
        model=str(model_dir), lr=1e-3, mini_batch_size=8, micro_batch_size=2, ppo_epochs=2, device="cpu",
        value_head=True, loss=LossConfig(clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=0.01),
        extra={"strategy": "fsdp2", "mixed_precision": FP32, "critic_lr": 1e-2, "infer_micro_batch_size": 2},
    )  # fmt: skip
    yield get_learner("verl_fsdp")(cfg)


def spread_batch(vocab: int, n: int = 13, seed: int = 0) -> TrainBatch:
    """Left-padded prompts of 2-40 tokens, right-padded responses of 1-12, lengths in no particular order;
    advantages, returns and old values set so that the batch can be trained on."""
    g = torch.Generator().manual_seed(seed)
    plen = torch.randint(2, P + 1, (n,), generator=g)
    rlen = torch.randint(1, R + 1, (n,), generator=g)
    return random_batch(
        plen,
        rlen,
        (P, R),
        vocab,
        g,
        uids=[f"g{i}" for i in range(n)],
        trajectory_ids=[f"t{i}" for i in range(n)],
        draw=("advantages", "returns"),
    )


def hf_logprobs(model_dir: Path, batch: TrainBatch) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).logits[:, P - 1 : -1].float()  # fmt: skip
    picked = torch.log_softmax(logits, -1).gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1)
    return picked * batch.response_mask


def switch(learner: Any, on: bool) -> None:
    learner.sort_by_length = learner.short_padding_rows = on


def weights(learner: Any) -> dict[str, torch.Tensor]:
    """Actor and critic parameters, full, on the CPU."""
    out = {f"actor.{k}": v.float().clone() for k, v in learner.export_weights().tensors.items()}
    critic = learner.workers.call("critic", "full_state", False)["model"]
    out.update({f"critic.{k}": v.float().clone() for k, v in critic.items()})
    return out


def gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


# --- the orders themselves -------------------------------------------------------------------------------


def test_infer_order_is_a_permutation_longest_first_dealt_over_ranks() -> None:
    lengths = [5, 9, 1, 9, 3, 7, 2, 8]
    assert infer_order(lengths, 1) == [1, 3, 7, 5, 0, 4, 6, 2]  # ties keep their order
    two = infer_order(lengths, 2)
    assert sorted(two) == list(range(8))
    first, second = two[:4], two[4:]  # verl's dispatch: rank 0 the first half, rank 1 the second
    assert [lengths[i] for i in first] == [9, 8, 5, 2] and [lengths[i] for i in second] == [9, 7, 3, 1]


def test_train_order_keeps_verls_mini_batches_and_sorts_inside_each() -> None:
    """Per epoch every row once; each mini-batch holds the rows of verl's shuffled one, longest first;
    the epochs are shuffled differently; each rank draws from its own slice with its own seed."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 100, (32,), generator=g).tolist()
    for world in (1, 2):
        plain = train_order(lengths, world, mini=8, epochs=2, seed=7, sort=False)
        ordered = train_order(lengths, world, mini=8, epochs=2, seed=7)
        assert len(plain) == len(ordered) == 64
        local = 32 // world
        for rank in range(world):
            block = plain[rank * 2 * local : (rank + 1) * 2 * local]
            for epoch in range(2):
                assert sorted(block[epoch * local : (epoch + 1) * local]) == list(
                    range(rank * local, (rank + 1) * local)
                )
            assert block[:local] != block[local:]  # each epoch its own shuffle
        step = 8 // world
        for i in range(0, 64, step):
            assert sorted(plain[i : i + step]) == sorted(ordered[i : i + step])  # the same mini-batch
            assert [lengths[r] for r in ordered[i : i + step]] == sorted(
                (lengths[r] for r in plain[i : i + step]), reverse=True
            )
    assert train_order(lengths, 1, 8, 2, seed=8, sort=False) != train_order(
        lengths, 1, 8, 2, seed=7, sort=False
    )


def test_padded_tokens_counts_micro_batches_padded_to_their_longest_row() -> None:
    lengths = [10, 2, 9, 3, 4]  # row 4: a padding row
    assert padded_tokens(lengths, [0, 1, 2, 3], 2, real=4) == (24, 2 * 10 + 2 * 9)
    assert padded_tokens(lengths, [0, 2, 3, 1], 2, real=4) == (24, 2 * 10 + 2 * 3)
    assert padded_tokens(lengths, [0, 2, 4, 1], 2, real=4) == (21, 2 * 10 + 2 * 4)


# --- the learner --------------------------------------------------------------------------------------


def test_update_is_the_same_with_rows_ordered_by_length(learner: Any) -> None:
    """Two PPO epochs over 13 rows of very different lengths (16 with padding rows), actor and critic:
    ordered by length inside each mini-batch, with two-token padding rows, the weights after the update
    equal those of verl's own order with full-length padding rows up to float rounding, while fewer
    padded tokens are computed. A different shuffle of the same rows lands far away (the bound bites)."""
    batch = spread_batch(int(learner.engine.module.config.vocab_size))
    switch(learner, False)
    batch.old_log_probs = learner.compute_log_probs(batch)
    batch.values = learner.compute_values(batch)
    learner.update(batch)  # Adam has moments from here on (loading a state without any would keep the last)
    state, start = learner.state_dict(), weights(learner)
    step = learner.step

    switch(learner, True)
    on = learner.update(batch)
    after_on = weights(learner)

    learner.load_state_dict(state)
    switch(learner, False)
    off = learner.update(batch)
    after_off = weights(learner)

    learner.load_state_dict(state)
    learner.step = step + 1  # another seed: verl draws other mini-batches from the same rows
    learner.update(batch)
    other = weights(learner)
    learner.load_state_dict(state)
    switch(learner, True)

    moved = gap(after_on, start)
    assert moved > 1e-4, moved
    assert gap(after_on, after_off) < 1e-3 * moved, (gap(after_on, after_off), moved)
    assert gap(after_on, other) > 0.05 * moved, (gap(after_on, other), moved)
    assert on["actor/optimizer_steps"] == off["actor/optimizer_steps"] == 4
    for key in ("actor/pg_loss", "critic/vf_loss"):
        assert on[key] == pytest.approx(off[key], rel=1e-4, abs=1e-6), key
    assert on["perf/learner_train_pad_frac"] < 0.5 * off["perf/learner_train_pad_frac"], (on, off)


def test_log_probs_and_values_come_back_in_the_batch_order(
    learner: Any, model_dir: Path, tmp_path: Path
) -> None:
    """The forward-only passes run longest first and map the rows back: the same log-probs and values as
    in the batch's own order, and each row's log-probs those of a plain transformers forward of that row
    (the sorted order is far from the batch's, so rows returned as computed would not match)."""
    batch = spread_batch(int(learner.engine.module.config.vocab_size), n=11, seed=3)
    lengths = batch.attention_mask.sum(-1).tolist()
    order = infer_order(lengths, 1)
    assert order != list(range(11))
    switch(learner, True)
    logp, values = learner.compute_log_probs(batch), learner.compute_values(batch)
    switch(learner, False)
    logp_off, values_off = learner.compute_log_probs(batch), learner.compute_values(batch)
    switch(learner, True)
    assert logp.shape == (11, R) and torch.all(logp[batch.response_mask == 0] == 0)
    assert torch.allclose(logp, logp_off, atol=1e-5), (logp - logp_off).abs().max()
    assert torch.allclose(values, values_off, atol=1e-5), (values - values_off).abs().max()

    ref = hf_logprobs(learner.save_pretrained(tmp_path / "now"), batch)
    assert (logp - ref).abs().max().item() < 1e-4
    sorted_rows = torch.empty_like(logp)
    sorted_rows[: len(order)] = logp[
        torch.as_tensor(order)
    ]  # what a result left in the sorted order would be
    assert (sorted_rows - ref).abs().max().item() > 1.0


def test_a_kept_state_does_not_move_on_with_later_updates(learner: Any) -> None:
    """``state_dict`` is a snapshot: torch's optimizer kept the step tensors it was loaded with (and on CPU
    the returned moments were the live ones), so updates after a load moved a kept state on with them and
    a second load resumed with the wrong Adam step counts."""
    batch = spread_batch(int(learner.engine.module.config.vocab_size), seed=5)
    batch.old_log_probs = learner.compute_log_probs(batch)
    batch.values = learner.compute_values(batch)
    learner.update(batch)
    state = learner.state_dict()

    def flat(optimizer: dict[str, Any]) -> torch.Tensor:
        return torch.cat([t.float().flatten() for _, per in sorted(optimizer["state"].items())
                          for _, t in sorted(per.items()) if isinstance(t, torch.Tensor)])  # fmt: skip

    kept, kept_critic = flat(state["optimizer"]), flat(state["critic"]["optimizer"])
    for _ in range(2):
        learner.load_state_dict(state)
        learner.update(batch)
    assert torch.equal(flat(state["optimizer"]), kept)
    assert torch.equal(flat(state["critic"]["optimizer"]), kept_critic)
    learner.load_state_dict(state)
    again = learner.state_dict()
    assert torch.equal(flat(again["optimizer"]), kept) and torch.equal(
        flat(again["critic"]["optimizer"]), kept_critic
    )
