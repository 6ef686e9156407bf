"""One seed is one game: the trainer's local mode (the rollout driver over the in-process environment,
``local_rollout.local_driver``) and its service mode (the same curriculum ``Task`` from ``service_task``,
created and played on a real environment gRPC server the way the rollout driver creates it) give the
scripted seats the same moves, so given the same trainee moves every trainee observation and every seat's
outcome are equal.

Why it can fail: the scripted bots draw from an RNG; if local play seeded it differently from the
environment's session (it used ``seed * 7919 + 1``), or bound seats, roles or options differently, the
bots would play other moves and the observations would differ at the first random move. The trainee's
moves are a pure function of what it observes (some valid, some not, so re-prompts and defaults happen
in both). The tokenizer is a lookup table (one id per distinct text) so that the local path's prompts
and answers carry the texts exactly; game, engine, bots, server and seat bindings are the real ones."""

from __future__ import annotations

import dataclasses
import hashlib
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as env_pb
from wolfpack_environment.client import EnvironmentClient
from wolfpack_environment.server import EnvironmentServicer, register
from wolfpack_environment.sessions import EpisodeManager, Limits
from wolfpack_rollout.client import RolloutConfig
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.local_rollout import Generated, local_driver
from wolfpack_trainer.train import plan_tasks, service_task

MOVES = {
    "ultimatum_v1": ["ACCEPT", "REJECT", "Let me think.", "ACCEPT please", "OFFER: 3"],
    "werewolf_v1": ["pass", "I vote for 1", "vote 2", "I think seat 3 is a wolf.", "target 0", "", "save"],
}


def trainee_move(game_id: str, observation: str) -> str:
    """A fixed answer per observation (the same in both modes)."""
    options = MOVES[game_id]
    return options[int(hashlib.sha256(observation.encode()).hexdigest(), 16) % len(options)]


class TableTokenizer:
    """Texts as single ids: ``apply_chat_template`` gives the observation's id, ``decode`` its text."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.ids: dict[str, int] = {}

    def id_of(self, text: str) -> int:
        if text not in self.ids:
            self.ids[text] = len(self.texts)
            self.texts.append(text)
        return self.ids[text]

    def apply_chat_template(self, messages: list[dict[str, str]], **_: Any) -> list[int]:
        return [self.id_of(messages[-1]["content"])]

    def decode(self, ids: list[int], **_: Any) -> str:
        return "".join(self.texts[i] for i in ids)


def config(game: dict[str, Any], policies: list[dict[str, Any]]) -> TrainConfig:
    return TrainConfig.model_validate(
        {"name": "same-game", "seed": 0, "game": game, "policies": policies,
         "rollout": {"mode": "service", "episodes_per_update": 4, "group_size": 1}}
    )  # fmt: skip


CASES = {
    "ultimatum-random-proposer": config(
        {"id": "ultimatum_v1", "variant": "easy", "bot": "random"}, [{"id": "responder", "seats": [1]}]
    ),
    "werewolf-6p-roles": config(
        {"id": "werewolf_v1", "variant": "6p", "bot": "random"}, [{"id": "gods", "roles": ["seer", "witch"]}]
    ),
    "werewolf-9p-options-zh": config(
        {
            "id": "werewolf_v1",
            "variant": "9p",
            "bot": "heuristic",
            "language": "zh",
            "options": {"wolf_king": True, "tie_rule": "no_exile", "discussion_rounds": 2},
        },
        [{"id": "village", "roles": ["villager", "hunter"]}],
    ),
}


@pytest.fixture
async def env_client() -> AsyncIterator[EnvironmentClient]:
    servicer = EnvironmentServicer(EpisodeManager(Limits(max_episodes=50)), scenario_store="")
    settings = load_settings(rpc_timeout_s=20)
    server = await rpc.start_server("environment", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    async with EnvironmentClient(f"127.0.0.1:{server.port}", settings) as client:
        yield client
    servicer.manager.close_all()
    await server.stop(0)


async def play_locally(cfg: TrainConfig, task: Any) -> tuple[dict[int, list[str]], dict[int, int]]:
    tok = TableTokenizer()

    def policy(_policy_id: str, prompts: list[list[int]], _sampling: Any) -> list[Generated]:
        out = []
        for ids in prompts:
            move = trainee_move(cfg.game.id, tok.decode(ids)) or " "
            out.append(Generated([tok.id_of(move)], [0.0], common_pb2.FINISH_REASON_STOP))
        return out

    versions = {p.id: 0 for p in cfg.policies}
    # prompt_mode full: the prompt is the observation text itself, which the scripted trainee answers
    driver = local_driver(
        RolloutConfig(prompt_mode="full", max_turns=2000, language=cfg.game.language),
        tok,
        policy,
        lambda: versions,
    )
    (traj,) = await driver.play([service_task(task, 0)])
    seen: dict[int, list[str]] = defaultdict(list)
    for turn in traj.turns:
        if turn.policy.policy_id:  # a trainee decision (scenario games also record the bots' messages)
            seen[turn.seat].append(turn.observation_text)
    assert traj.outcomes and all(o.outcome != common_pb2.OUTCOME_KIND_ABORTED for o in traj.outcomes)
    return dict(seen), {o.seat: int(o.outcome) for o in traj.outcomes}


async def play_through_the_service(
    cfg: TrainConfig, task: Any, client: EnvironmentClient
) -> tuple[dict[int, list[str]], dict[int, int]]:
    cur = service_task(task, 0)
    req = env_pb.CreateEpisodeRequest(
        game=cur.game,
        seed=cur.seed,
        seats=list(cur.seats),
        language=cfg.game.language,
        options=dict(cur.options),
    )  # what the rollout driver sends for a Task
    created = await client.stub.CreateEpisode(req)
    seen: dict[int, list[str]] = defaultdict(list)

    def decide(obs: env_pb.Observation) -> str:
        seen[obs.seat].append(obs.text)
        return trainee_move(cfg.game.id, obs.text) or " "

    tokens = {t.seat: t.token for t in created.seat_tokens}
    await client.play_seats([(created.episode_id, s, tokens[s]) for s in cur.trainee_seats], decide)
    state = await client.get_episode(created.episode_id, created.admin_token)
    assert state.done
    return dict(seen), {s.seat: int(s.outcome) for s in state.seats}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_same_seed_plays_the_same_game_in_local_and_service_mode(
    case: str, env_client: EnvironmentClient
) -> None:
    cfg = CASES[case]
    differing_games = 0
    for task in plan_tasks(cfg, [0, 1, 2, 7], 1, "u0"):
        local_seen, local_outcomes = await play_locally(cfg, task)
        service_seen, service_outcomes = await play_through_the_service(cfg, task, env_client)
        assert set(local_seen) == set(service_seen) and local_seen, f"{case} seed {task.seed}: trainee seats"
        for seat, observations in local_seen.items():
            assert service_seen[seat] == observations, f"{case} seed {task.seed} seat {seat}"
        assert service_outcomes == local_outcomes, f"{case} seed {task.seed}"
        other, _ = await play_locally(cfg, dataclasses.replace(task, seed=task.seed + 100))
        differing_games += other != local_seen
    assert differing_games == 4  # the seed matters: another seed is another game


def _comparable(traj: Any) -> Any:
    """The trajectory without what differs between any two plays of one game: ids, times, trace, worker."""
    out = type(traj)()
    out.CopyFrom(traj)
    for name in ("trajectory_id", "episode_id", "trace", "started_at", "finished_at", "score_ms"):
        out.ClearField(name)
    for turn in out.turns:
        turn.ClearField("started_at")
        turn.generate_ms = 0.0
    out.metadata.pop("worker_id", None)
    return out


@pytest.mark.parametrize("case", ["ultimatum-random-proposer", "werewolf-6p-roles"])
async def test_in_process_backends_give_the_services_trajectories(
    case: str, env_client: EnvironmentClient
) -> None:
    """The whole ``Trajectory`` proto: the driver over the in-process environment and reward (local mode)
    and the same driver over the real environment and reward servers give equal protos (turns with their
    token ids, logprobs, validity, applied actions; outcomes; rewards and the spec's notes) for the same
    seeds and answers, ids and times aside. Inference is the same scripted policy in both."""
    from wolfpack_reward.server import register as register_reward
    from wolfpack_rollout.client import RolloutDriver
    from wolfpack_trainer.local_rollout import LocalInference

    cfg = CASES[case]
    tok = TableTokenizer()

    def policy(_policy_id: str, prompts: list[list[int]], _sampling: Any) -> list[Generated]:
        moves = [trainee_move(cfg.game.id, tok.decode(ids)) or " " for ids in prompts]
        return [Generated([tok.id_of(m)], [-0.5], common_pb2.FINISH_REASON_STOP) for m in moves]

    versions = {p.id: 2 for p in cfg.policies}
    config = RolloutConfig(prompt_mode="full", max_turns=2000, language=cfg.game.language)
    tasks = [service_task(t, i) for i, t in enumerate(plan_tasks(cfg, [0, 1, 2, 7], 1, "u0"))]
    local = await local_driver(config, tok, policy, lambda: versions).play(tasks)
    settings = load_settings(rpc_timeout_s=20)
    reward = await rpc.start_server("reward", register_reward, settings, "127.0.0.1:0")
    try:
        async with rpc.channel(f"127.0.0.1:{reward.port}", settings) as channel:
            served = await RolloutDriver(
                config, environment=env_client, reward_channel=channel,
                inference=LocalInference(tok, policy, lambda: versions),
            ).play(tasks)  # fmt: skip
    finally:
        await reward.stop(0)
    assert len(local) == len(served) == len(tasks)
    for a, b in zip(local, served, strict=True):
        assert any(t.response_token_ids for t in a.turns) and a.reward_spec
        assert _comparable(a) == _comparable(b), f"{case} seed {a.seed}"
