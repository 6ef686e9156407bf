"""Trajectory protos → token-exact training tensors. Nothing here tokenizes: ids come from the stream.

Two layouts (``BatchConfig.layout``):

- ``turn``: one sample per trainee turn (prompt ids, response ids), the step-independent form verl-agent
  and GiGPO train on. The reward on a sample's last response token is the seat's discounted return from
  that turn on (``gamma``), so an outcome credited to the seat's last turn reaches every decision.
- ``episode``: one sample per (trajectory, seat): the first prompt, then every response with the
  observation tokens between responses kept in the sequence but masked out (``response_mask`` 0), the
  verl agent-loop form. Each turn's own reward sits on its last response token. It needs prompts that
  extend the previous turn's prompt + response token for token (``rollout.prompt: conversation``; the
  per-turn modes never do); where a prompt does not, the sequence is cut there and a new sample starts
  (counted in ``BuildStats.split_sequences``).

A seat's terminal-only reward (``SeatOutcome.final_reward`` minus the sum of its turn rewards, e.g. a
survival bonus) is added to its last turn. Group ids (``uids``) come from ``Trajectory.group_id`` (the
trajectory id when empty), optionally split by policy and/or role (``group_by``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import torch

from wolfpack.v1 import trajectory_pb2
from wolfpack_trainer.learners.base import TrainBatch
from wolfpack_trainer.skips import skipped_kinds

Layout = Literal["turn", "episode"]
GroupKey = Literal["group", "policy", "role", "seat"]


@dataclass(frozen=True)
class BatchConfig:
    """How trajectories become samples.

    ``policies``: policy ids to train (empty: every policy that generated tokens).
    ``group_by``: parts of a sample's advantage-group key; "group" is ``Trajectory.group_id``.
    ``max_prompt_len``/``max_response_len``: longer prompts keep their last tokens (left-truncated);
    a sample whose response is longer is dropped (counted), never silently cut.
    ``skip_actions``: action kinds (``Turn.action.kind``, e.g. ``speak``), or ``role:kind`` for one role's
    (``villager:speak``), whose valid turns give no sample (counted); their rewards still count in the returns
    of the seat's earlier turns and in its score, and an invalid answer is trained whatever it tried. Turn
    layout only. Why: a policy's gradient covers every answer it writes, while the result may turn on a few
    kinds of them: 12p villagers' speeches among heuristic players leave the village's win rate where it is
    even when random (``bench/trainer/village_fidelity.py --by-kind villager``: 0.51 -> 0.49, votes 0.51 ->
    0.01), yet were 78 % of their answer tokens, so GRPO's seat-level advantage spread over them is noise on
    the shared weights. ``role:kind``: in 6p the seer's speeches are what she decides (her claims: random
    speeches 0.38 -> 0.10), the villagers' and the witch's change nothing (-> 0.41, 0.40).
    """

    layout: Layout = "turn"
    gamma: float = 1.0
    group_by: tuple[GroupKey, ...] = ("group", "policy", "role")
    policies: tuple[str, ...] = ()
    max_prompt_len: int = 2048
    max_response_len: int = 1024
    pad_token_id: int = 0
    skip_actions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.skip_actions and self.layout != "turn":
            raise ValueError(
                f"batch.skip_actions {list(self.skip_actions)} needs batch.layout: turn (the episode layout trains "
                "one sequence a seat, whose turns cannot be left out one by one)"
            )


@dataclass
class Sample:
    """One training sequence before padding; ``response_mask`` 0 marks observation tokens."""

    prompt: list[int]
    response: list[int]
    response_mask: list[int]
    logprobs: list[float]
    rewards: list[float]
    uid: str
    trajectory_id: str
    episode_uid: str
    """(group, seat-policy, role) without the trajectory: which samples are "the same task"."""
    policy_id: str
    role: str
    seat: int
    policy_version: int
    turn_index: int
    observation: str = ""
    step_reward: float = 0.0
    """The turn's own reward (before return-to-go), for step-level estimators such as GiGPO."""
    seat_return: float = 0.0
    """The seat's whole-episode return, for outcome estimators over episodes (one score per seat)."""


@dataclass
class BuildStats:
    samples: int = 0
    turns: int = 0
    dropped_too_long: int = 0
    truncated_prompts: int = 0
    split_sequences: int = 0
    skipped_no_tokens: int = 0
    skipped_actions: int = 0
    by_policy: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def _roles(traj: trajectory_pb2.Trajectory) -> dict[int, str]:
    return {o.seat: o.role for o in traj.outcomes}


def _seat_returns(traj: trajectory_pb2.Trajectory) -> dict[int, float]:
    return {o.seat: float(o.final_reward) for o in traj.outcomes}


def _uid(traj: trajectory_pb2.Trajectory, policy: str, role: str, seat: int, keys: Sequence[GroupKey]) -> str:
    parts = []
    for key in keys:
        if key == "group":
            parts.append(traj.group_id or traj.trajectory_id)
        elif key == "policy":
            parts.append(f"p={policy}")
        elif key == "role":
            parts.append(f"r={role}")
        elif key == "seat":
            parts.append(f"s={seat}")
    return "|".join(parts) or traj.trajectory_id


def trainee_turns(
    traj: trajectory_pb2.Trajectory, policies: Sequence[str] = ()
) -> dict[int, list[trajectory_pb2.Turn]]:
    """Turns with generated tokens, by seat, in order; only ``policies`` when given."""
    by_seat: dict[int, list[trajectory_pb2.Turn]] = defaultdict(list)
    for turn in traj.turns:
        if not turn.response_token_ids or not turn.policy.policy_id:
            continue
        if policies and turn.policy.policy_id not in policies:
            continue
        by_seat[turn.seat].append(turn)
    return by_seat


def build_samples(
    trajectories: Iterable[trajectory_pb2.Trajectory], config: BatchConfig, stats: BuildStats | None = None
) -> list[Sample]:
    """Samples of every trainee turn of ``trajectories`` in the configured layout."""
    stats = stats if stats is not None else BuildStats()
    out: list[Sample] = []
    for traj in trajectories:
        roles = _roles(traj)
        returns = _seat_returns(traj)
        for seat, turns in trainee_turns(traj, config.policies).items():
            for turn in turns:
                if len(turn.response_logprobs) != len(turn.response_token_ids):
                    raise ValueError(
                        f"trajectory {traj.trajectory_id} turn {turn.index}: "
                        f"{len(turn.response_logprobs)} logprobs for {len(turn.response_token_ids)} tokens"
                    )
            stats.turns += len(turns)
            rewards = [float(t.reward) for t in turns]
            final = returns.get(seat, sum(rewards))
            rewards[-1] += final - sum(rewards)  # terminal-only components land on the last turn
            role = roles.get(seat, "")
            if config.layout == "turn":
                made = _turn_samples(traj, seat, role, turns, rewards, final, config, stats)
            else:
                made = _episode_samples(traj, seat, role, turns, rewards, final, config, stats)
            out.extend(made)
    stats.samples += len(out)
    for s in out:
        stats.by_policy[s.policy_id] += 1
    return out


def _base(
    traj: trajectory_pb2.Trajectory, seat: int, role: str, turn: trajectory_pb2.Turn, config: BatchConfig
) -> dict[str, object]:
    policy = turn.policy.policy_id
    keys_wo_group = [k for k in config.group_by if k != "group"]
    return {
        "uid": _uid(traj, policy, role, seat, config.group_by),
        "episode_uid": _uid(traj, policy, role, seat, keys_wo_group),
        "trajectory_id": traj.trajectory_id,
        "policy_id": policy,
        "role": role,
        "seat": seat,
        "policy_version": int(turn.policy.version),
    }


def _clip_prompt(ids: Sequence[int], config: BatchConfig, stats: BuildStats) -> list[int]:
    if len(ids) > config.max_prompt_len:
        stats.truncated_prompts += 1
        return list(ids[-config.max_prompt_len :])
    return list(ids)


def _turn_samples(
    traj: trajectory_pb2.Trajectory,
    seat: int,
    role: str,
    turns: list[trajectory_pb2.Turn],
    rewards: list[float],
    final: float,
    config: BatchConfig,
    stats: BuildStats,
) -> list[Sample]:
    out = []
    to_go = 0.0
    returns = [0.0] * len(turns)
    for i in range(len(turns) - 1, -1, -1):  # discounted return-to-go, one reversed loop
        to_go = rewards[i] + config.gamma * to_go
        returns[i] = to_go
    skipped = skipped_kinds(config.skip_actions, role)
    for i, turn in enumerate(turns):
        if turn.valid and turn.action.kind in skipped:
            stats.skipped_actions += 1
            continue
        resp = list(turn.response_token_ids)
        if len(resp) > config.max_response_len:
            stats.dropped_too_long += 1
            continue
        token_rewards = [0.0] * len(resp)
        token_rewards[-1] = returns[i]
        out.append(
            Sample(
                prompt=_clip_prompt(turn.prompt_token_ids, config, stats),
                response=resp,
                response_mask=[1] * len(resp),
                logprobs=list(turn.response_logprobs),
                rewards=token_rewards,
                turn_index=int(turn.index),
                observation=turn.observation_text,
                step_reward=rewards[i],
                seat_return=final,
                **_base(traj, seat, role, turn, config),  # type: ignore[arg-type]
            )
        )
    return out


def _episode_samples(
    traj: trajectory_pb2.Trajectory,
    seat: int,
    role: str,
    turns: list[trajectory_pb2.Turn],
    rewards: list[float],
    final: float,
    config: BatchConfig,
    stats: BuildStats,
) -> list[Sample]:
    out: list[Sample] = []
    current: Sample | None = None
    context: list[int] = []  # prompt + everything appended so far (what the next prompt must extend)
    for i, turn in enumerate(turns):
        prompt = list(turn.prompt_token_ids)
        resp = list(turn.response_token_ids)
        extends = current is not None and prompt[: len(context)] == context
        if current is not None and not extends:
            stats.split_sequences += 1
            out.append(current)
            current = None
        if current is None:
            current = Sample(
                prompt=_clip_prompt(prompt, config, stats),
                response=[],
                response_mask=[],
                logprobs=[],
                rewards=[],
                turn_index=-1,
                seat_return=final,
                **_base(traj, seat, role, turn, config),  # type: ignore[arg-type]
            )
            context = list(prompt)
        else:
            obs = prompt[len(context) :]
            current.response += obs
            current.response_mask += [0] * len(obs)
            current.logprobs += [0.0] * len(obs)
            current.rewards += [0.0] * len(obs)
            context = list(prompt)
        current.response += resp
        current.response_mask += [1] * len(resp)
        current.logprobs += list(turn.response_logprobs)
        current.rewards += [0.0] * (len(resp) - 1) + [rewards[i]]
        context += resp
    if current is not None:
        out.append(current)
    kept = []
    for s in out:
        if len(s.response) > config.max_response_len:
            stats.dropped_too_long += 1
        else:
            kept.append(s)
    return kept


def collate(samples: Sequence[Sample], pad_token_id: int = 0) -> TrainBatch:
    """Pad samples into a ``TrainBatch``: prompts left-padded, responses right-padded."""
    if not samples:
        raise ValueError("no samples to collate")
    n = len(samples)
    p_len = max(len(s.prompt) for s in samples)
    r_len = max(len(s.response) for s in samples)
    prompts = torch.full((n, p_len), pad_token_id, dtype=torch.long)
    responses = torch.full((n, r_len), pad_token_id, dtype=torch.long)
    p_att = torch.zeros((n, p_len), dtype=torch.long)
    r_att = torch.zeros((n, r_len), dtype=torch.long)
    mask = torch.zeros((n, r_len), dtype=torch.float32)
    logprobs = torch.zeros((n, r_len), dtype=torch.float32)
    rewards = torch.zeros((n, r_len), dtype=torch.float32)
    for i, s in enumerate(samples):
        lp, lr = len(s.prompt), len(s.response)
        if lp:
            prompts[i, p_len - lp :] = torch.tensor(s.prompt, dtype=torch.long)
            p_att[i, p_len - lp :] = 1
        responses[i, :lr] = torch.tensor(s.response, dtype=torch.long)
        r_att[i, :lr] = 1
        mask[i, :lr] = torch.tensor(s.response_mask, dtype=torch.float32)
        logprobs[i, :lr] = torch.tensor(s.logprobs, dtype=torch.float32) * mask[i, :lr]
        rewards[i, :lr] = torch.tensor(s.rewards, dtype=torch.float32)
    attention = torch.cat([p_att, r_att], dim=1)
    position_ids = (attention.cumsum(dim=1) - 1).clamp(min=0)
    return TrainBatch(
        prompts=prompts,
        responses=responses,
        input_ids=torch.cat([prompts, responses], dim=1),
        attention_mask=attention,
        position_ids=position_ids,
        response_mask=mask,
        rollout_log_probs=logprobs,
        token_level_rewards=rewards,
        uids=[s.uid for s in samples],
        trajectory_ids=[s.trajectory_id for s in samples],
        policy_ids=[s.policy_id for s in samples],
        roles=[s.role for s in samples],
        policy_versions=[s.policy_version for s in samples],
        turn_indices=[s.turn_index for s in samples],
    )


def narrow(batch: TrainBatch) -> TrainBatch:
    """``batch`` without the columns that are padding in every row: the leading prompt columns and the
    trailing response columns no row reaches. A ``select`` of some rows of ``collate(samples)`` narrowed is
    ``collate`` of just those rows' samples (a shared learner's batch holds several policies' samples, each
    policy's advantages are computed on its own rows at its own widths)."""
    p_len = batch.prompts.shape[1]
    attention = batch.attention_mask
    lead = p_len - int(attention[:, :p_len].sum(dim=1).max()) if len(batch) else p_len
    r_keep = int(attention[:, p_len:].sum(dim=1).max()) if len(batch) else 0
    updates: dict[str, Any] = {"prompts": batch.prompts[:, lead:]}
    for key in ("input_ids", "attention_mask", "position_ids"):
        updates[key] = getattr(batch, key)[:, lead : p_len + r_keep]
    for f in fields(batch):
        value = getattr(batch, f.name)
        if f.name not in updates and isinstance(value, torch.Tensor):
            updates[f.name] = value[:, :r_keep]  # every other tensor is [B, R]
    return replace(batch, **updates)


def split_by_policy(samples: Sequence[Sample]) -> dict[str, list[Sample]]:
    """Samples of each trained policy (IPPO: every policy gets its own batch and learner)."""
    out: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        out[s.policy_id].append(s)
    return dict(out)
