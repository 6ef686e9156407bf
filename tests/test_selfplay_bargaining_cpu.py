"""The self-play bargaining recipe (``configs/gpu-scenarios-selfplay-lora-smollm2.yaml``) on CPU: one GRPO
group of self-play episodes in which two games end in a deal and two do not gives the group different
rewards, non-zero advantages for *both* roles and a non-zero gradient, where the old default spec left the
buyer's group all equal (the H100 collapse: bench/results/2026-11-27-h100-selfplay-lora.md).

What is real: the recipe file (loaded with overrides that only change where and how big: the tiny model, the
``cpu`` learner with the recipe's LoRA rank, local rollouts, one group of 4, cropped prompts for the tiny
model's 512 positions, no warm start), the bargaining engine and session rules, the rollout driver, the
reward spec the recipe names, the trainer's batch, GRPO advantages and LoRA update with the KL term to the
adapter-free base. The one stand-in is the policy's *choice* of words: a scripted answer per prompt (the two
opening bids, ACCEPT of a standing bid, chat otherwise), so that a deal and a no-deal are in one group for
certain; its tokens are scored by the learner's own model (teacher forcing at the rollout temperature), so
the sampler log-probs are the ones the learner recomputes. The full recipe, warm start and evaluation
included, runs for one update in tests/test_gpu_recipes_cpu.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

pytest.importorskip("transformers", reason="the trainer extra is not installed")

import torch

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_games.scenarios import generate_scenario
from wolfpack_rewards import score
from wolfpack_trainer import algos
from wolfpack_trainer.batch import build_samples, collate, split_by_policy
from wolfpack_trainer.config import TrainConfig, load_config
from wolfpack_trainer.local_rollout import Generated
from wolfpack_trainer.train import Trainer, service_task

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "gpu-scenarios-selfplay-lora-smollm2.yaml"
SEED = 7  # medium: buyer target 203 / reservation 213, seller target 198 / reservation 187; buyer first
GROUP = 4
DEALS = 2  # the first two opening moves bid; the other two games chat to the turn limit


def cpu_config() -> TrainConfig:
    over: list[str] = []
    for i in range(2):
        over += [
            f"policies.{i}.learner=cpu",
            f"policies.{i}.model=tiny",
            f"policies.{i}.device=cpu",
            f"policies.{i}.micro_batch_size=8",
            f"policies.{i}.extra={{}}",
        ]
    over += [
        "rollout.mode=local",
        f"rollout.group_size={GROUP}",
        f"rollout.episodes_per_update={GROUP}",
        "rollout.max_tokens=16",
        "rollout.max_prompt_tokens=256",
        "inference={}",
        "warmstart=null",
        "train.updates=1",
        "train.max_minutes=0",
    ]
    return load_config(RECIPE, over)


def test_the_recipe_is_the_fixed_one() -> None:
    """What the GPU run will use: the no-deal-pricing spec, a KL anchor, the lower rate, LoRA on both seats
    of one shared policy (so the KL reference is the clone under the adapter)."""
    cfg = load_config(RECIPE)
    assert cfg.rollout.reward_spec == "bargaining_selfplay@1"
    assert cfg.loss_config().kl_coef > 0
    assert all(p.lr == 3.0e-5 and p.lora_rank > 0 for p in cfg.policies)
    assert cfg.train.share_policy and sorted(s for p in cfg.policies for s in p.seats) == [0, 1]
    assert cfg.batch_config().group_by == ("group", "role")


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> tuple[Trainer, list[trajectory_pb2.Trajectory], int]:
    root = tmp_path_factory.mktemp("selfplay")
    cfg = cpu_config()
    trainer = Trainer(cfg, root / "run", "redis://unused", cache_dir=root / "models")
    trainer.setup()
    scenario = generate_scenario("bargaining", SEED, "medium")
    price = scenario.private_int(0, "reservation")  # the buyer's draw, the seller's win
    assert scenario.private_int(0, "target") < price and price >= scenario.private_int(1, "target")
    tok = trainer.tokenizer
    eos = int(tok.eos_token_id)
    model: Any = trainer.learners["buyer"].model  # type: ignore[attr-defined]  # the cpu learner's peft model
    openings = 0

    def answer(prompt: str) -> str:
        nonlocal openings
        if "Standing bid:" in prompt:
            return "Agreed.\nACCEPT"
        if "Nobody has spoken yet." in prompt:
            openings += 1
            if openings <= DEALS:
                return f"FINAL_BID: {price}"
        return "Let's talk about it."

    @torch.no_grad()
    def policy(
        policy_id: str, prompts: list[list[int]], sampling: common_pb2.SamplingParams
    ) -> list[Generated]:
        out = []
        for ids in prompts:
            resp = [*tok(answer(tok.decode(ids)), add_special_tokens=False)["input_ids"], eos]
            logits = model(input_ids=torch.tensor([ids + resp])).logits[0, len(ids) - 1 : -1].float()
            logp = torch.log_softmax(logits / sampling.temperature, -1)
            lps = logp.gather(-1, torch.tensor(resp).unsqueeze(-1)).squeeze(-1).tolist()
            out.append(Generated(resp, lps, common_pb2.FINISH_REASON_STOP))
        return out

    served = [service_task(t, i) for i, t in enumerate(trainer.tasks([SEED], GROUP, "u0"))]
    trajs = trainer._play_in_process(served, cfg.rollout.temperature, policy, lambda: trainer.state.versions)
    return trainer, trajs, price


def finals(traj: trajectory_pb2.Trajectory) -> dict[int, float]:
    return {o.seat: round(o.final_reward, 6) for o in traj.outcomes}


def advantages(trainer: Trainer, trajs: list[trajectory_pb2.Trajectory]) -> dict[str, torch.Tensor]:
    """Per policy (buyer, seller): the GRPO advantage of each sample, as the update computes them."""
    samples = build_samples(trajs, trainer.cfg.batch_config())
    out = {}
    for pid, own in split_by_policy(samples).items():
        assert len({s.uid for s in own}) == 1, "one seed, one role: one GRPO group"
        adv = algos.compute_advantages(collate(own), own, trainer.cfg.algo_config())
        out[pid] = adv.advantages.sum(-1)  # per sample (token advantages are zero outside the response)
    return out


def test_one_group_holds_deals_and_no_deals(played: tuple[Trainer, list[Any], int]) -> None:
    _, trajs, price = played
    assert len(trajs) == GROUP and len({t.group_id for t in trajs}) == 1
    assert all(t.reward_spec == "bargaining_selfplay@1" for t in trajs)
    deals = [t for t in trajs if t.metadata["reward.verifier"].startswith(f"deal at {price}")]
    walked = [t for t in trajs if t.metadata["reward.verifier"].startswith("no deal (turn limit reached)")]
    assert len(deals) == DEALS and len(walked) == GROUP - DEALS
    # every turn the policy's, both seats, all valid: the rewards are the outcome and the no-deal price alone
    assert all(t.policy.policy_id in ("buyer", "seller") and t.valid for tr in trajs for t in tr.turns)
    assert [finals(t) for t in deals] == [{0: 0.0, 1: 1.0}] * DEALS  # buyer's draw, seller's win
    assert [finals(t) for t in walked] == [{0: -0.5, 1: -0.5}] * (GROUP - DEALS)


def test_both_roles_get_an_advantage_where_the_old_spec_gave_the_buyer_none(
    played: tuple[Trainer, list[Any], int],
) -> None:
    trainer, trajs, _ = played
    ours = advantages(trainer, trajs)
    assert set(ours) == {"buyer", "seller"}
    for pid, adv in ours.items():
        assert adv.abs().max() > 0.1, pid
    # The same games under scenario_shaped@1: the buyer's deal (a draw) and its no-deal (a draw) both score
    # 0, so its group is all equal and GRPO gives it nothing; only the seller's win differs.
    old = [score(t, "scenario_shaped@1").trajectory for t in trajs]
    assert {finals(t)[0] for t in old} == {0.0}
    theirs = advantages(trainer, old)
    assert theirs["buyer"].abs().max() == 0
    assert theirs["seller"].abs().max() > 0.1


def test_the_update_has_a_gradient_and_a_kl_term(played: tuple[Trainer, list[Any], int]) -> None:
    trainer, trajs, _ = played
    # share_policy: one learner, one LoRA adapter (the cpu learner's peft model)
    assert trainer.learners["buyer"] is trainer.learners["seller"]
    learner = cast(Any, trainer.learners["buyer"])
    lora = {n: p.detach().clone() for n, p in learner.model.named_parameters() if "lora_" in n}
    assert lora
    step = learner.step
    metrics = trainer.train_step(trajs)
    # one update of the shared learner over both roles' samples; its metrics once, the advantages' per role
    assert learner.step == step + 1
    assert metrics["actor/grad_norm"] > 0 and "actor/kl_loss" in metrics
    assert not any(k.endswith("/actor/grad_norm") for k in metrics)
    assert all(f"{pid}/adv/grpo_groups" in metrics for pid in ("buyer", "seller"))
    # The sampler log-probs are the learner's own (teacher-forced with its weights before the update), and
    # the one old-log-prob pass runs before any step: exact for both roles' rows.
    mismatch = metrics["mismatch/max_abs_logprob_diff"]
    assert mismatch < 1e-3, mismatch
    moved = [n for n, p in learner.model.named_parameters() if "lora_" in n and not torch.equal(p, lora[n])]
    assert moved, "the adapter did not move"
    base = [p for n, p in learner.model.named_parameters() if "lora_" not in n]
    assert all(not p.requires_grad for p in base), "only the adapter trains; the KL reference is the base"
