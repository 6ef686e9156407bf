"""The verl AgentLoop plug-in over the real environment gRPC server, with a fake LLM server handle.

The fake stands in for verl's ``LLMServerClient`` (the only fake here): it reads the legal actions out of
the prompt it is given (decoded with the real tiny-model tokenizer) and answers one, so games are played
to their end by the real Werewolf engine and scored by the real reward specs (``wolfpack_rewards``, in
process, as the loop does). verl's own ``AgentLoopBase`` and its continuous-token builder do the
tokenisation.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("verl.experimental.agent_loop.agent_loop", reason="verl (trainer extra) is not installed")

from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_environment.client import EnvironmentClient
from wolfpack_environment.server import EnvironmentServicer
from wolfpack_environment.server import register as register_environment
from wolfpack_environment.sessions import EpisodeManager
from wolfpack_inference.models import tiny_model
from wolfpack_rollout.client import RolloutConfig, RolloutDriver, SamplingConfig, new_lines
from wolfpack_trainer.learners.verl.agent_loop import (
    AGENT_NAME,
    CONFIG_PATH,
    EpisodeSpec,
    WolfpackAgentLoop,
    agent_output_tokens,
    close_channels,
    dataset_rows,
    episode_task,
)
from wolfpack_trainer.local_rollout import LocalReward

WIN, LOSS = common_pb2.OUTCOME_KIND_WIN, common_pb2.OUTCOME_KIND_LOSS


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model(tmp_path_factory.mktemp("models")))


@dataclass
class Servers:
    environment: str
    env: EnvironmentClient
    manager: EpisodeManager
    outcomes: dict[str, dict[int, int]] = field(default_factory=dict)

    async def outcome(self, episode_id: str, seat: int) -> int:
        """The seat's outcome as the environment server's own engine decided it, read when the episode was
        released (the driver closes every episode it finished): independent of the loop and of the reward
        specs."""
        return self.outcomes[episode_id][seat]


_OUTCOME_KIND = {1: WIN, -1: LOSS, 0: common_pb2.OUTCOME_KIND_DRAW}


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    settings = load_settings(rpc_timeout_s=30)
    servicer = EnvironmentServicer(EpisodeManager())
    manager = servicer.manager
    env_server = await rpc.start_server(
        "environment", lambda s: register_environment(s, servicer), settings, "127.0.0.1:0"
    )
    env_addr = f"127.0.0.1:{env_server.port}"
    async with EnvironmentClient(env_addr, settings) as env:
        found = Servers(env_addr, env, manager)
        release = manager.release

        def keep_outcome(ep: Any) -> None:
            if ep.env.done:
                found.outcomes[ep.episode_id] = {s: _OUTCOME_KIND[o] for s, o in ep.env.outcome().items()}
            release(ep)

        manager.release = keep_outcome  # type: ignore[method-assign]
        yield found
    await close_channels()
    manager.close_all()
    await env_server.stop(0)


_LEGAL = re.compile(r"^- (\w+)(?: <player>)?(?: \(players ([\d, ]+)\))?", re.M)


@dataclass
class FakeServer:
    """Stands in for ``LLMServerClient``: answers a legal action read from the prompt's last "Legal
    actions" block, with made-up logprobs, and records every call. ``garbage_first`` answers a vote for a
    player who does not exist on the first vote of the game, to exercise the invalid-answer re-prompt;
    ``fixed`` (when not None) is the answer to every prompt, whatever it asks."""

    tokenizer: Any
    garbage_first: bool = False
    garbled: bool = False
    fixed: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    def answer(self, prompt: str) -> str:
        block = prompt.rsplit("Legal actions:", 1)[-1]
        for kind, players in _LEGAL.findall(block):
            if players:
                return f"{kind} {players.split(',')[0].strip()}"
            if kind != "speak":
                return str(kind)
        return "I think we should listen carefully."

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> Any:  # fmt: skip
        prompt = self.tokenizer.decode(prompt_ids)
        text = self.answer(prompt) if self.fixed is None else self.fixed
        if self.garbage_first and text.startswith("vote ") and not self.garbled:
            text, self.garbled = "vote 99", True
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: sampling_params["max_tokens"] - 1]
        ids.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        # exact in float32, as logprobs travel in the Trajectory (and verl's tensors hold them)
        logprobs = [-(len(self.calls) + 1) / 64 - j / 1024 for j in range(len(ids))]
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "ids": ids,
                           "logprobs": logprobs, "params": dict(sampling_params)})  # fmt: skip
        return SimpleNamespace(
            token_ids=ids, log_probs=logprobs, stop_reason="completed", num_preempted=0, routed_experts=None,
            extra_fields={"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3},
        )  # fmt: skip


def make_loop(
    tokenizer: Any, server: FakeServer, servers: Servers, response_length: int = 8192, **loop_kw: Any
) -> WolfpackAgentLoop:
    config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"prompt_length": 4096, "response_length": response_length}},
         "data": {"apply_chat_template_kwargs": {}}}
    )  # fmt: skip
    return WolfpackAgentLoop(
        trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer, processor=None,
        dataset_cls=None, data_config=DictConfigWrap(config.data), hf_model_type="qwen2",
        environment=servers.environment, name=AGENT_NAME, **loop_kw,
    )  # fmt: skip


def sample(seed: int, seat: int, **spec: Any) -> dict[str, Any]:
    row = dataset_rows(1, {"game_id": "werewolf_v1", "variant": "6p", "seat": seat, **spec}, seed0=seed,
                       system_prompt="You play Werewolf. Answer with one legal action.")[0]  # fmt: skip
    return {"raw_prompt": row["prompt"], "extra_info": row["extra_info"], "index": 0}


SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


def check_token_layout(out: AgentLoopOutput, server: FakeServer, tokenizer: Any) -> None:
    """Mask 1 exactly on the tokens the server generated (in order, with their logprobs); mask 0 on the
    observation tokens between them; every prompt the server saw is a prefix of the final sequence."""
    full = out.prompt_ids + out.response_ids
    assert out.response_logprobs is not None
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    generated = [t for c in server.calls for t in c["ids"]]
    kept = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m == 1]
    assert kept == generated
    assert [lp for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m == 1] == [
        lp for c in server.calls for lp in c["logprobs"]
    ]
    assert all(lp == 0.0 for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m == 0)
    for call in server.calls:
        assert full[: len(call["prompt_ids"])] == call["prompt_ids"]
    assert server.calls[0]["prompt_ids"] == out.prompt_ids  # the first prompt is verl's "prompt"
    observation_tokens = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m == 0]
    observed = tokenizer.decode(observation_tokens)
    assert observed.count("<|im_start|>user") == len(server.calls) - 1  # one user message per later turn
    assert "--- Now ---" in observed
    assert "Legal actions" not in tokenizer.decode(kept)


@pytest.mark.parametrize("seat", [0, 2])
async def test_plays_a_game_to_the_end_and_masks_observations(
    tokenizer: Any, servers: Servers, seat: int
) -> None:
    server = FakeServer(tokenizer)
    loop = make_loop(tokenizer, server, servers)
    out = await loop.run(dict(SAMPLING), **sample(seed=11, seat=seat, reward_spec="werewolf_outcome"))
    assert len(server.calls) >= 2, "a 6-player game gives a seat several turns"
    check_token_layout(out, server, tokenizer)
    extra = out.extra_fields
    assert extra["wolfpack_policy_turns"] == len(server.calls)
    assert extra["wolfpack_invalid_turns"] == 0
    assert extra["wolfpack_autopilot_turns"] == 0
    # werewolf_outcome@1: +1 on a win, -1 on a loss, on the seat's last turn
    outcome = await servers.outcome(extra["wolfpack_episode_id"], seat)
    assert outcome in (WIN, LOSS)
    assert extra["wolfpack_outcome"] == outcome
    assert out.reward_score == (1.0 if outcome == WIN else -1.0)
    assert extra["turn_scores"][:-1] == [0.0] * (len(server.calls) - 1)
    assert extra["turn_scores"][-1] == out.reward_score
    assert extra["max_global_steps"] == 3 and extra["min_global_steps"] == 3
    assert all(c["params"]["max_tokens"] == 256 for c in server.calls)  # EpisodeSpec default cap
    assert len({c["request_id"] for c in server.calls}) == 1  # one sticky session per game


async def test_skipped_actions_stay_in_the_conversation_with_mask_0(tokenizer: Any, servers: Servers) -> None:
    """``skip_actions`` (``batch.skip_actions``'s twin): the seat's speeches stay in its token stream, where the
    later prompts need them, but with mask 0 (no loss; verl's GAE passes over them as over observations)."""
    server = FakeServer(tokenizer)
    loop = make_loop(tokenizer, server, servers)
    spec = sample(seed=11, seat=2, reward_spec="werewolf_outcome", skip_actions=["speak"])
    out = await loop.run(dict(SAMPLING), **spec)
    spoke = [tokenizer.decode(c["ids"]).startswith("I think") for c in server.calls]
    assert any(spoke) and not all(spoke), "the seat both speaks and decides in a 6-player game"
    kept = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m == 1]
    assert kept == [t for c, s in zip(server.calls, spoke, strict=True) if not s for t in c["ids"]]
    full = out.prompt_ids + out.response_ids
    assert all(full[: len(c["prompt_ids"])] == c["prompt_ids"] for c in server.calls)
    assert out.extra_fields["wolfpack_policy_turns"] == len(server.calls)  # played and counted as before


def test_agent_output_tokens_leaves_skipped_answers_at_mask_0() -> None:
    first = trajectory_pb2.Turn(
        index=0, prompt_token_ids=[1], response_token_ids=[2, 3], response_logprobs=[-1, -2], valid=True
    )
    first.action.kind = "speak"
    second = trajectory_pb2.Turn(
        index=1, prompt_token_ids=[1, 2, 3, 9], response_token_ids=[4], response_logprobs=[-0.5], valid=True
    )
    second.action.kind = "vote"
    assert agent_output_tokens([first, second], frozenset({"speak"})) == (
        [1], [2, 3, 9, 4], [0, 0, 0, 1], [0.0, 0.0, 0.0, -0.5]
    )  # fmt: skip
    first.valid = False  # an invalid answer is trained whatever it tried
    assert agent_output_tokens([first, second], frozenset({"speak"}))[2] == [1, 1, 0, 1]


async def test_invalid_answer_is_reprompted_and_penalised(tokenizer: Any, servers: Servers) -> None:
    server = FakeServer(tokenizer, garbage_first=True)
    loop = make_loop(tokenizer, server, servers)
    out = await loop.run(dict(SAMPLING), **sample(seed=11, seat=0, reward_spec="werewolf_shaped"))
    check_token_layout(out, server, tokenizer)
    extra = out.extra_fields
    assert extra["wolfpack_invalid_turns"] == 1
    # the re-prompt carries the environment's feedback on the invalid answer, as an observation (mask 0)
    bad = next(i for i, c in enumerate(server.calls) if tokenizer.decode(c["ids"]).startswith("vote 99"))
    seen_before = len(server.calls[bad]["prompt_ids"]) + len(server.calls[bad]["ids"])
    reprompt = tokenizer.decode(server.calls[bad + 1]["prompt_ids"][seen_before:])
    assert "invalid" in reprompt and "Exile vote" in reprompt
    # werewolf_shaped@1 takes 0.1 off per invalid turn: the components say so
    assert extra["wolfpack_reward_components"]["invalid_penalty"] == pytest.approx(-0.1)


@pytest.mark.parametrize("answer", ["", " \n ", "\x00\x01\ufffd"], ids=["empty", "blank", "binary"])
async def test_whatever_the_model_answers_is_a_move_never_a_lost_episode(
    tokenizer: Any, servers: Servers, answer: str
) -> None:
    """Regression: stock verl main_ppo lost episodes to INVALID_ARGUMENT 'give an action or a non-empty
    raw_text' when the model answered nothing. Every answer is now the seat's move, judged by the game."""
    server = FakeServer(tokenizer, fixed=answer)
    loop = make_loop(tokenizer, server, servers)
    out = await loop.run(dict(SAMPLING), **sample(seed=11, seat=0, reward_spec="werewolf_shaped"))
    extra = out.extra_fields
    assert extra["wolfpack_invalid_turns"] >= 1, "the game judged the answer invalid"
    assert extra["wolfpack_outcome"] == await servers.outcome(extra["wolfpack_episode_id"], 0)
    assert extra["wolfpack_outcome"] in (WIN, LOSS), "the game still ended"
    # werewolf_shaped@1: -0.1 per invalid (re-prompted or defaulted) turn
    penalty = extra["wolfpack_reward_components"]["invalid_penalty"]
    assert penalty == pytest.approx(-0.1 * extra["wolfpack_invalid_turns"])
    assert len(server.calls) == extra["wolfpack_policy_turns"] >= 2


async def test_budget_runs_out_then_autopilot_finishes_the_game(tokenizer: Any, servers: Servers) -> None:
    full = await make_loop(tokenizer, FakeServer(tokenizer), servers).run(
        dict(SAMPLING), **sample(seed=11, seat=0, reward_spec="werewolf_outcome")
    )
    budget = len(full.response_ids) // 2  # the same game needs twice this much
    server = FakeServer(tokenizer)
    loop = make_loop(tokenizer, server, servers, response_length=budget)
    out = await loop.run(dict(SAMPLING), **sample(seed=11, seat=0, reward_spec="werewolf_outcome"))
    extra = out.extra_fields
    assert len(out.response_ids) <= budget
    assert extra["wolfpack_autopilot_turns"] >= 1
    assert extra["wolfpack_outcome"] == await servers.outcome(extra["wolfpack_episode_id"], 0)
    assert extra["wolfpack_outcome"] in (WIN, LOSS)  # the game still ended
    check_token_layout(out, server, tokenizer)


async def test_max_policy_turns_then_autopilot_finishes_the_game(tokenizer: Any, servers: Servers) -> None:
    server = FakeServer(tokenizer)
    loop = make_loop(tokenizer, server, servers, max_policy_turns=1)
    out = await loop.run(dict(SAMPLING), **sample(seed=11, seat=0, reward_spec="werewolf_outcome"))
    extra = out.extra_fields
    assert extra["wolfpack_policy_turns"] == len(server.calls) == 1
    assert extra["wolfpack_autopilot_turns"] >= 1
    assert extra["wolfpack_outcome"] == await servers.outcome(extra["wolfpack_episode_id"], 0)
    assert extra["wolfpack_outcome"] in (WIN, LOSS)  # the game still ended
    assert out.response_ids == server.calls[0]["ids"] and set(out.response_mask) == {1}  # one answer, no more


def comparable(traj: trajectory_pb2.Trajectory) -> trajectory_pb2.Trajectory:
    """``traj`` without what differs between two plays of one game: ids, times, trace, worker."""
    out = trajectory_pb2.Trajectory()
    out.CopyFrom(traj)
    for name in ("trajectory_id", "episode_id", "group_id", "started_at", "finished_at", "score_ms", "trace"):
        out.ClearField(name)
    del out.metadata["worker_id"]
    for turn in out.turns:
        turn.ClearField("started_at")
        turn.ClearField("generate_ms")
    return out


async def test_the_rollout_driver_is_the_player(tokenizer: Any, servers: Servers) -> None:
    """The agent loop adds nothing to the play: a ``RolloutDriver`` built here over the loop's backends
    (its environment and inference; the trainer's local-mode reward) plays the same seed to the same
    scored Trajectory as the loop, and ``run``'s output is read off that Trajectory."""
    row = sample(seed=11, seat=2, reward_spec="werewolf_shaped")
    spec = EpisodeSpec.from_sample(row)
    server_a, server_b, server_c = (FakeServer(tokenizer, garbage_first=True) for _ in range(3))
    out = await make_loop(tokenizer, server_a, servers).run(dict(SAMPLING), **row)
    played, _ = await make_loop(tokenizer, server_b, servers).play(spec, SAMPLING, row["raw_prompt"])
    backends = make_loop(tokenizer, server_c, servers).backends(spec, SAMPLING, row["raw_prompt"])
    driver = RolloutDriver(
        RolloutConfig(concurrency=1, reward_spec="werewolf_shaped", sampling=SamplingConfig(max_tokens=256)),
        environment=backends.environment, inference=backends.inference, reward=LocalReward(),
    )  # fmt: skip
    theirs = await driver.play([episode_task(spec)])
    assert len(theirs) == 1 and played is not None
    traj = theirs[0]
    assert any(not t.valid for t in traj.turns), "the re-prompted answer is a turn of the trajectory"
    assert comparable(played) == comparable(traj)
    prompts = [[c["prompt_ids"] for c in s.calls] for s in (server_a, server_b, server_c)]
    assert prompts[0] == prompts[1] == prompts[2]
    prompt_ids, response_ids, mask, logprobs = agent_output_tokens(list(traj.turns))
    assert (out.prompt_ids, out.response_ids, out.response_mask, out.response_logprobs) == (
        prompt_ids,
        response_ids,
        mask,
        logprobs,
    )
    seat_outcome = next(o for o in traj.outcomes if o.seat == 2)
    assert out.reward_score == pytest.approx(seat_outcome.final_reward)
    assert out.extra_fields["turn_scores"] == [t.reward for t in traj.turns]
    assert out.extra_fields["wolfpack_outcome"] == seat_outcome.outcome
    assert {b.seat: b.controller for b in traj.seats}[2] == common_pb2.SEAT_CONTROLLER_POLICY


def test_agent_output_tokens_needs_one_token_stream() -> None:
    """Mask 1 exactly where each answer's tokens stand in the final stream; a prompt that does not
    continue the earlier turns is refused, not turned into a wrong mask."""
    first = trajectory_pb2.Turn(
        index=0, prompt_token_ids=[1, 2], response_token_ids=[3, 4], response_logprobs=[-1, -2]
    )
    second = trajectory_pb2.Turn(
        index=1, prompt_token_ids=[1, 2, 3, 4, 9, 9], response_token_ids=[5], response_logprobs=[-0.5]
    )
    assert agent_output_tokens([first, second]) == (
        [1, 2], [3, 4, 9, 9, 5], [1, 1, 0, 0, 1], [-1.0, -2.0, 0.0, 0.0, -0.5]
    )  # fmt: skip
    no_logprobs = [trajectory_pb2.Turn(prompt_token_ids=[1], response_token_ids=[2])]
    assert agent_output_tokens(no_logprobs) == ([1], [2], [1], None)
    stray = trajectory_pb2.Turn(index=1, prompt_token_ids=[1, 7, 3, 4, 9], response_token_ids=[5])
    with pytest.raises(ValueError, match="does not continue"):
        agent_output_tokens([first, stray])


def test_episode_spec_rejects_unknown_keys_and_reads_rows() -> None:
    with pytest.raises(ValueError, match="unknown wolfpack episode keys"):
        EpisodeSpec.from_mapping({"game": "werewolf_v1"})
    with pytest.raises(ValueError, match="observation"):
        EpisodeSpec.from_mapping({"observation": "diff"})
    with pytest.raises(ValueError, match="Werewolf only"):
        EpisodeSpec.from_mapping({"game_id": "bargaining_v1"})
    row = sample(seed=5, seat=3, bots={"1": "random"})
    spec = EpisodeSpec.from_sample(row, {"default_bot": "random", "max_turn_tokens": 32})
    assert (spec.seed, spec.seat, spec.bots, spec.default_bot, spec.max_turn_tokens) == (
        5,
        3,
        {1: "random"},
        "random",
        32,
    )
    assert json.loads(row["extra_info"]["wolfpack"])["seed"] == 5


def test_the_loops_user_messages_are_the_drivers_conversation_messages() -> None:
    """The agent loop's later user messages are the rollout driver's ``conversation`` ones (``new_lines``):
    whole new lines, and an unchanged view asks again with its instruction line, never an empty message."""
    before = "rules\n--- seen ---\nA spoke.\n--- Now ---\nVote.\n"
    after = "rules\n--- seen ---\nA spoke.\nB spoke.\n--- Now ---\nVote again.\n"
    assert new_lines(before, after) == "B spoke.\n--- Now ---\nVote again.\n"
    assert new_lines("", after) == after
    assert new_lines(after, after) == "Vote again."
    assert new_lines("xyz", "abc\n") == "abc\n"


def test_config_file_registers_the_loop() -> None:
    entries: Any = OmegaConf.load(CONFIG_PATH)
    assert [(e.name, e._target_) for e in entries] == [
        (AGENT_NAME, "wolfpack_trainer.learners.verl.agent_loop.WolfpackAgentLoop")
    ]


def test_dataset_writer(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    from wolfpack_trainer.learners.verl.agent_loop import main

    main([str(tmp_path / "d.parquet"), "--rows", "4", "--seats", "0,2", "--seed0", "7"])
    df = pd.read_parquet(tmp_path / "d.parquet")
    specs = [json.loads(x["wolfpack"]) for x in df["extra_info"]]
    assert [(s["seed"], s["seat"]) for s in specs] == [(7, 0), (8, 2), (9, 0), (10, 2)]
    assert set(df["agent_name"]) == {AGENT_NAME}


VILLAGE = ("villager", "seer", "witch")


def test_dataset_rows_by_roles_are_the_seats_dealt_those_roles() -> None:
    from wolfpack_games import make_game

    rows = dataset_rows(10, {"game_id": "werewolf_v1", "variant": "6p"}, seed0=3, roles=VILLAGE)
    picks = [(s["seed"], s["seat"]) for s in (json.loads(r["extra_info"]["wolfpack"]) for r in rows)]
    assert len(picks) == 10 and [r["extra_info"]["index"] for r in rows] == list(range(10))
    by_seed: dict[int, list[int]] = {}
    for seed, seat in picks:
        by_seed.setdefault(seed, []).append(seat)
    assert sorted(by_seed) == [3, 4, 5]  # 4 village seats a 6p game: 4 + 4 + the first 2 of seed 5
    for seed, seats in by_seed.items():
        env = make_game("werewolf_v1", "6p")
        env.reset(seed=seed)
        village = [s for s in sorted(env.possible_agents) if env.role(s) in VILLAGE]
        assert seats == (village if seed < 5 else village[:2])
        assert all(env.role(s) != "werewolf" for s in seats)
    with pytest.raises(ValueError, match="not both"):
        dataset_rows(2, {"game_id": "werewolf_v1"}, seats=[0], roles=VILLAGE)
    with pytest.raises(ValueError, match="is dealt any of"):
        dataset_rows(2, {"game_id": "werewolf_v1", "variant": "6p"}, roles=["seeer"])


async def test_a_role_row_plays_the_seat_dealt_that_role(tokenizer: Any, servers: Servers) -> None:
    """The environment service deals the roles the dataset builder read off the engine for that seed."""
    row = dataset_rows(1, {"game_id": "werewolf_v1", "variant": "6p"}, seed0=21, roles=["seer"])[0]
    server = FakeServer(tokenizer)
    loop = make_loop(tokenizer, server, servers)
    await loop.run(dict(SAMPLING), raw_prompt=[], extra_info=row["extra_info"], index=0)
    first = tokenizer.decode(server.calls[0]["prompt_ids"])
    seat = json.loads(row["extra_info"]["wolfpack"])["seat"]
    assert f"You are Player {seat + 1}. Your role: Seer." in first


def test_dataset_writer_roles_and_reward_spec(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    from wolfpack_trainer.learners.verl.agent_loop import main

    out = tmp_path / "v.parquet"
    main([str(out), "--rows", "8", "--roles", "villager,seer,witch", "--reward-spec", "werewolf_role@1"])
    specs = [json.loads(x["wolfpack"]) for x in pd.read_parquet(out)["extra_info"]]
    assert len(specs) == 8 and {s["reward_spec"] for s in specs} == {"werewolf_role@1"}
    main([str(out), "--rows", "2", "--roles", "villager", "--skip-actions", "villager:speak, witch:speak"])
    spec = EpisodeSpec.from_mapping(json.loads(pd.read_parquet(out)["extra_info"][0]["wolfpack"]))
    assert spec.skip_actions == ("villager:speak", "witch:speak")
    assert [s["seed"] for s in specs] == [0] * 4 + [1] * 4
    EpisodeSpec.from_mapping(specs[0])  # a row the loop accepts
