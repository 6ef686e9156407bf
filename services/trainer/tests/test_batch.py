from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from wolfpack_trainer.batch import BatchConfig, BuildStats, build_samples, collate


def test_turn_layout_keeps_exact_ids_and_puts_return_to_go_on_last_token(
    two_turn_episode: Callable[..., Any],
) -> None:
    samples = build_samples([two_turn_episode(reward=1.0)], BatchConfig(layout="turn", gamma=0.5))
    assert [s.prompt for s in samples] == [[1, 2, 3], [1, 2, 3, 4, 5, 6, 7]]
    assert [s.response for s in samples] == [[4, 5], [8, 9, 10]]
    # return-to-go: turn 0 gets 0 + 0.5 * 1, turn 1 gets 1
    assert samples[0].rewards == [0.0, 0.5]
    assert samples[1].rewards == [0.0, 0.0, 1.0]
    batch = collate(samples, pad_token_id=0)
    assert batch.prompts.tolist() == [[0, 0, 0, 0, 1, 2, 3], [1, 2, 3, 4, 5, 6, 7]]
    assert batch.responses.tolist() == [[4, 5, 0], [8, 9, 10]]
    assert batch.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batch.attention_mask[0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1, 0]
    assert batch.position_ids[0, 4:9].tolist() == [0, 1, 2, 3, 4]
    assert batch.rollout_log_probs[0].tolist() == [-0.5, -0.5, 0.0]
    assert torch.equal(batch.input_ids, torch.cat([batch.prompts, batch.responses], dim=1))


def test_episode_layout_masks_observation_tokens(two_turn_episode: Callable[..., Any]) -> None:
    samples = build_samples([two_turn_episode(reward=2.0)], BatchConfig(layout="episode"))
    assert len(samples) == 1
    s = samples[0]
    assert s.prompt == [1, 2, 3]
    assert s.response == [4, 5, 6, 7, 8, 9, 10]
    assert s.response_mask == [1, 1, 0, 0, 1, 1, 1]
    assert s.logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5, -0.5, -0.5]
    assert s.rewards == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0]
    assert s.turn_index == -1


def test_episode_layout_splits_when_prompt_does_not_extend(trajectory_factory: Callable[..., Any]) -> None:
    traj = trajectory_factory("t", [(0, [1, 2], [3], 0.0, "a"), (0, [9, 9], [4], 1.0, "b")])
    stats = BuildStats()
    samples = build_samples([traj], BatchConfig(layout="episode"), stats)
    assert [s.response for s in samples] == [[3], [4]]
    assert stats.split_sequences == 1


def test_terminal_only_reward_lands_on_last_turn_and_groups(trajectory_factory: Callable[..., Any]) -> None:
    traj = trajectory_factory(
        "t",
        [(0, [1], [2], 0.0, "a"), (1, [1], [3], 0.5, "a"), (0, [1], [4], 1.0, "b")],
        roles={0: "buyer", 1: "seller"},
        finals={0: 1.5, 1: 0.5},
    )
    samples = build_samples([traj], BatchConfig(layout="turn", group_by=("group", "role")))
    by_seat = {(s.seat, s.turn_index): s for s in samples}
    assert by_seat[(0, 2)].step_reward == pytest.approx(1.5)  # 1.0 + (1.5 - 1.0) terminal-only
    assert by_seat[(0, 0)].rewards[-1] == pytest.approx(1.5)
    assert by_seat[(0, 0)].uid == "g|r=buyer" and by_seat[(1, 1)].uid == "g|r=seller"


def test_scripted_turns_and_other_policies_are_skipped(trajectory_factory: Callable[..., Any]) -> None:
    traj = trajectory_factory("t", [(0, [1], [2], 0.0, "a")], policy="wolves")
    traj.turns.add(index=1, seat=1, observation_text="bot")  # a scripted seat: no tokens
    assert build_samples([traj], BatchConfig(policies=("village",))) == []
    assert len(build_samples([traj], BatchConfig())) == 1


def test_mismatched_logprobs_are_rejected(trajectory_factory: Callable[..., Any]) -> None:
    traj = trajectory_factory("t", [(0, [1], [2, 3], 0.0, "a")])
    del traj.turns[0].response_logprobs[-1]
    with pytest.raises(ValueError, match="logprobs"):
        build_samples([traj], BatchConfig())


def test_too_long_responses_are_dropped_and_prompts_left_truncated(
    trajectory_factory: Callable[..., Any],
) -> None:
    traj = trajectory_factory("t", [(0, [1, 2, 3, 4], [5, 6, 7], 0.0, "a"), (0, [1, 2, 3, 4], [8], 1.0, "b")])
    stats = BuildStats()
    samples = build_samples([traj], BatchConfig(max_prompt_len=2, max_response_len=2), stats)
    assert [s.prompt for s in samples] == [[3, 4]]
    assert stats.dropped_too_long == 1 and stats.truncated_prompts == 1
