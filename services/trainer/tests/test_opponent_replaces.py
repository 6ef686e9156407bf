"""``rollout.opponents[].replaces``: a self-play run (its policies take every seat) plays a share of its
groups against a fixed opponent by handing a trained policy's seats to the entry's bot or served policy in
those groups. Planned per group with the run's seeded RNG; the held-out games never mix; a replaced policy
trains on nothing from those groups, and a shared learner still updates when a batch holds one role only."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from wolfpack_trainer.config import ConfigError, load_config
from wolfpack_trainer.train import held_out_plan, plan_tasks, run_training, service_task

RECIPE = Path(__file__).resolve().parents[3] / "configs" / "gpu-scenarios-selfplay-lora-smollm2.yaml"
MIX = "rollout.opponents=[{bot: heuristic, fraction: 0.3, replaces: [seller]}]"


def test_a_share_of_groups_hands_the_sellers_seat_to_the_bot() -> None:
    cfg = load_config(RECIPE, [MIX])
    tasks = plan_tasks(cfg, list(range(200)), 2, "u0")
    by_group: dict[str, set[tuple[tuple[int, str], ...]]] = {}
    for t in tasks:
        by_group.setdefault(t.group_id, set()).add(tuple(sorted(t.trainee_seats.items())))
    assert all(len(v) == 1 for v in by_group.values())  # a group is one arrangement
    kinds = Counter(next(iter(v)) for v in by_group.values())
    assert set(kinds) == {((0, "buyer"),), ((0, "buyer"), (1, "seller"))}
    assert 40 <= kinds[((0, "buyer"),)] <= 80  # 30 % of 200 groups, drawn
    replaced = next(t for t in tasks if 1 not in t.trainee_seats)
    assert replaced.bot == "heuristic"
    bound = service_task(replaced, 0)
    assert set(bound.trainee_seats) == {0} and bound.opponent_id == "scripted:heuristic"
    assert plan_tasks(cfg, list(range(200)), 2, "u0") == tasks  # the same plan in every process
    held_out = held_out_plan(cfg, [1_000_000 + i for i in range(64)])
    assert all(dict(t.trainee_seats) == {0: "buyer", 1: "seller"} for t in held_out)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.opponents=[{bot: heuristic, fraction: 0.2}]", "take every seat.*give the entry replaces"),
        (
            "rollout.opponents=[{bot: heuristic, fraction: 0.2, replaces: [nobody]}]",
            r"replaces \['nobody'\]: no such",
        ),
        (
            "rollout.opponents=[{bot: heuristic, fraction: 0.2, replaces: [buyer, seller]}]",
            "replaces every trained",
        ),
        ("eval.replaces=[nobody]", r"eval.replaces \['nobody'\]: no such trained policy"),
        ("eval.replaces=[buyer, seller]", "measures nothing"),
    ],
)
def test_replaces_is_checked(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(RECIPE, [override])


@pytest.mark.slow
def test_a_shared_learner_updates_on_groups_where_one_role_met_the_bot(
    redis_url: str, tmp_path: Path
) -> None:
    """Every group replaced (fraction 1): the shared learner's one update holds buyer samples only, and the
    run goes on (the seller's policy id gets no rows)."""
    over: list[str] = []
    for i in range(2):
        over += [f"policies.{i}.learner=cpu", f"policies.{i}.model=tiny", f"policies.{i}.device=cpu",
                 f"policies.{i}.micro_batch_size=8", f"policies.{i}.mini_batch_size=8", f"policies.{i}.extra={{}}"]  # fmt: skip
    over += [
        "rollout.opponents=[{bot: heuristic, fraction: 1.0, replaces: [seller]}]",
        "rollout.mode=local", "rollout.group_size=2", "rollout.episodes_per_update=4", "rollout.max_tokens=6",
        "rollout.max_prompt_tokens=96", "inference={}", "warmstart=null", "train.updates=1",
        "train.max_minutes=0", "eval.every=1", "eval.episodes=2",
        f"stream.name=test:replaces:{os.getpid()}:{time.monotonic_ns()}",
    ]  # fmt: skip
    cfg = load_config(RECIPE, over)
    trainer, evals = run_training(cfg, tmp_path / "run", redis_url, tmp_path / "cache")
    assert trainer.state.step == 1 and [e.step for e in evals] == [0, 1]
    rows: list[dict[str, Any]] = trainer.metrics.rows()
    update = next(r for r in rows if "batch/samples" in r)
    assert update["batch/samples"] > 0
    # the training episodes' per-policy outcome charts: the buyer played, the seller's seat was the bot's
    assert "charts/buyer/buyer/win_rate" in update, sorted(update)
    assert not any(k.startswith("charts/seller/") for k in update), sorted(update)


def test_eval_replaces_scores_the_buyer_against_the_heuristic_seller() -> None:
    """``eval.replaces``: the held-out games give the seller's seat to ``game.bot``; training keeps both
    seats, and the references are exactly those of a buyer-only run."""
    from wolfpack_trainer import evaluate as ev

    cfg = load_config(RECIPE, ["eval.replaces=[seller]", "eval.vs_bot=false"])  # the recipe sets vs_bot
    held_out = held_out_plan(cfg, ev.eval_seeds(cfg))
    assert all(dict(t.trainee_seats) == {0: "buyer"} and t.bot == "heuristic" for t in held_out)
    assert all(dict(t.trainee_seats) == {0: "buyer", 1: "seller"} for t in plan_tasks(cfg, [0, 1], 8, "u0"))
    buyer_only = load_config(
        RECIPE,
        [
            "policies=[{id: buyer, seats: [0], learner: cpu, model: tiny}]",
            "train.share_policy=false",
            "eval.vs_bot=false",
        ],
    )
    ours = {r.name: r.win_rate for r in ev.references(cfg)}
    assert ours == {r.name: r.win_rate for r in ev.references(buyer_only)}
    assert ours != {r.name: r.win_rate for r in ev.references(load_config(RECIPE))}  # both seats: the pair


@pytest.mark.slow
def test_an_evaluation_only_run_scores_one_seat_against_the_bot(redis_url: str, tmp_path: Path) -> None:
    """A real local-mode evaluation of the self-play recipe with the seller's seat replaced: it plays, scores
    the buyer alone (no per-policy seller keys), and its kept episodes have the bot in seat 1."""
    from wolfpack.v1 import trajectory_pb2
    from wolfpack_trainer import evaluate as ev

    over: list[str] = []
    for i in range(2):
        over += [f"policies.{i}.learner=cpu", f"policies.{i}.model=tiny", f"policies.{i}.device=cpu",
                 f"policies.{i}.micro_batch_size=8", f"policies.{i}.mini_batch_size=8", f"policies.{i}.extra={{}}"]  # fmt: skip
    over += [
        "eval.replaces=[seller]", "eval.vs_bot=false", "rollout.mode=local", "rollout.max_tokens=6", "rollout.max_prompt_tokens=96",
        "inference={}", "warmstart=null", "train.updates=0", "eval.episodes=4",
        f"stream.name=test:eval-replaces:{os.getpid()}:{time.monotonic_ns()}",
    ]  # fmt: skip
    cfg = load_config(RECIPE, over)
    trainer, evals = run_training(cfg, tmp_path / "run", redis_url, tmp_path / "cache")
    assert [e.step for e in evals] == [0] and evals[0].win_rate.n == 4 and evals[0].failed == 0
    assert evals[0].policies == {}  # one scored policy: the overall estimate is the buyer's
    row: dict[str, Any] = {k: v for r in trainer.metrics.rows() for k, v in r.items()}
    assert not any(k.startswith(("eval/seller", "eval/buyer")) for k in row), sorted(row)
    kept = sorted(ev.episodes_dir(tmp_path / "run", 0).glob("episode_*.pb"))
    assert kept
    for path in kept:
        traj = trajectory_pb2.Trajectory.FromString(path.read_bytes())
        bound = {b.seat: (b.policy.policy_id, b.bot) for b in traj.seats}
        assert bound[0][0] == "buyer" and bound[1] == ("", "heuristic"), bound
