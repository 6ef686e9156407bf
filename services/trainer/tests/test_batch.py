from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

from wolfpack_trainer.batch import BatchConfig, BuildStats, Sample, build_samples, collate, split_by_policy


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


# --- added for mutation testing (bench/results/2026-11-26-mutation-trainer.md) ------------------------------


def test_group_key_parts_compose_uid_and_episode_uid(trajectory_factory: Callable[..., Any]) -> None:
    traj = trajectory_factory("t", [(3, [1], [2], 0.0, "a")], group="G", roles={3: "wolf"}, policy="pol")
    every = build_samples([traj], BatchConfig(group_by=("group", "policy", "role", "seat")))[0]
    assert every.uid == "G|p=pol|r=wolf|s=3"
    assert every.episode_uid == "p=pol|r=wolf|s=3"  # the same parts without the group
    default = build_samples([traj], BatchConfig())[0]
    assert default.uid == "G|p=pol|r=wolf"  # default group_by: group, policy, role
    # no key parts at all: every trajectory is its own group
    none = build_samples([traj], BatchConfig(group_by=()))[0]
    assert none.uid == "t" and none.episode_uid == "t"
    # an empty group id falls back to the trajectory id
    traj.group_id = ""
    assert build_samples([traj], BatchConfig(group_by=("group", "seat")))[0].uid == "t|s=3"


def test_turns_need_both_tokens_and_a_policy(trajectory_factory: Callable[..., Any]) -> None:
    traj = trajectory_factory("t", [(0, [1], [2], 0.0, "a")])
    no_policy = traj.turns.add(index=1, seat=1, observation_text="external")  # tokens, no policy id
    no_policy.prompt_token_ids.extend([1])
    no_policy.response_token_ids.extend([5])
    no_policy.response_logprobs.extend([-0.1])
    no_tokens = traj.turns.add(index=2, seat=2, observation_text="scripted")  # policy id, no tokens
    no_tokens.policy.policy_id = "p"
    samples = build_samples([traj], BatchConfig())
    assert [(s.seat, s.response) for s in samples] == [(0, [2])]


def test_a_seat_without_an_outcome_keeps_its_turn_rewards(trajectory_factory: Callable[..., Any]) -> None:
    traj = trajectory_factory("t", [(0, [1], [2], 0.25, "a"), (0, [1], [3], 0.5, "b")])
    del traj.outcomes[:]
    samples = build_samples([traj], BatchConfig(gamma=1.0))
    # no final reward: the turn rewards stand; return-to-go 0.25 + 0.5 = 0.75, then 0.5
    assert [s.rewards[-1] for s in samples] == [0.75, 0.5]
    assert [s.seat_return for s in samples] == [0.75, 0.75]
    assert [s.role for s in samples] == ["", ""]


def test_turn_samples_carry_their_turn(trajectory_factory: Callable[..., Any]) -> None:
    # rewards 1, 0, 2 with gamma 0.5: G2 = 2, G1 = 0 + 0.5 * 2 = 1, G0 = 1 + 0.5 * 1 = 1.5
    traj = trajectory_factory(
        "t", [(1, [1], [2], 1.0, "o0"), (1, [1, 2], [3, 4], 0.0, "o1"), (1, [7], [5], 2.0, "o2")], version=6
    )
    samples = build_samples([traj], BatchConfig(gamma=0.5))
    assert [s.rewards for s in samples] == [[1.5], [0.0, 1.0], [2.0]]
    assert [s.step_reward for s in samples] == [1.0, 0.0, 2.0]
    assert [s.seat_return for s in samples] == [3.0, 3.0, 3.0]
    assert [s.observation for s in samples] == ["o0", "o1", "o2"]
    assert [s.turn_index for s in samples] == [0, 1, 2]
    assert [s.response_mask for s in samples] == [[1], [1, 1], [1]]
    assert [s.logprobs for s in samples] == [[-0.5], [-0.5, -0.5], [-0.5]]
    assert {(s.policy_version, s.seat, s.trajectory_id, s.policy_id) for s in samples} == {(6, 1, "t", "p")}


def test_length_limits_are_inclusive(trajectory_factory: Callable[..., Any]) -> None:
    traj = trajectory_factory("t", [(0, [1, 2, 3], [4, 5], 0.0, "a"), (0, [1, 2, 3], [4, 5, 6], 1.0, "b")])
    stats = BuildStats()
    samples = build_samples([traj], BatchConfig(max_prompt_len=3, max_response_len=2), stats)
    # a prompt of exactly 3 and a response of exactly 2 tokens fit; 3 response tokens do not
    assert [(s.prompt, s.response) for s in samples] == [([1, 2, 3], [4, 5])]
    assert stats.truncated_prompts == 0 and stats.dropped_too_long == 1


def test_build_stats_count_turns_samples_and_policies(trajectory_factory: Callable[..., Any]) -> None:
    a = trajectory_factory("a", [(0, [1], [2], 0.0, "x"), (0, [1], [2], 0.0, "y")], policy="wolves")
    b = trajectory_factory("b", [(0, [1], [2], 0.0, "x")], policy="village")
    stats = BuildStats()
    samples = build_samples([a, b], BatchConfig(), stats)
    build_samples([b], BatchConfig(), stats)  # stats accumulate over calls
    assert stats.turns == 4 and stats.samples == 4
    assert dict(stats.by_policy) == {"wolves": 2, "village": 2}
    assert len(samples) == 3


def test_split_by_policy_keeps_order_within_a_policy(trajectory_factory: Callable[..., Any]) -> None:
    trajs = [
        trajectory_factory("a", [(0, [1], [2], 0.0, "x")], policy="wolves"),
        trajectory_factory("b", [(0, [1], [3], 0.0, "x")], policy="village"),
        trajectory_factory("c", [(0, [1], [4], 0.0, "x")], policy="wolves"),
    ]
    by = split_by_policy(build_samples(trajs, BatchConfig()))
    assert {k: [s.trajectory_id for s in v] for k, v in by.items()} == {
        "wolves": ["a", "c"],
        "village": ["b"],
    }


def test_episode_layout_puts_each_turns_reward_on_its_last_token(
    trajectory_factory: Callable[..., Any],
) -> None:
    # three turns, full-history prompts: [1] -> r [2, 3]; [1, 2, 3, 9] -> r [4]; [1, 2, 3, 9, 4, 8] -> r [5, 6]
    traj = trajectory_factory(
        "t",
        [
            (0, [1], [2, 3], 0.5, "a"),
            (0, [1, 2, 3, 9], [4], -1.0, "b"),
            (0, [1, 2, 3, 9, 4, 8], [5, 6], 2.0, "c"),
        ],
        finals={0: 3.0},
    )
    stats = BuildStats()
    [s] = build_samples([traj], BatchConfig(layout="episode", gamma=0.5), stats)
    assert s.prompt == [1]
    assert s.response == [2, 3, 9, 4, 8, 5, 6]
    assert s.response_mask == [1, 1, 0, 1, 0, 1, 1]
    # own rewards, no discounting in this layout; the terminal-only 3.0 - 1.5 = 1.5 goes to the last turn
    assert s.rewards == [0.0, 0.5, 0.0, -1.0, 0.0, 0.0, 3.5]
    assert s.logprobs == [-0.5, -0.5, 0.0, -0.5, 0.0, -0.5, -0.5]
    assert s.seat_return == 3.0 and stats.split_sequences == 0 and stats.samples == 1


def test_episode_layout_split_starts_a_fresh_sequence(trajectory_factory: Callable[..., Any]) -> None:
    # turn 1's prompt does not extend turn 0's context ([1, 2] + [3]); turn 2 extends turn 1's ([7, 7] + [4])
    traj = trajectory_factory(
        "t", [(0, [1, 2], [3], 1.0, "a"), (0, [7, 7], [4], 0.0, "b"), (0, [7, 7, 4, 6], [5], 0.0, "c")]
    )
    stats = BuildStats()
    samples = build_samples([traj], BatchConfig(layout="episode"), stats)
    assert [(s.prompt, s.response, s.response_mask) for s in samples] == [
        ([1, 2], [3], [1]),
        ([7, 7], [4, 6, 5], [1, 0, 1]),
    ]
    assert [s.rewards for s in samples] == [[1.0], [0.0, 0.0, 0.0]]
    assert stats.split_sequences == 1


def test_episode_layout_prefix_of_the_context_is_not_an_extension(
    trajectory_factory: Callable[..., Any],
) -> None:
    # turn 1's prompt [1, 2] is shorter than the context [1, 2, 3]: it cannot extend it, so a new sequence
    traj = trajectory_factory("t", [(0, [1, 2], [3], 0.0, "a"), (0, [1, 2], [4], 0.0, "b")])
    samples = build_samples([traj], BatchConfig(layout="episode"))
    assert [(s.prompt, s.response) for s in samples] == [([1, 2], [3]), ([1, 2], [4])]


def test_episode_layout_length_limits(trajectory_factory: Callable[..., Any]) -> None:
    # one sequence: prompt [1, 2, 3] (clipped to its last 2), response [4, 5, 6] (2 sampled + 1 observation)
    traj = trajectory_factory("t", [(0, [1, 2, 3], [4], 0.0, "a"), (0, [1, 2, 3, 4, 5], [6], 1.0, "b")])
    stats = BuildStats()
    kept = build_samples([traj], BatchConfig(layout="episode", max_prompt_len=2, max_response_len=3), stats)
    assert [(s.prompt, s.response) for s in kept] == [([2, 3], [4, 5, 6])]
    assert stats.truncated_prompts == 1 and stats.dropped_too_long == 0
    stats = BuildStats()
    assert build_samples([traj], BatchConfig(layout="episode", max_response_len=2), stats) == []
    assert stats.dropped_too_long == 1


def _collate_by_hand(samples: list[Sample], pad: int) -> dict[str, list[Any]]:
    """A second, list-based implementation of collate's padding (prompts left, responses right)."""
    p_len = max(len(s.prompt) for s in samples)
    r_len = max(len(s.response) for s in samples)
    out: dict[str, list[Any]] = {k: [] for k in ("prompts", "responses", "mask", "att", "pos", "lp", "rw")}
    for s in samples:
        lp, lr = p_len - len(s.prompt), r_len - len(s.response)
        out["prompts"].append([pad] * lp + s.prompt)
        out["responses"].append(s.response + [pad] * lr)
        out["mask"].append(s.response_mask + [0] * lr)
        att = [0] * lp + [1] * (len(s.prompt) + len(s.response)) + [0] * lr
        out["att"].append(att)
        pos, seen = [], 0
        for a in att:  # position = number of real tokens before this one (padding repeats its neighbour)
            pos.append(seen if a else max(seen - 1, 0))
            seen += a
        out["pos"].append(pos)
        out["lp"].append([x * m for x, m in zip(s.logprobs, s.response_mask, strict=True)] + [0.0] * lr)
        out["rw"].append(s.rewards + [0.0] * lr)
    return out


def _sample(rng: random.Random, i: int) -> Sample:
    p, r = rng.randint(0, 4), rng.randint(1, 5)
    mask = [rng.choice([0, 1]) for _ in range(r)]
    return Sample(
        prompt=[rng.randint(1, 99) for _ in range(p)],
        response=[rng.randint(1, 99) for _ in range(r)],
        response_mask=mask,
        logprobs=[-rng.random() for _ in range(r)],
        rewards=[float(rng.randint(-2, 2)) for _ in range(r)],
        uid=f"u{i % 2}",
        trajectory_id=f"t{i}",
        episode_uid="e",
        policy_id=f"p{i % 3}",
        role=f"r{i}",
        seat=i,
        policy_version=i * 10,
        turn_index=i - 1,
    )


@pytest.mark.parametrize("seed", range(8))
def test_collate_matches_a_list_implementation(seed: int) -> None:
    rng = random.Random(seed)
    samples = [_sample(rng, i) for i in range(rng.randint(1, 4))]
    pad = rng.choice([0, 7])
    batch = collate(samples, pad_token_id=pad)
    want = _collate_by_hand(samples, pad)
    assert batch.prompts.tolist() == want["prompts"]
    assert batch.responses.tolist() == want["responses"]
    assert batch.response_mask.tolist() == want["mask"]
    assert batch.attention_mask.tolist() == want["att"]
    assert batch.position_ids.tolist() == want["pos"]
    assert torch.allclose(batch.rollout_log_probs, torch.tensor(want["lp"]))
    assert batch.token_level_rewards.tolist() == want["rw"]
    assert batch.input_ids.tolist() == [
        p + r for p, r in zip(want["prompts"], want["responses"], strict=True)
    ]
    assert batch.prompts.dtype == batch.responses.dtype == torch.long
    assert batch.uids == [s.uid for s in samples]
    assert batch.trajectory_ids == [s.trajectory_id for s in samples]
    assert batch.policy_ids == [s.policy_id for s in samples]
    assert batch.roles == [s.role for s in samples]
    assert batch.policy_versions == [s.policy_version for s in samples]
    assert batch.turn_indices == [s.turn_index for s in samples]


def test_collate_pads_an_empty_prompt_and_rejects_no_samples() -> None:
    rng = random.Random(0)
    s = _sample(rng, 0)
    s.prompt = []
    batch = collate([s, _sample(rng, 1)], pad_token_id=3)
    assert batch.attention_mask[0, : batch.prompts.shape[1]].sum() == 0
    assert set(batch.prompts[0].tolist()) <= {3}
    with pytest.raises(ValueError, match="no samples"):
        collate([])


def test_long_responses_with_matching_logprobs_are_accepted(trajectory_factory: Callable[..., Any]) -> None:
    # 300 tokens: lengths above CPython's small-int cache must still compare by value
    traj = trajectory_factory("t", [(0, [1], list(range(300)), 1.0, "a")])
    [s] = build_samples([traj], BatchConfig(max_response_len=300))
    assert len(s.response) == len(s.logprobs) == 300
    del traj.turns[0].response_logprobs[-1]
    with pytest.raises(ValueError, match="299 logprobs for 300 tokens"):
        build_samples([traj], BatchConfig(max_response_len=300))


def test_skipped_action_kinds_give_no_sample_but_keep_their_rewards(
    trajectory_factory: Callable[..., Any],
) -> None:
    # seat 0: speak (reward 0.5), vote (0.2), speak (0.0) then an outcome of 1.0 in all; an invalid speech
    # attempt (seat 1) is trained whatever it tried
    traj = trajectory_factory(
        "t",
        [
            (0, [1], [2, 3], 0.5, "a"),
            (0, [1], [4], 0.2, "b"),
            (0, [1], [5, 6], 0.0, "c"),
            (1, [1], [7], -0.1, "d"),
        ],
        finals={0: 1.0, 1: -0.1},
    )
    for turn, kind in zip(traj.turns, ["speak", "vote", "speak", "speak"], strict=True):
        turn.action.kind = kind
    traj.turns[3].valid = False
    stats = BuildStats()
    samples = build_samples([traj], BatchConfig(layout="turn", skip_actions=("speak",)), stats)
    assert [(s.seat, s.turn_index) for s in samples] == [(0, 1), (1, 3)]
    assert stats.skipped_actions == 2 and stats.turns == 4
    vote = samples[0]
    # return-to-go from the vote: its 0.2 + the last speech's 0.0 + the terminal-only 0.3 (1.0 - 0.7)
    assert vote.rewards == [pytest.approx(0.5)]
    assert vote.seat_return == pytest.approx(1.0)  # the speeches' rewards count in the seat's score
    every = build_samples([traj], BatchConfig(layout="turn"))
    assert len(every) == 4 and every[1].rewards == vote.rewards  # leaving turns out changes no return


def test_skipped_action_kinds_need_the_turn_layout() -> None:
    with pytest.raises(ValueError, match=r"skip_actions .* needs batch.layout: turn"):
        BatchConfig(layout="episode", skip_actions=("speak",))


def test_skip_actions_entries_may_name_one_role(trajectory_factory: Callable[..., Any]) -> None:
    from wolfpack_trainer.skips import skipped_kinds

    assert skipped_kinds(["speak", "seer:inspect"], "seer") == {"speak", "inspect"}
    assert skipped_kinds(["villager:speak", "witch:speak"], "seer") == set()
    traj = trajectory_factory(
        "t", [(0, [1], [2], 0.0, "a"), (1, [1], [3], 0.0, "b"), (0, [1], [4], 0.0, "c")],
        roles={0: "villager", 1: "seer"},
    )  # fmt: skip
    for turn, kind in zip(traj.turns, ["speak", "speak", "vote"], strict=True):
        turn.action.kind = kind
    samples = build_samples([traj], BatchConfig(skip_actions=("villager:speak",)))
    assert [(s.seat, s.turn_index) for s in samples] == [(0, 2), (1, 1)]  # the seer's speech stays
