"""Werewolf per-turn decision rewards: a vote, inspection, poison, save or shot judged by its target's team.

Why: a village that never wins (SmolLM2 against the heuristic wolves starts at 0 wins) gets the same -1
on every game, so GAE/GRPO see no difference between a vote for a wolf and a vote for a fellow villager.
These rules pay a small +w / -w on the turn where the decision was made, from what the ``Trajectory``
holds and nothing else: the applied ``turn.action`` (kind and target) and every seat's team in
``trajectory.outcomes``. The target's team is the truth at the end of the game, which the seat did not know
when it chose; that is the point (the reward says which choices help the team), and the team outcome
(+-1) still dominates at the default weights.

What is not rewarded, because the trajectory cannot say it:

* the guard's protection: whether it covered the wolves' victim needs the night's kill target, which is
  in the trajectory only when the wolves are policy seats (Werewolf trajectories hold policy turns only),
  and even then a tied wolf vote is broken by the engine's RNG;
* a defaulted or rejected turn: the engine (or nobody) chose that action, not the policy;
* speeches, sheriff votes, badge passes, wolf kill votes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from wolfpack.v1 import trajectory_pb2
from wolfpack_games.werewolf.models import (
    K_INSPECT,
    K_POISON,
    K_SAVE,
    K_SHOOT,
    K_VOTE,
    TEAM_VILLAGE,
    TEAM_WOLVES,
)
from wolfpack_rewards.config import RoleConfig

_TEAMS = (TEAM_VILLAGE, TEAM_WOLVES)


def decision_reward(kind: str, actor_team: str, target_team: str, cfg: RoleConfig) -> float:
    """The reward of one decision (0.0 when no rule applies).

    ``vote``/``poison``/``shoot``: +w at the other team, -w at the own team. ``save``: +w for the own team,
    -w for the other (the engine offers the save only on the wolves' victim). ``inspect``: +w when a
    village seat inspects a wolf, else nothing (a "good" result is not a mistake)."""
    if actor_team not in _TEAMS or target_team not in _TEAMS:
        return 0.0
    other = target_team != actor_team
    if kind == K_VOTE:
        return cfg.vote if other else -cfg.vote
    if kind == K_POISON:
        return cfg.poison if other else -cfg.poison
    if kind == K_SHOOT:
        return cfg.shoot if other else -cfg.shoot
    if kind == K_SAVE:
        return -cfg.save if other else cfg.save
    if kind == K_INSPECT:
        return cfg.inspect if actor_team == TEAM_VILLAGE and target_team == TEAM_WOLVES else 0.0
    return 0.0


def role_components(
    turns: Sequence[trajectory_pb2.Turn], teams: Mapping[int, str], cfg: RoleConfig
) -> dict[int, dict[str, float]]:
    """Position in ``turns`` -> ``{"role_<kind>": reward}`` for every turn a rule pays (non-zero only).

    A turn counts when the policy's own answer was applied (``valid`` and not ``defaulted``) and its
    action has a target seat whose team ``teams`` knows."""
    out: dict[int, dict[str, float]] = {}
    if not any((cfg.vote, cfg.inspect, cfg.poison, cfg.save, cfg.shoot)):
        return out
    for position, turn in enumerate(turns):
        if not turn.valid or turn.defaulted or not turn.action.HasField("target"):
            continue
        kind = turn.action.kind
        value = decision_reward(kind, teams.get(turn.seat, ""), teams.get(turn.action.target, ""), cfg)
        if value:
            out[position] = {f"role_{kind}": value}
    return out
