"""``eval.vs_bot``: with co-trained policies, every evaluation also plays each policy alone against
``game.bot`` in the other policies' seats, with that setting's references and a ``learning vs-bot`` line;
the scores survive a resume (the first evaluation is the lines' left side)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from wolfpack_trainer import evaluate as ev
from wolfpack_trainer.config import ConfigError, load_config
from wolfpack_trainer.train import (
    EvalResult,
    _eval_from_json,
    _eval_to_json,
    held_out_plan,
    run_training,
    vs_bot_lines,
)

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
IPPO = CONFIGS / "ippo-ultimatum.yaml"


def test_vs_bot_needs_several_policies_and_no_replaces() -> None:
    assert load_config(IPPO, ["eval.vs_bot=true"]).eval.vs_bot
    with pytest.raises(ConfigError, match="two or more trained policies"):
        load_config(CONFIGS / "demo-ultimatum-local.yaml", ["eval.vs_bot=true"])
    with pytest.raises(ConfigError, match="use one of them"):
        load_config(IPPO, ["eval.vs_bot=true", "eval.replaces=[responder]"])


def test_each_policy_alone_gets_the_bot_in_the_other_seats_and_its_own_references() -> None:
    cfg = load_config(IPPO, ["eval.vs_bot=true", "eval.episodes=16"])
    seeds = ev.eval_seeds(cfg)
    for pid, seat in (("proposer", 0), ("responder", 1)):
        alone = ev.vs_bot_config(cfg, pid)
        assert not alone.eval.vs_bot and cfg.eval.vs_bot  # a copy: the run's config is untouched
        plan = held_out_plan(alone, seeds)
        assert all(dict(t.trainee_seats) == {seat: pid} and t.bot == "heuristic" for t in plan)
    pair = {r.name: r.reward for r in ev.references(cfg)}
    proposer = {r.name: r.reward for r in ev.references(ev.vs_bot_config(cfg, "proposer"))}
    assert "heuristic" in proposer and proposer != pair  # the proposer's seat alone, not the pair's two


def test_scores_round_trip_through_the_checkpoint_state() -> None:
    est = ev.Estimate(0.25, 0.1, 0.4, 16)
    res = EvalResult(3, est, est, vs_bot={"proposer": ev.PolicyScore(est, est)})
    back = EvalResult(**_eval_from_json(_eval_to_json(res)))
    assert back.vs_bot == res.vs_bot
    assert EvalResult(**_eval_from_json(_eval_to_json(EvalResult(3, est, est)))).vs_bot == {}


@pytest.mark.slow
def test_a_run_scores_each_policy_against_the_bot(
    redis_url: str, tmp_path: Path, held_out_plans: list[list[str]]
) -> None:
    """A real in-process IPPO run (tiny model, one update): both evaluations play the pair, then each policy
    alone (the bot in the other seat: the held-out plans it asked for say so), log ``eval_vs_bot/<policy>/``
    and at update 0 that setting's references, and the summary gets each policy's vs-bot block."""
    cfg = load_config(IPPO, [
        "eval.vs_bot=true", "eval.episodes=8", "eval.every=1", "train.updates=1",
        "rollout.episodes_per_update=8", "warmstart.episodes=8", "warmstart.steps=2",
        f"stream.name=test:vs-bot:{os.getpid()}:{time.monotonic_ns()}",
    ])  # fmt: skip
    trainer, evals = run_training(cfg, tmp_path / "run", redis_url, tmp_path / "cache")
    assert [e.step for e in evals] == [0, 1]
    # update 0: the base models (eval.base, on with the warm start), then per evaluation the pair, the
    # proposer alone (the responder replaced by the bot), the responder alone
    assert held_out_plans == [[], *[[], ["responder"], ["proposer"]] * 2]
    for e in evals:
        assert set(e.vs_bot) == {"proposer", "responder"}
        assert all(s.reward.n == 8 for s in e.vs_bot.values())
    rows = trainer.metrics.rows()
    at = {step: {k: v for r in rows if r["step"] == step for k, v in r.items()} for step in (0, 1)}
    for pid in ("proposer", "responder"):
        assert at[1][f"eval_vs_bot/{pid}/reward_mean"] == evals[1].vs_bot[pid].reward.mean
        heuristic = next(r for r in ev.references(ev.vs_bot_config(cfg, pid)) if r.name == "heuristic")
        assert at[0][f"reference_vs_bot/{pid}/heuristic/reward_mean"] == heuristic.reward.mean
        assert f"reference_vs_bot/{pid}/heuristic/reward_mean" not in at[1]  # measured once
    lines = vs_bot_lines(cfg, evals[0], evals[-1])
    assert any(line.startswith("vs-bot[proposer] reference: heuristic win_rate") for line in lines), lines
    learned = [line for line in lines if line.startswith("learning vs-bot[")]
    assert [line.split(":")[0] for line in learned] == [
        "learning vs-bot[proposer]",
        "learning vs-bot[responder]",
    ]
    assert "on 8 held-out episodes" in learned[0]
