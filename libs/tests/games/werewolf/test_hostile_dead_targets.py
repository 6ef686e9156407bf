"""Votes and powers aimed at dead players, in every phase that takes a target (issue 20: an exile vote
accepting a dead player survived the whole suite, since no rule test voted after a death).

Seeded games on every preset, with the sheriff, the revote tie rule and each role power on, are played
with random legal moves. At every decision after the first death, every acting seat's targeted actions
are checked: no dead player is a legal target, the rule check names the dead player, and a step that
aims at a dead player (nothing re-prompted) applies nothing to it — the dead stay dead, no event names
them as that action's target, and the game goes on. The test also asserts that each targeted phase was
reached with someone dead, so a preset change cannot silently skip one.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from wolfpack_games.base import Action
from wolfpack_games.werewolf import WerewolfEnv
from wolfpack_games.werewolf.models import (
    K_BADGE,
    K_ELECT,
    K_INSPECT,
    K_KILL,
    K_POISON,
    K_PROTECT,
    K_SHOOT,
    K_VOTE,
)

TARGETED = (K_KILL, K_PROTECT, K_INSPECT, K_POISON, K_SHOOT, K_BADGE, K_VOTE, K_ELECT)
MUST_COVER = {K_KILL, K_INSPECT, K_VOTE, K_PROTECT, K_POISON, K_SHOOT, K_BADGE}
"""Targeted kinds every run of this test must have checked with a dead player on the board (``elect``
happens on day 1, before anyone can be dead, when the first night kills nobody)."""

VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("6p", {}),
    ("9p", {"sheriff": True, "tie_rule": "revote"}),
    ("12p", {"sheriff": True, "tie_rule": "revote"}),
    ("12p", {"tie_rule": "no_exile"}),
]


def _game(variant: str, options: dict[str, Any], seed: int) -> WerewolfEnv:
    opts = {"wolf_chat_rounds": 0, "discussion_rounds": 0, "max_reprompts": 0, **options}
    env = WerewolfEnv(variant, **opts)
    env.reset(seed=seed)
    return env


def _random_move(env: WerewolfEnv, seat: int, rng: random.Random) -> Action:
    la = rng.choice(env.legal_actions(seat))
    if la.needs_text:
        return Action(la.kind, None, "hi")
    return Action(la.kind, rng.choice(la.targets) if la.targets else None)


def _play(variant: str, options: dict[str, Any], seed: int, covered: set[str]) -> None:
    env = _game(variant, options, seed)
    rng = random.Random(seed)
    for _ in range(2000):
        if env.done:
            return
        acting = env.acting_seats()
        dead = [i for i, alive in enumerate(env.alive) if not alive]
        moves = {seat: _random_move(env, seat, rng) for seat in acting}
        if dead:
            for seat in acting:
                for la in env.legal_actions(seat):
                    if la.kind not in TARGETED:
                        continue
                    assert not set(la.targets) & set(dead), (env.phase, la, dead)
                    for d in dead:
                        assert env._check(seat, Action(la.kind, d)) == f"player {d + 1} is dead", (
                            env.phase,
                            la.kind,
                            d,
                        )
                    covered.add(la.kind)
            # One seat's move aimed at a dead player: it must apply nothing to that player.
            seat = rng.choice(acting)
            targeted = [la for la in env.legal_actions(seat) if la.kind in TARGETED]
            if targeted:
                victim = rng.choice(dead)
                moves[seat] = Action(rng.choice(targeted).kind, victim)
                before = len(env.events)
                env.step(moves)
                assert not env.alive[victim], "a dead player came back"
                hits = [ev for ev in env.events[before:] if ev.target == victim]
                assert not hits, (moves[seat], hits)
                continue
        env.step(moves)
    raise AssertionError("the game did not end within 2000 steps")


@pytest.mark.parametrize(("variant", "options"), VARIANTS, ids=[f"{v}-{o}" for v, o in VARIANTS])
def test_no_vote_or_power_lands_on_a_dead_player(variant: str, options: dict[str, Any]) -> None:
    covered: set[str] = set()
    for seed in range(40):
        _play(variant, options, seed, covered)
    expected = MUST_COVER & _kinds_of(variant, options)
    assert expected <= covered, f"never checked with a dead player: {sorted(expected - covered)}"


def _kinds_of(variant: str, options: dict[str, Any]) -> set[str]:
    """The targeted kinds this configuration has at all (a 6p game has no guard or hunter)."""
    env = _game(variant, options, 0)
    roles = set(env.roles)
    kinds = {K_KILL, K_VOTE}
    if "seer" in roles:
        kinds.add(K_INSPECT)
    if "guard" in roles:
        kinds.add(K_PROTECT)
    if "witch" in roles:
        kinds.add(K_POISON)
    if roles & {"hunter", "wolf_king"}:
        kinds.add(K_SHOOT)
    if env.config.sheriff:
        kinds.add(K_BADGE)
    return kinds
