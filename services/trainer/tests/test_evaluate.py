"""Held-out evaluation and its reference policies: references are played on the same seeds by the pure game
core (constants the trainee seats may play, the game's bots), missing episodes count as losses, and in
service mode the trainer evaluates through the rollout driver (split "eval", the evaluation's temperature)
without ever sampling in process."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_inference.models import tiny_model
from wolfpack_trainer import evaluate as ev
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.metrics import Estimate
from wolfpack_trainer.train import Trainer


def _cfg(variant: str = "outside", seats: Sequence[int] = (1,), **over: Any) -> TrainConfig:
    data: dict[str, Any] = {
        "name": "eval",
        "game": {"id": "ultimatum_v1", "variant": variant, "bot": "heuristic"},
        "policies": [{"id": "p", "seats": list(seats), "model": "tiny"}],
        "rollout": {"episodes_per_update": 8, "group_size": 8, "max_tokens": 4, "temperature": 1.0},
        "eval": {"episodes": 64, "temperature": 0.7},
    }
    data.update(over)
    return TrainConfig.model_validate(data)


def test_references_of_the_outside_variant_need_the_offer_and_the_option() -> None:
    refs = {r.name: r.win_rate for r in ev.references(_cfg())}
    assert list(refs) == ["constant:ACCEPT", "constant:REJECT", "random", "heuristic"]
    assert all(e.n == 64 for e in refs.values())
    # every offer lies strictly on one side of the outside option: exactly one constant wins each game
    assert refs["constant:ACCEPT"].mean + refs["constant:REJECT"].mean == pytest.approx(1.0)
    assert 0.3 < refs["constant:ACCEPT"].mean < 0.7
    assert refs["heuristic"].mean == 1.0 and refs["random"].mean < 0.6


def test_easy_variant_is_won_by_always_accepting() -> None:
    """Why the demo left ``easy``: the heuristic proposer never offers below the threshold there."""
    refs = {r.name: r.win_rate.mean for r in ev.references(_cfg("easy"))}
    assert refs["constant:ACCEPT"] == 1.0 and refs["constant:REJECT"] == 0.0


def test_constants_the_seats_may_never_play_are_left_out() -> None:
    names = [r.name for r in ev.references(_cfg(seats=[0]))]  # the proposer: ACCEPT/REJECT never legal
    assert names == ["random", "heuristic"]


def test_references_of_role_policies_and_other_games() -> None:
    cfg = TrainConfig.model_validate(
        {
            "name": "ww",
            "game": {"id": "werewolf_v1", "variant": "6p", "bot": "heuristic"},
            "policies": [{"id": "wolf", "roles": ["werewolf"], "model": "tiny"}],
            "eval": {"episodes": 8},
        }
    )
    refs = ev.references(cfg)
    assert [r.name for r in refs][-2:] == ["random", "heuristic"] and all(r.win_rate.n == 8 for r in refs)
    assert all(r.name.startswith("constant:") for r in refs[:-2])


def test_missing_episodes_count_as_losses(
    trajectory_factory: Callable[..., trajectory_pb2.Trajectory],
) -> None:
    won = trajectory_factory("a", [(1, [1], [2], 1.0, "o")], policy="p")
    won.seats.add(seat=1).policy.policy_id = "p"
    rows, missing = ev.trajectory_rows([won], expected=4, policies=["p"])
    assert missing == 3 and rows == [[(1.0, True)], [(-1.0, False)], [(-1.0, False)], [(-1.0, False)]]
    reward, win = ev.summarize(rows)
    assert win.mean == 0.25 and win.n == 4 and reward.mean == pytest.approx(-0.5)


def test_summarize_split_seats_use_a_mean_interval() -> None:
    reward, win = ev.summarize([[(1.0, True), (-1.0, False)], [(1.0, True), (1.0, True)]])
    assert win.mean == 0.75 and win.n == 2 and reward.mean == 0.5


def test_reference_lines_format_and_verdict() -> None:
    cfg = _cfg()
    lines = ev.reference_lines(cfg, Estimate(0.1, 0.05, 0.2, 64), Estimate(0.9, 0.8, 0.95, 64))
    pattern = re.compile(r"^reference: (\S+) win_rate \d\.\d\d \(95% CI \d\.\d\d\.\.\d\.\d\d\)$")
    names = [m.group(1) for line in lines if (m := pattern.match(line))]
    assert names == ["initial", "constant:ACCEPT", "constant:REJECT", "random", "heuristic"]
    assert lines[-1].endswith("above constant:ACCEPT, constant:REJECT, random; not above heuristic")
    assert ev.reference_metrics(ev.references(cfg))["reference/constant_ACCEPT/win_rate_hi"] <= 1.0


class _Driver:
    """The rollout driver's ``play`` contract (tasks in, scored trajectories out, nothing on the stream),
    answering from fixed trajectories: what this test checks is what the trainer hands the driver."""

    @dataclasses.dataclass(frozen=True)
    class Sampling:
        temperature: float = 1.0

    @dataclasses.dataclass(frozen=True)
    class Config:
        sampling: _Driver.Sampling

    def __init__(self, answer: Callable[[Sequence[Any]], list[trajectory_pb2.Trajectory]]) -> None:
        self.config = _Driver.Config(_Driver.Sampling(1.0))
        self.answer = answer
        self.seen: list[Any] = []
        self.temperatures: list[float] = []

    async def play(self, tasks: Sequence[Any]) -> list[trajectory_pb2.Trajectory]:
        self.seen.extend(tasks)
        self.temperatures.append(self.config.sampling.temperature)
        return self.answer(tasks)


def test_service_mode_evaluates_through_the_driver_without_in_process_sampling(tmp_path: Path) -> None:
    tiny = str(tiny_model(tmp_path / "models"))
    cfg = _cfg(policies=[{"id": "p", "seats": [1], "model": tiny}], eval={"episodes": 6, "temperature": 0.7})
    trainer = Trainer(cfg, tmp_path / "run", "redis://unused", cache_dir=tmp_path)
    trainer.setup()

    def no_sampling() -> None:
        raise AssertionError("service-mode evaluation sampled in process")

    trainer.learners["p"].generation_model = no_sampling  # type: ignore[attr-defined]

    def answer(tasks: Sequence[Any]) -> list[trajectory_pb2.Trajectory]:
        out = []
        for i, task in enumerate(tasks[:-1]):  # the last episode "fails"
            traj = trajectory_pb2.Trajectory(trajectory_id=f"t{i}", seed=task.seed)
            traj.seats.add(seat=1).policy.policy_id = "p"
            traj.seats.add(seat=0).bot = "heuristic"
            won = i % 2 == 0
            traj.outcomes.add(
                seat=1,
                final_reward=1.0 if won else -1.0,
                outcome=common_pb2.OUTCOME_KIND_WIN if won else common_pb2.OUTCOME_KIND_LOSS,
            )
            out.append(traj)
        return out

    driver = _Driver(answer)
    trainer.driver = driver
    res = asyncio.run(trainer.evaluate())
    assert [t.seed for t in driver.seen] == ev.eval_seeds(cfg)
    assert {t.split for t in driver.seen} == {"eval"}
    assert driver.temperatures == [0.7] and driver.config.sampling.temperature == 1.0  # restored
    assert (
        res.failed == 1 and res.win_rate.n == 6 and res.win_rate.mean == pytest.approx(3 / 6)
    )  # 3 of 5 played won, 1 failed
    row = trainer.metrics.rows()[-1]
    assert row["eval/failed_episodes"] == 1.0 and "reference/constant_ACCEPT/win_rate" in row


def test_local_mode_refuses_a_learner_that_cannot_sample(tmp_path: Path) -> None:
    tiny = str(tiny_model(tmp_path / "models"))
    cfg = _cfg(policies=[{"id": "p", "seats": [1], "model": tiny}], eval={"episodes": 2})
    trainer = Trainer(cfg, tmp_path / "run", "redis://unused", cache_dir=tmp_path)
    trainer.setup()

    class NoSampler:
        pass

    trainer.learners["p"] = NoSampler()  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="cannot evaluate them"):
        asyncio.run(trainer.evaluate())


VILLAGE = ["villager", "seer", "witch"]


def _selfplay(**eval_section: Any) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "name": "ww-selfplay",
            "game": {"id": "werewolf_v1", "variant": "6p", "bot": "heuristic"},
            "policies": [{"id": "shared", "roles": ["werewolf", *VILLAGE], "model": "tiny"}],
            "rollout": {"episodes_per_update": 8, "group_size": 8},
            "eval": {"episodes": 24, **eval_section},
        }
    )


def test_eval_roles_seat_a_self_play_policy_on_one_side_against_the_bot() -> None:
    """``eval.roles``: the held-out games (the policy's, the base model's, the references') bind the
    self-play policy to the village only, the wolves are ``game.bot``; training keeps every role."""
    from wolfpack_games import make_game
    from wolfpack_trainer.train import held_out_plan, plan_tasks, service_task

    cfg = _selfplay(roles={"shared": VILLAGE})
    seeds = ev.eval_seeds(cfg)
    held_out = held_out_plan(cfg, seeds)
    assert {tuple(sorted(t.trainee_roles)) for t in held_out} == {tuple(sorted(VILLAGE))}
    training = plan_tasks(cfg, [0], 8, "u0")
    assert set(training[0].trainee_roles) == {"werewolf", *VILLAGE}
    for i, task in enumerate(held_out):
        env = make_game("werewolf_v1", "6p")
        env.start(seed=task.seed)
        village = {s for s in env.possible_agents if env.role(s) != "werewolf"}
        assert set(service_task(task, i).trainee_seats) == village  # the wolves are scripted
    # the references play the same seats: exactly what a village-only policy's references are
    village_only = TrainConfig.model_validate(
        {
            **cfg.model_dump(),
            "policies": [{"id": "v", "roles": VILLAGE, "model": "tiny"}],
            "eval": {"episodes": 24},
        }
    )
    ours = {r.name: r.win_rate for r in ev.references(cfg)}
    assert ours == {r.name: r.win_rate for r in ev.references(village_only)}
    # and differ from the self-play references over every seat (the heuristic village wins some games only)
    every_seat = {r.name: r.win_rate for r in ev.references(_selfplay())}
    assert ours["heuristic"] != every_seat["heuristic"]


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        ({"nobody": VILLAGE}, "no trained policy 'nobody'"),
        ({"shared": []}, "give roles for a policy that trains by roles"),
        ({"shared": ["hunter"]}, "role 'hunter' is not dealt"),
    ],
)
def test_eval_roles_are_checked(roles: dict[str, list[str]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _selfplay(roles=roles)


def test_eval_roles_may_not_give_one_role_to_two_policies() -> None:
    with pytest.raises(ValueError, match="role 'werewolf' is both policy wolves's and village's"):
        TrainConfig.model_validate(
            {
                "name": "two",
                "game": {"id": "werewolf_v1", "variant": "6p", "bot": "heuristic"},
                "policies": [
                    {"id": "wolves", "roles": ["werewolf"], "model": "tiny"},
                    {"id": "village", "roles": VILLAGE, "model": "tiny"},
                ],
                "eval": {"roles": {"village": ["werewolf"]}},
            }
        )


def test_eval_roles_of_a_seat_policy_are_refused() -> None:
    with pytest.raises(ValueError, match=r"give roles for a policy that trains by roles \(it trains seats"):
        _cfg(eval={"roles": {"p": ["proposer"]}})


def test_service_mode_evaluation_hands_the_driver_the_evaluation_roles(tmp_path: Path) -> None:
    from wolfpack_games import make_game

    tiny = str(tiny_model(tmp_path / "models"))
    cfg = _selfplay(roles={"shared": VILLAGE}, episodes=4)
    cfg = TrainConfig.model_validate(
        {**cfg.model_dump(), "policies": [{**cfg.policies[0].model_dump(), "model": tiny}]}
    )
    trainer = Trainer(cfg, tmp_path / "run", "redis://unused", cache_dir=tmp_path)
    trainer.setup()
    driver = _Driver(lambda tasks: [])
    trainer.driver = driver
    res = asyncio.run(trainer.evaluate())
    assert res.failed == 4 and len(driver.seen) == 4
    for task in driver.seen:
        env = make_game("werewolf_v1", "6p")
        env.start(seed=task.seed)
        assert set(task.trainee_seats) == {s for s in env.possible_agents if env.role(s) != "werewolf"}
