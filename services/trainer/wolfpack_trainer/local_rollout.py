"""In-process rollouts for a single machine: the learner's own model plays games and emits real
``Trajectory`` protos (exact prompt/response ids and sampler logprobs), the same messages the rollout
service puts on the stream.

Why it exists next to the rollout service: on a 2-core CPU box the demo and the learning-signal test
cannot afford gRPC hops and a weight push per update for a model this small; playing with the learner's
current weights is on-policy by construction. ``wolfpack train`` uses the rollout service's driver when
the config says ``rollout.mode: service``; both paths feed the same ``batch.py``.

Prompts are step-independent: the chat template applied to the seat's current observation text (which
in scenarios holds the conversation so far). Logprobs follow the Turn convention: log softmax(logits / T)
at the sampled token, before any truncation. Rewards are the reward service's own specs, scored in
process by the library (``wolfpack_rewards.score``; the game's default spec unless one is named), so a
local trajectory holds exactly what the service would have written: scenario games also record the
scripted seats' messages in play order (the spec re-verifies the transcript) and carry their scenario.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_games import GameEnv, get_game, make_game
from wolfpack_games.scenarios import GAME_CLASSES as SCENARIO_GAMES
from wolfpack_games.scenarios.wire import scenario_to_pb
from wolfpack_rewards import resolve_spec, score
from wolfpack_rewards.outcome import SeatResult, outcome_value


@dataclass(frozen=True)
class Generated:
    token_ids: list[int]
    logprobs: list[float]
    finish: int  # common_pb2.FinishReason


@torch.no_grad()
def sample(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_tokens: int,
    temperature: float,
    eos_ids: Sequence[int],
    pad_id: int,
    generator: torch.Generator | None = None,
) -> list[Generated]:
    """Batched sampling with a KV cache, left padding and explicit position ids (so a sequence's
    positions do not depend on its neighbours' lengths). ``temperature`` 0 is greedy (logprobs at T=1)."""
    n = len(prompts)
    if n == 0:
        return []
    width = max(len(p) for p in prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    att = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        att[i, width - len(p) :] = 1
    pos = (att.cumsum(1) - 1).clamp(min=0)
    t = temperature if temperature > 0 else 1.0
    eos = torch.tensor(list(eos_ids), dtype=torch.long)
    out_ids: list[list[int]] = [[] for _ in range(n)]
    out_lp: list[list[float]] = [[] for _ in range(n)]
    finished = torch.zeros(n, dtype=torch.bool)
    past = None
    step_ids, step_pos = ids, pos
    for _ in range(max_tokens):
        res = model(
            input_ids=step_ids,
            attention_mask=att,
            position_ids=step_pos,
            past_key_values=past,
            use_cache=True,
        )
        past = res.past_key_values
        logp = torch.log_softmax(res.logits[:, -1, :].float() / t, dim=-1)
        if temperature > 0:
            nxt = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
        else:
            nxt = logp.argmax(-1)
        lp = logp.gather(1, nxt.unsqueeze(1)).squeeze(1)
        for i in range(n):
            if not finished[i]:
                out_ids[i].append(int(nxt[i]))
                out_lp[i].append(float(lp[i]))
        finished |= torch.isin(nxt, eos)
        if bool(finished.all()):
            break
        step_ids = nxt.unsqueeze(1)
        step_pos = step_pos[:, -1:] + 1
        att = torch.cat([att, torch.ones((n, 1), dtype=torch.long)], dim=1)
    return [
        Generated(
            out_ids[i],
            out_lp[i],
            common_pb2.FINISH_REASON_STOP
            if out_ids[i] and out_ids[i][-1] in set(eos_ids)
            else common_pb2.FINISH_REASON_LENGTH,
        )
        for i in range(n)
    ]


def render_prompt(tokenizer: Any, observation: str, max_tokens: int = 0) -> list[int]:
    """The chat template over one user message, tokenized once; left-truncated to ``max_tokens``."""
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": observation}], add_generation_prompt=True, tokenize=True
    )
    if not isinstance(ids, list):
        ids = list(ids["input_ids"])
    return list(ids[-max_tokens:]) if max_tokens > 0 else list(ids)


@dataclass(frozen=True)
class Task:
    """One episode to play: game, variant, seed, which seats the trainee policies take."""

    game_id: str
    variant: str
    seed: int
    trainee_seats: Mapping[int, str]
    """seat → policy id; every other seat is played by ``bot``."""
    trainee_roles: Mapping[str, str] = field(default_factory=dict)
    """role → policy id, resolved after ``reset`` (Werewolf deals roles by seed); adds to ``trainee_seats``."""
    bot: str = "heuristic"
    group_id: str = ""
    group_size: int = 1
    options: Mapping[str, Any] = field(default_factory=dict)
    """Engine ``reset`` options (``game.options``, plus ``language`` when not "en")."""
    opponent_policy: str = ""
    """A served opponent policy for the other seats (service mode only; local play refuses it)."""


@dataclass
class _Live:
    task: Task
    env: GameEnv
    traj: trajectory_pb2.Trajectory
    rng: random.Random
    attempts: dict[int, int] = field(default_factory=dict)
    """seat → how many times its current decision was re-prompted (``Turn.attempt``)."""


PolicyFn = Callable[[str, list[list[int]]], list[Generated]]
"""(policy id, prompts) → generations: how a batch of trainee decisions is answered."""


def play(
    tasks: Sequence[Task],
    policy: PolicyFn,
    tokenizer: Any,
    *,
    versions: Mapping[str, int] | None = None,
    reward_spec: str = "",
    invalid_penalty: float | None = None,
    max_steps: int = 200,
    sampling: common_pb2.SamplingParams | None = None,
    max_prompt_tokens: int = 0,
) -> list[trajectory_pb2.Trajectory]:
    """Play every task to the end, batching the trainee decisions of all episodes at each step, and
    score each trajectory with ``reward_spec`` (empty: the game's default, as the reward service does).

    ``invalid_penalty``, when given, must equal the spec's penalty for an invalid turn: a spec's
    ``name@version`` says how its rewards were made, so a different penalty is a different (registered)
    spec, never a silent override. ``max_prompt_tokens`` > 0 keeps only the last that many prompt tokens
    (the latest part of the observation and the generation prompt): a cost knob for small CPU runs."""
    for game_id in {t.game_id for t in tasks}:
        configured = resolve_spec(reward_spec, game_id).config.penalties.invalid
        if invalid_penalty is not None and invalid_penalty != configured:
            raise ValueError(
                f"invalid_penalty {invalid_penalty} differs from reward spec "
                f"{resolve_spec(reward_spec, game_id).key}'s {configured}; name a spec variant with that "
                "penalty instead (reward specs are registered by name@version)"
            )
    live = []
    for task in tasks:
        if task.opponent_policy:
            raise ValueError(
                f"opponent policy {task.opponent_policy!r} is served by inference: service mode only"
            )
        env = make_game(task.game_id, task.variant)
        env.reset(seed=task.seed, options=dict(task.options))
        if task.trainee_roles:
            seats = dict(task.trainee_seats)
            for seat in env.possible_agents:
                if env.role(seat) in task.trainee_roles:
                    seats[seat] = task.trainee_roles[env.role(seat)]
            task = replace(task, trainee_seats=seats)
        traj = trajectory_pb2.Trajectory(
            trajectory_id=uuid.uuid4().hex,
            episode_id=f"local-{task.game_id}-{task.seed}-{uuid.uuid4().hex[:8]}",
            task_id=f"{task.game_id}/{task.variant}/{task.seed}",
            seed=task.seed,
            group_id=task.group_id,
            group_size=task.group_size,
        )
        traj.game.game_id, traj.game.variant = task.game_id, task.variant
        if task.game_id in SCENARIO_GAMES:  # the spec re-verifies the transcript against it
            traj.scenario.CopyFrom(scenario_to_pb(env.active_scenario))  # type: ignore[attr-defined]
        for seat in env.possible_agents:
            b = traj.seats.add(seat=seat)
            if seat in task.trainee_seats:
                b.policy.policy_id = task.trainee_seats[seat]
                b.policy.version = (versions or {}).get(task.trainee_seats[seat], 0)
            else:
                b.bot = task.bot
        # The bots' RNG is the environment service's (``sessions.EpisodeManager.create``: one
        # ``random.Random(seed)`` per episode, drawn in acting-seat order), so a seed is the same game here
        # and through the services given the same trainee moves.
        live.append(_Live(task, env, traj, random.Random(task.seed)))
    for _ in range(max_steps):
        active = [lv for lv in live if not lv.env.done]
        if not active:
            break
        decisions: dict[str, list[tuple[_Live, int, str, list[int]]]] = {}
        moves: dict[int, dict[int, Any]] = {id(lv): {} for lv in active}
        added: dict[int, list[trajectory_pb2.Turn]] = {id(lv): [] for lv in active}
        for lv in active:
            bots = get_game(lv.task.game_id).bots
            for seat in lv.env.acting_seats():
                if seat in lv.task.trainee_seats:
                    obs = lv.env.observe(seat).text
                    ids = render_prompt(tokenizer, obs, max_prompt_tokens)
                    decisions.setdefault(lv.task.trainee_seats[seat], []).append((lv, seat, obs, ids))
                else:
                    moves[id(lv)][seat] = bots[lv.task.bot](lv.env, seat, lv.rng)
        for policy_id, items in decisions.items():
            gens = policy(policy_id, [it[3] for it in items])
            for (lv, seat, obs, ids), gen in zip(items, gens, strict=True):
                text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
                t = trajectory_pb2.Turn(
                    seat=seat,
                    attempt=lv.attempts.get(seat, 0),
                    observation_text=obs,
                    response_text=text,
                    finish_reason=gen.finish,  # type: ignore[arg-type]
                )
                t.prompt_token_ids.extend(ids)
                t.response_token_ids.extend(gen.token_ids)
                t.response_logprobs.extend(gen.logprobs)
                t.policy.policy_id = policy_id
                t.policy.version = (versions or {}).get(policy_id, 0)
                if sampling is not None:
                    t.sampling.CopyFrom(sampling)
                moves[id(lv)][seat] = text
                added[id(lv)].append(t)
        for lv in active:
            if not moves[id(lv)]:
                continue
            applied = len(lv.env.transcript) if lv.task.game_id in SCENARIO_GAMES else 0  # type: ignore[attr-defined]
            result = lv.env.step(moves[id(lv)])
            for t in added[id(lv)]:  # this step's trainee turns: valid or not, from the engine's infos
                info = result.infos.get(t.seat, {})
                t.valid = not info.get("invalid_reason")
                t.invalid_reason = str(info.get("invalid_reason", ""))
                t.defaulted = bool(info.get("defaulted", False))
                lv.attempts[t.seat] = 0 if t.valid or t.defaulted else t.attempt + 1  # re-prompts count up
            if lv.task.game_id in SCENARIO_GAMES:
                messages = lv.env.transcript[applied:]  # type: ignore[attr-defined]
                _append_turns(lv.traj, _in_play_order(added[id(lv)], messages))
            else:
                _append_turns(lv.traj, added[id(lv)])
    for lv in live:
        _finish(lv, reward_spec)
    return [lv.traj for lv in live]


def _in_play_order(
    trainee: Sequence[trajectory_pb2.Turn], messages: Sequence[tuple[int, str]]
) -> list[trajectory_pb2.Turn]:
    """One step's turns in the order the game applied them (its transcript), as the rollout service
    records scenario games: a trainee's turn where its message was applied (a defaulted one carries the
    default text the engine applied as ``action.text``), a scripted seat's message as a turn without
    tokens or policy, and the trainee turns the game did not apply (re-prompted) last."""
    pending = {t.seat: t for t in trainee}
    out: list[trajectory_pb2.Turn] = []
    for seat, text in messages:
        turn = pending.pop(seat, None)
        if turn is None:
            turn = trajectory_pb2.Turn(seat=seat, response_text=text, valid=True)
        turn.action.text = text
        out.append(turn)
    out.extend(pending.values())
    return out


def _append_turns(traj: trajectory_pb2.Trajectory, turns: Sequence[trajectory_pb2.Turn]) -> None:
    for turn in turns:
        turn.index = len(traj.turns)
        traj.turns.append(turn)


_KINDS = {1: common_pb2.OUTCOME_KIND_WIN, 0: common_pb2.OUTCOME_KIND_DRAW, -1: common_pb2.OUTCOME_KIND_LOSS}


def _finish(lv: _Live, reward_spec: str) -> None:
    """Outcomes from the game, then the rewards of the named spec (``wolfpack_rewards.score``): the
    trajectory comes back filled as the reward service fills it."""
    env, traj = lv.env, lv.traj
    outcome = env.outcome() if env.done else {}
    traj.winner = env.winner() if env.done else ""
    for seat in env.possible_agents:
        kind = _KINDS.get(int(outcome[seat]), common_pb2.OUTCOME_KIND_DRAW) if env.done else None
        traj.outcomes.add(
            seat=seat, role=env.role(seat), team=env.team(seat),
            outcome=kind if kind is not None else common_pb2.OUTCOME_KIND_ABORTED,  # type: ignore[arg-type]
        )  # fmt: skip
    if not env.done:
        traj.metadata["truncated"] = "max_steps"
    traj.metadata["local"] = "1"
    traj.policy_versions.extend(
        {(b.policy.policy_id, b.policy.version): b.policy for b in traj.seats if b.policy.policy_id}.values()
    )
    spec = resolve_spec(reward_spec, traj.game.game_id)
    if traj.turns:
        traj.CopyFrom(score(traj, spec.key).trajectory)
        return
    # No seat acted (e.g. every trainee eliminated first): the spec's value of each seat's outcome, the
    # terminal-only reward it gives a seat without turns (the reward service refuses turnless trajectories).
    traj.reward_spec = spec.key
    for o in traj.outcomes:
        o.final_reward = outcome_value(SeatResult(o.seat, o.role, o.team, o.outcome), spec.config.outcome)
