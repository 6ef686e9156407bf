"""The trainer's local mode: the rollout driver over in-process backends (``local_rollout``): real game
engines, the real tiny-model tokenizer, a scripted policy function in place of the model (the only stand-in),
and rewards from the reward library.

What it shows: local trajectories are scored with the reward service's own specs (the same trajectory
scored by the real reward service over gRPC gives the same proto), scenario transcripts are recorded so
the spec's re-verification agrees with the game, whatever the model answers (empty, blank, binary, huge) is
a move the game judges, never a lost episode, and ``max_prompt_tokens`` crops the templated prompt to its tail.
That a seed is the same game in process and through the environment service: ``test_same_game.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("transformers", reason="the trainer extra is not installed")

from transformers import AutoTokenizer

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack.v1 import reward_service_pb2 as reward_pb
from wolfpack.v1 import reward_service_pb2_grpc as reward_grpc
from wolfpack_inference.models import tiny_model
from wolfpack_reward.server import register as register_reward
from wolfpack_rollout.client import RolloutConfig, SamplingConfig
from wolfpack_trainer.local_rollout import Generated, Task, check_penalty, local_driver
from wolfpack_trainer.train import service_task

ANSWERS = {
    "ultimatum_v1": ["OFFER 5", "ACCEPT", "REJECT", "REJEPT", "I accept", ""],
    "bargaining_v1": ["FINAL_BID: 600", "ACCEPT", "REJECT", "I offer 550", "hmm", ""],
    "werewolf_v1": [
        "pass",
        "vote 1",
        "vote 3",
        "kill 2",
        "<predict_next>Player 2 dies.</predict_next> pass",
        "",
    ],
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model(tmp_path_factory.mktemp("models")))


def scripted(tokenizer: Any, answer: Callable[[int], str]) -> Any:
    """A policy function answering its i-th prompt with ``answer(i)`` as token ids (plus EOS)."""
    calls = itertools.count()
    eos = int(tokenizer.eos_token_id)

    def policy(policy_id: str, prompts: list[list[int]], sampling: Any) -> list[Generated]:
        out = []
        for _ in prompts:
            ids = [*tokenizer(answer(next(calls)), add_special_tokens=False)["input_ids"], eos]
            out.append(Generated(ids, [-1.0] * len(ids), common_pb2.FINISH_REASON_STOP))
        return out

    return policy


def tasks(game: str, variant: str, seeds: Sequence[int]) -> list[Any]:
    """Curriculum tasks (what the driver plays) for a trainee policy "p" in seat 0 against heuristic bots."""
    return [service_task(Task(game, variant, seed, {0: "p"}), i) for i, seed in enumerate(seeds)]


async def play(
    tasks: Sequence[Any], policy: Any, tokenizer: Any, **config: Any
) -> list[trajectory_pb2.Trajectory]:
    driver = local_driver(
        RolloutConfig(sampling=SamplingConfig(max_tokens=8), max_turns=400, **config), tokenizer, policy,
        lambda: {"p": 3},
    )  # fmt: skip
    trajs = await driver.play(tasks)
    assert driver.stats.episodes_failed == 0, driver.stats.recent_failures
    return trajs


def unscored(traj: trajectory_pb2.Trajectory) -> trajectory_pb2.Trajectory:
    """The trajectory as the rollout service sends it to Score: no rewards, no spec, no reward notes."""
    out = trajectory_pb2.Trajectory()
    out.CopyFrom(traj)
    out.reward_spec = ""
    for turn in out.turns:
        turn.reward = 0.0
        turn.ClearField("reward_components")
    for o in out.outcomes:
        o.final_reward = 0.0
    for key in [k for k in out.metadata if k.startswith("reward.")]:
        del out.metadata[key]
    return out


@pytest.fixture
async def reward_stub() -> AsyncIterator[reward_grpc.RewardServiceStub]:
    settings = load_settings(rpc_timeout_s=20)
    server = await rpc.start_server("reward", register_reward, settings, "127.0.0.1:0")
    async with rpc.channel(f"127.0.0.1:{server.port}", settings) as channel:
        yield reward_grpc.RewardServiceStub(channel)
    await server.stop(0)


@pytest.mark.parametrize(
    ("game", "variant", "spec"),
    [
        ("ultimatum_v1", "easy", "scenario_shaped@1"),
        ("bargaining_v1", "easy", "scenario_shaped@1"),
        ("werewolf_v1", "6p", "werewolf_shaped@1"),
    ],
)
async def test_local_and_service_scoring_agree_on_the_same_trajectories(
    tokenizer: Any, reward_stub: reward_grpc.RewardServiceStub, game: str, variant: str, spec: str
) -> None:
    answers = ANSWERS[game]
    trajs = await play(
        tasks(game, variant, range(4)), scripted(tokenizer, lambda i: answers[i % len(answers)]), tokenizer
    )
    assert len(trajs) == 4
    penalised = 0
    for traj in trajs:
        assert traj.reward_spec == spec, "the game's default spec, as the reward service picks it"
        assert "reward.verifier_mismatch" not in traj.metadata, "the recorded transcript is the game's"
        resp = await reward_stub.Score(reward_pb.ScoreRequest(trajectory=unscored(traj)))
        assert resp.trajectory == traj, "the reward service writes exactly what the local rollout wrote"
        penalised += sum("invalid_penalty" in t.reward_components for t in traj.turns)
        trainee = [t for t in traj.turns if t.policy.policy_id]
        assert trainee and all(t.response_token_ids for t in trainee)
        assert all(
            t.policy.version == 3 and list(t.response_logprobs) == [-1.0] * len(t.response_token_ids)
            for t in trainee
        )
    assert penalised, "some scripted answers are invalid, so the penalty component is exercised"


async def test_a_scenario_trajectory_holds_the_scripted_seats_messages_in_play_order(tokenizer: Any) -> None:
    (traj,) = await play(
        tasks("bargaining_v1", "easy", [1]), scripted(tokenizer, lambda i: "FINAL_BID: 600"), tokenizer
    )
    assert traj.HasField("scenario") and traj.scenario.family == "bargaining"
    seats = {t.seat for t in traj.turns}
    assert seats == {0, 1}, "both the trainee and the scripted seat appear"
    scripted_turns = [t for t in traj.turns if not t.policy.policy_id]
    assert scripted_turns and all(t.valid and not t.response_token_ids for t in scripted_turns)
    assert [t.index for t in traj.turns] == list(range(len(traj.turns)))
    assert traj.metadata["reward.verifier"], "the spec re-verified the transcript"


def test_a_different_invalid_penalty_is_refused_not_silently_applied() -> None:
    with pytest.raises(ValueError, match=r"differs from reward spec scenario_shaped@1's 0.1"):
        check_penalty("", "ultimatum_v1", 0.3)
    check_penalty("", "ultimatum_v1", 0.1)
    check_penalty("", "ultimatum_v1", None)


async def test_the_prompt_crop_keeps_the_tail_of_the_templated_prompt(tokenizer: Any) -> None:
    """``max_prompt_tokens``: the turn's prompt ids are the last N of the whole templated prompt (the same
    crop the warm start trains on, and what service mode sends as a token prompt)."""
    from wolfpack_trainer.local_rollout import render_prompt

    (traj,) = await play(tasks("ultimatum_v1", "outside", [5]), scripted(tokenizer, lambda i: "ACCEPT"), tokenizer,
                         max_prompt_tokens=40, prompt_mode="full")  # fmt: skip
    trainee = [t for t in traj.turns if t.policy.policy_id]
    assert trainee
    for turn in trainee:
        whole = render_prompt(tokenizer, turn.observation_text)
        assert len(whole) > 40 and list(turn.prompt_token_ids) == whole[-40:]


@pytest.mark.parametrize("game", ["ultimatum_v1", "werewolf_v1"])
@pytest.mark.parametrize(
    "answer",
    ["", " \n\t ", "\x00\x01\x7f\ufffd", "x" * 20_000],
    ids=["empty", "blank", "binary", "huge"],
)
async def test_whatever_the_model_answers_is_a_move_the_game_judges(
    tokenizer: Any, game: str, answer: str
) -> None:
    variant = "easy" if game == "ultimatum_v1" else "6p"
    (traj,) = await play(tasks(game, variant, [2]), scripted(tokenizer, lambda i: answer), tokenizer)
    trainee = [t for t in traj.turns if t.policy.policy_id]
    assert trainee, "the trainee was asked"
    assert all(o.outcome != common_pb2.OUTCOME_KIND_ABORTED for o in traj.outcomes), (
        "the game reached its end"
    )
    assert "truncated" not in traj.metadata
    invalid = [t for t in trainee if not t.valid]
    assert all(t.invalid_reason for t in invalid), "a rejected answer carries the game's reason"
    assert all(t.reward_components["invalid_penalty"] == pytest.approx(-0.1) for t in invalid)
    if len(answer) > 6_000:  # the game may read a long text as speech; the spec's length penalty applies
        assert all(t.reward_components["length_penalty"] == pytest.approx(-0.1) for t in trainee)
    else:  # nothing to read: invalid (Werewolf takes it as silence where a speech is due), then the default
        assert invalid and any(t.defaulted for t in invalid)
    # A re-prompt is the next attempt of the same decision; a decision made (valid or defaulted) resets it.
    expected = [0]
    for before in trainee[:-1]:
        expected.append(0 if before.valid or before.defaulted else before.attempt + 1)
    assert [t.attempt for t in trainee] == expected
