"""Rule tests written for mutants that survived ``test_rules.py`` (bench/results/2026-11-26-mutation-games.md).

Each test states a rule of the game and checks it on fixed seating with scripted actions; the expected
values are read off the rule (seat numbers are 0-based in the API, "player N" is 1-based in messages).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from wolfpack_games.base import Action
from wolfpack_games.werewolf import WerewolfEnv
from wolfpack_games.werewolf.models import (
    PH_DISCUSSION,
    PH_SEER,
    PH_SHERIFF,
    PH_SHOOT,
    PH_VOTE,
    PH_WITCH,
    PH_WOLF_CHAT,
    PH_WOLF_VOTE,
)

W, V, S, WI, H, G, K = "werewolf", "villager", "seer", "witch", "hunter", "guard", "wolf_king"
SIX = [W, W, S, WI, V, V]
TWELVE = [W, W, W, W, S, WI, H, G, V, V, V, V]


def game(seat_roles: list[str], **options: Any) -> WerewolfEnv:
    opts: dict[str, Any] = {
        "wolf_chat_rounds": 0,
        "discussion_rounds": 0,
        "last_words": "never",
        "exile_last_words": False,
        "max_reprompts": 0,
    }
    opts.update(options)
    env = WerewolfEnv(seat_roles=seat_roles, **opts)
    env.reset(seed=1)
    return env


def skip_speech(env: WerewolfEnv) -> None:
    while not env.done and env.legal_actions(env.acting_seats()[0])[0].kind == "speak":
        env.step({env.acting_seats()[0]: Action("speak", None, "hi")})


def night(env: WerewolfEnv, kill: int, guard: int | None = None, witch: Action | None = None) -> None:
    """All wolves kill ``kill``; the guard protects ``guard`` (or passes), the seer inspects by default,
    the witch does ``witch`` (or passes)."""
    skip_speech(env)
    assert env.phase == PH_WOLF_VOTE
    env.step({s: Action("kill", kill) for s in env.acting_seats()})
    if env.phase == "night_guard":
        (g,) = env.acting_seats()
        env.step({g: Action("protect", guard) if guard is not None else Action("pass")})
    if env.phase == PH_SEER:
        (s,) = env.acting_seats()
        env.step({s: env.default_action(s)})
    if env.phase == PH_WITCH:
        (w,) = env.acting_seats()
        env.step({w: witch or Action("pass")})


def vote(env: WerewolfEnv, ballots: dict[int, int]) -> None:
    skip_speech(env)
    assert env.phase == PH_VOTE, env.phase
    env.step({s: Action("vote", ballots[s]) if s in ballots else Action("pass") for s in env.acting_seats()})


def kinds(env: WerewolfEnv, seat: int) -> set[str]:
    return {la.kind for la in env.legal_actions(seat)}


def dead(env: WerewolfEnv) -> set[int]:
    return {i for i, a in enumerate(env.alive) if not a}


@pytest.mark.parametrize(
    ("seat_roles", "announced"),
    [
        (SIX, "werewolf:2,villager:2,seer:1,witch:1"),
        (TWELVE, "werewolf:4,villager:4,seer:1,witch:1,hunter:1,guard:1"),
        ([K, W, S, WI, V, V, V, V], "werewolf:1,wolf_king:1,villager:4,seer:1,witch:1"),
    ],
)
def test_game_start_announces_the_role_counts(seat_roles: list[str], announced: str) -> None:
    """The public setup line: how many of each role are in play (in the rule book's role order)."""
    env = game(seat_roles)
    [start] = [e for e in env.events if e.kind == "game_start"]
    assert (start.channel, start.text) == ("public", announced)


def test_revote_elect_outside_the_tied_pair_names_the_rule() -> None:
    """In a sheriff revote only the tied candidates may be elected; the reason says so, even when the
    chosen player is the one the guard protected last night."""
    env = game(TWELVE, sheriff=True, win_rule="side_kill", tie_rule="revote")
    night(env, 8, guard=8)  # the guard protects seat 8: last_protected = 8
    assert dead(env) == set()
    env.step({s: Action("elect", 4 if s < 6 else 5) for s in env.acting_seats()})  # 6 : 6
    assert env.phase == PH_SHERIFF and 0 in env.acting_seats()
    assert env.legal_actions(0)[0].targets == (4, 5)
    assert env._check(0, Action("elect", 8)) == "you cannot elect player 9 now"
    assert env._check(0, Action("elect", 9)) == "you cannot elect player 10 now"


def test_no_sheriff_votes_means_no_revote() -> None:
    """Under the revote rule a revote is only for a tie between candidates; no votes at all is not a tie."""
    env = game(TWELVE, sheriff=True, win_rule="side_kill", tie_rule="revote")
    night(env, 8, guard=8)
    env.step({s: Action("pass") for s in env.acting_seats()})
    assert env.sheriff == -1 and env.phase != PH_SHERIFF
    assert not any(e.kind == "revote" for e in env.events)
    [ev] = [e for e in env.events if e.kind == "sheriff"]
    assert (ev.target, ev.text) == (-1, "no_votes")


def test_each_decision_gets_its_own_reprompts() -> None:
    """``max_reprompts`` counts per decision: a seat re-prompted once at night, then acting validly, gets
    a fresh re-prompt for its next invalid answer the next day."""
    env = game(SIX, max_reprompts=1)
    r = env.step({0: "dance", 1: Action("kill", 4)})
    assert r.infos[0]["invalid_reason"] and "defaulted" not in r.infos[0]
    env.step({0: Action("kill", 4)})
    env.step({2: Action("inspect", 0)})
    env.step({3: Action("pass")})
    assert dead(env) == {4}
    skip_speech(env)
    assert env.phase == PH_VOTE
    r = env.step({0: "dance"})
    assert r.infos[0]["invalid_reason"] and "defaulted" not in r.infos[0]
    assert 0 in env.acting_seats()
    r = env.step({0: "dance"})
    assert r.infos[0]["defaulted"] and r.infos[0]["penalty"]


def test_wolves_have_no_target_before_tonight_s_vote() -> None:
    """A wolf's ``wolf_target`` is tonight's victim: -1 until the wolves have voted, on every night."""
    env = game(SIX, wolf_chat_rounds=1)
    assert env.phase == PH_WOLF_CHAT and env.knowledge(0).wolf_target == -1
    night(env, 4)
    assert dead(env) == {4}
    vote(env, {})  # nobody exiled: night 2 starts with wolf chat
    assert env.phase == PH_WOLF_CHAT and env.day == 2
    assert env.knowledge(0).wolf_target == -1 and env.knowledge(1).wolf_target == -1
    skip_speech(env)
    env.step({s: Action("kill", 5) for s in env.acting_seats()})
    assert env.knowledge(0).wolf_target == 5


def test_wolf_king_from_json_seat_roles_shoots_when_exiled() -> None:
    """Roles that arrive as data (JSON over the wire, not the source's string constants) follow the same
    rules: an exiled wolf king shoots."""
    roles = json.loads(
        '["wolf_king", "werewolf", "seer", "witch", "villager", "villager", "villager", "villager"]'
    )
    env = game(roles, win_rule="parity")
    night(env, 4)
    vote(env, dict.fromkeys(range(8), 0) | {0: 5})
    assert 0 in dead(env)
    assert env.phase == PH_SHOOT and env.acting_seats() == [0]


def test_knowledge_phase_is_hidden_only_at_night() -> None:
    """The acting seer sees her phase; during the day discussion a seat that is not speaking still sees
    the day phase (only night turns are hidden)."""
    env = game(SIX, discussion_rounds=1)
    env.step({s: Action("kill", 4) for s in env.acting_seats()})
    assert env.phase == PH_SEER
    assert env.knowledge(2).phase == PH_SEER
    assert {env.knowledge(s).phase for s in (3, 4, 5)} == {"night"}
    env.step({2: Action("inspect", 0)})
    env.step({3: Action("pass")})
    assert env.phase == PH_DISCUSSION
    speaker = env.acting_seats()[0]
    listeners = [s for s in range(6) if env.alive[s] and s != speaker]
    assert {env.knowledge(s).phase for s in listeners} == {PH_DISCUSSION}
    assert {env.observe(s).phase for s in listeners} == {PH_DISCUSSION}


def test_witch_wrong_kind_after_poison_is_not_a_legal_action() -> None:
    """Once her poison is spent, a witch who answers with another role's action is told the action is not
    legal in her phase (the "poison already used" reason is for a poison attempt only)."""
    env = game(SIX)
    night(env, 4, witch=Action("poison", 0))
    assert dead(env) == {0, 4}
    vote(env, {})
    skip_speech(env)
    env.step({1: Action("kill", 5)})
    env.step({2: Action("inspect", 1)})
    assert env.phase == PH_WITCH and kinds(env, 3) == {"save", "pass"}
    assert env._check(3, Action("kill", 1)) == "'kill' is not a legal action in phase night_witch"
    assert env._check(3, Action("poison", 1)) == "your poison is already used"


@pytest.mark.parametrize("victim", [2, 4])  # below and above the witch's seat (3)
def test_never_self_save_still_saves_others(victim: int) -> None:
    """``witch_self_save: never`` forbids only saving herself; any other victim can be saved, every night."""
    env = game(SIX, witch_self_save="never")
    env.step({s: Action("kill", victim) for s in env.acting_seats()})
    if env.phase == PH_SEER:
        env.step({2: Action("inspect", 0)})
    assert env.phase == PH_WITCH and "save" in kinds(env, 3)
    assert env.legal_actions(3)[0].targets == (victim,)


def test_seer_in_seat_zero_inspects() -> None:
    env = game([S, W, W, WI, V, V])
    env.step({s: Action("kill", 4) for s in env.acting_seats()})
    assert env.phase == PH_SEER and env.acting_seats() == [0]
    env.step({0: Action("inspect", 1)})
    assert env.knowledge(0).seer_results == {1: "werewolf"}
