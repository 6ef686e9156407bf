"""Every role power and limit, ties, sheriff and win rules, driven by scripted actions on fixed seating."""

from __future__ import annotations

from typing import Any

import pytest

from wolfpack_games.base import Action
from wolfpack_games.werewolf import WerewolfEnv
from wolfpack_games.werewolf.models import (
    PH_BADGE,
    PH_GAME_OVER,
    PH_GUARD,
    PH_LAST_WORDS,
    PH_SEER,
    PH_SHERIFF,
    PH_SHOOT,
    PH_VOTE,
    PH_WITCH,
    PH_WOLF_VOTE,
)

W, V, S, WI, H, G, K = "werewolf", "villager", "seer", "witch", "hunter", "guard", "wolf_king"


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
    """Answer every speech turn with a short line until a non-speech phase."""
    while not env.done and env.legal_actions(env.acting_seats()[0])[0].kind == "speak":
        env.step({env.acting_seats()[0]: Action("speak", None, "hi")})


def one(env: WerewolfEnv, kind: str, target: int | None = None) -> dict[int, Any]:
    """Act with the single acting seat; returns infos."""
    (seat,) = env.acting_seats()
    return env.step({seat: Action(kind, target)}).infos


def night(
    env: WerewolfEnv,
    kill: int,
    guard: int | None = None,
    inspect: int | None = None,
    witch: Action | None = None,
) -> None:
    """Play one night: all wolves kill ``kill``; optional guard/seer/witch choices (else pass/defaults)."""
    skip_speech(env)
    assert env.phase == PH_WOLF_VOTE
    env.step({s: Action("kill", kill) for s in env.acting_seats()})
    if env.phase == PH_GUARD:
        one(env, "protect", guard) if guard is not None else one(env, "pass")
    if env.phase == PH_SEER:
        seat = env.acting_seats()[0]
        env.step({seat: Action("inspect", inspect) if inspect is not None else env.default_action(seat)})
    if env.phase == PH_WITCH:
        seat = env.acting_seats()[0]
        env.step({seat: witch or Action("pass")})


def vote(env: WerewolfEnv, ballots: dict[int, int]) -> None:
    """Everyone acting votes per ``ballots`` (missing seats abstain)."""
    skip_speech(env)
    assert env.phase == PH_VOTE, env.phase
    env.step({s: Action("vote", ballots[s]) if s in ballots else Action("pass") for s in env.acting_seats()})


def kinds(env: WerewolfEnv, seat: int) -> set[str]:
    return {la.kind for la in env.legal_actions(seat)}


def dead(env: WerewolfEnv) -> set[int]:
    return {i for i, a in enumerate(env.alive) if not a}


# --- witch ---------------------------------------------------------------------------------------------

SIX = [W, W, S, WI, V, V]


def test_witch_saves_once_and_learns_victim_privately() -> None:
    env = game(SIX)
    night(env, 4, witch=Action("save", 4))
    assert dead(env) == set()
    assert any(e.kind == "peaceful_night" for e in env.events)
    victim_events = [e for e in env.events if e.kind == "night_victim"]
    assert victim_events[0].channel == "seat:3" and victim_events[0].target == 4
    vote(env, {})
    night(env, 5)
    # second night: antidote gone
    assert 5 in dead(env)
    second = [e for e in env.events if e.kind == "night_victim"][1]
    assert second.target == 5


def test_witch_cannot_save_twice() -> None:
    env = game(SIX)
    night(env, 4, witch=Action("save", 4))
    vote(env, {})
    skip_speech(env)
    env.step({s: Action("kill", 5) for s in env.acting_seats()})
    env.step({2: Action("inspect", 0)})
    assert env.phase == PH_WITCH
    assert kinds(env, 3) == {"poison", "pass"}
    infos = env.step({3: Action("save", 5)}).infos
    assert "antidote" in infos[3]["invalid_reason"]
    assert infos[3]["defaulted"] and infos[3]["penalty"]
    assert 5 in dead(env)


def test_witch_poisons_once() -> None:
    env = game([*SIX, V], win_rule="parity")
    night(env, 4, witch=Action("poison", 0))
    assert dead(env) == {0, 4}
    vote(env, {})
    skip_speech(env)
    env.step({s: Action("kill", 5) for s in env.acting_seats()})
    env.step({2: Action("inspect", 1)})
    assert kinds(env, 3) == {"save", "pass"}
    infos = env.step({3: Action("poison", 1)}).infos
    assert "poison is already used" in infos[3]["invalid_reason"]


def test_seer_learns_the_true_side_privately() -> None:
    """Seats 0-1 are wolves, 4 a villager (fixed seating): inspecting 0 says werewolf, 4 says good."""
    env = game(SIX)
    night(env, 5, inspect=0)
    vote(env, {})
    night(env, 3, inspect=4)
    assert env.knowledge(2).seer_results == {0: "werewolf", 4: "good"}
    assert env.knowledge(3).seer_results == {} and env.knowledge(4).seer_results == {}
    inspects = [(e.target, e.text, e.channel) for e in env.events if e.kind == "inspect"]
    assert inspects == [(0, "werewolf", "seat:2"), (4, "good", "seat:2")]


def test_witch_one_potion_per_night() -> None:
    """After saving, a second potion the same night is refused, kills nobody and is not spent."""
    env = game(SIX)
    skip_speech(env)
    env.step({s: Action("kill", 4) for s in env.acting_seats()})
    env.step({2: Action("inspect", 0)})
    assert env.phase == PH_WITCH and kinds(env, 3) >= {"save", "poison"}
    env.step({3: Action("save", 4)})
    infos = env.step({3: Action("poison", 0)}).infos  # the second potion, same night
    assert infos[3].get("invalid_reason"), infos
    assert dead(env) == set()  # 4 was saved, 0 was not poisoned
    poisons = [e for e in env.events if e.kind in ("witch_poison", "poison")]
    assert poisons == []
    vote(env, {})
    night(env, 5, witch=Action("poison", 0))  # the poison was not spent: it works the next night
    assert dead(env) == {0, 5}


@pytest.mark.parametrize(
    ("rule", "night1", "night2"),
    [("always", True, True), ("first_night", True, False), ("never", False, False)],
)
def test_witch_self_save_option(rule: str, night1: bool, night2: bool) -> None:
    env = game([W, W, S, WI, V, V, V], witch_self_save=rule)
    skip_speech(env)
    env.step({s: Action("kill", 3) for s in env.acting_seats()})
    env.step({2: Action("inspect", 0)})
    assert ("save" in kinds(env, 3)) is night1
    env.step({3: Action("pass")})  # she dies on night 1 in this branch
    env = game([W, W, S, WI, V, V, V], witch_self_save=rule)
    night(env, 4)  # no save on night 1
    assert 4 in dead(env)
    vote(env, {})
    skip_speech(env)
    env.step({s: Action("kill", 3) for s in env.acting_seats()})
    env.step({2: Action("inspect", 0)})
    assert ("save" in kinds(env, 3)) is night2


# --- hunter ---------------------------------------------------------------------------------------------

NINE = [W, W, W, S, WI, H, V, V, V]


def test_hunter_shoots_when_exiled_and_reveals() -> None:
    env = game(NINE, win_rule="side_kill")
    night(env, 6)
    vote(env, dict.fromkeys(range(9), 5) | {5: 0})
    assert env.phase == PH_SHOOT and env.acting_seats() == [5]
    one(env, "shoot", 0)
    assert 0 in dead(env) and 5 in dead(env)
    shoot = next(e for e in env.events if e.kind == "shoot")
    assert shoot.channel == "public" and shoot.text == "hunter"
    assert env.knowledge(7).revealed == {5: "hunter"}


def test_hunter_shoots_when_killed_at_night() -> None:
    env = game(NINE, win_rule="side_kill")
    night(env, 5)
    assert env.phase == PH_SHOOT and env.acting_seats() == [5]
    one(env, "shoot", 1)
    assert dead(env) == {1, 5}


def test_hunter_cannot_shoot_when_poisoned() -> None:
    env = game(NINE, win_rule="side_kill")
    night(env, 6, witch=Action("poison", 5))
    assert dead(env) == {5, 6}
    assert env.phase != PH_SHOOT
    assert not any(e.kind == "shoot" for e in env.events)


def test_hunter_may_decline_privately() -> None:
    env = game(NINE, win_rule="side_kill")
    night(env, 5)
    one(env, "pass")
    ev = next(e for e in env.events if e.kind == "shoot")
    assert ev.channel == "seat:5" and ev.target == -1


# --- guard ----------------------------------------------------------------------------------------------

TWELVE = [W, W, W, W, S, WI, H, G, V, V, V, V]


def test_guard_protects_and_never_repeats() -> None:
    env = game(TWELVE, win_rule="side_kill")
    night(env, 8, guard=8)
    assert dead(env) == set()
    vote(env, {})
    skip_speech(env)
    env.step({s: Action("kill", 9) for s in env.acting_seats()})
    assert env.phase == PH_GUARD
    protect = env.legal_actions(7)[0]
    assert protect.kind == "protect" and 8 not in protect.targets and 7 in protect.targets
    infos = one(env, "protect", 8)
    assert "last night" in infos[7]["invalid_reason"]


def test_guard_may_repeat_after_a_pass() -> None:
    env = game(TWELVE, win_rule="side_kill")
    night(env, 8, guard=8)
    vote(env, {})
    night(env, 9)  # guard passes night 2
    vote(env, {})
    skip_speech(env)
    env.step({s: Action("kill", 10) for s in env.acting_seats()})
    assert 8 in env.legal_actions(7)[0].targets


@pytest.mark.parametrize(("rule", "dies"), [("dies", True), ("lives", False)])
def test_guard_and_save_on_same_target(rule: str, dies: bool) -> None:
    env = game(TWELVE, win_rule="side_kill", guard_save_rule=rule)
    night(env, 8, guard=8, witch=Action("save", 8))
    assert (8 in dead(env)) is dies


# --- wolf king ------------------------------------------------------------------------------------------


def test_wolf_king_shoots_only_when_exiled() -> None:
    env = game([K, W, S, WI, V, V, V, V], win_rule="parity")
    night(env, 4)
    vote(env, dict.fromkeys(range(8), 0) | {0: 5})
    assert env.phase == PH_SHOOT and env.acting_seats() == [0]
    one(env, "shoot", 2)
    assert {0, 2} <= dead(env)
    assert [e.text for e in env.events if e.kind == "shoot"] == ["wolf_king"]


def test_wolf_king_killed_at_night_does_not_shoot() -> None:
    env = game([K, W, S, WI, V, V, V, V], win_rule="parity")
    night(env, 0)  # wolves knife their own king
    assert 0 in dead(env) and env.phase != PH_SHOOT


def test_wolf_king_option_replaces_a_werewolf() -> None:
    env = WerewolfEnv("12p", wolf_king=True)
    env.reset(seed=3)
    assert sorted(env.roles).count("wolf_king") == 1 and env.roles.count("werewolf") == 3


# --- sheriff --------------------------------------------------------------------------------------------


def sheriff_game(**options: Any) -> WerewolfEnv:
    opts: dict[str, Any] = {"sheriff": True, "win_rule": "side_kill", "tie_rule": "no_exile"}
    opts.update(options)
    return game(TWELVE, **opts)


def test_sheriff_election_and_weighted_vote() -> None:
    env = sheriff_game()
    night(env, 8, guard=8)
    assert env.phase == PH_SHERIFF and len(env.acting_seats()) == 12
    env.step({s: Action("elect", 4) for s in env.acting_seats()})
    assert env.sheriff == 4
    skip_speech(env)
    # sheriff (1.5) + one vote for 0 = 3.5 beats two votes for 1 = ... 2 votes -> 0 exiled
    vote(env, {4: 0, 5: 0, 6: 1, 7: 1})
    assert 0 in dead(env)
    ev = next(e for e in env.events if e.kind == "vote_result")
    assert ev.target == 0


def test_sheriff_weight_breaks_what_would_be_a_tie() -> None:
    env = sheriff_game()
    night(env, 8, guard=8)
    env.step({s: Action("elect", 4) for s in env.acting_seats()})
    vote(env, {4: 0, 6: 1})  # 1.5 vs 1.0
    assert 0 in dead(env) and 1 not in dead(env)
    env2 = sheriff_game(sheriff_vote_weight=1.0)
    night(env2, 8, guard=8)
    env2.step({s: Action("elect", 4) for s in env2.acting_seats()})
    vote(env2, {4: 0, 6: 1})
    assert not ({0, 1} & dead(env2))


def test_badge_passes_when_sheriff_dies() -> None:
    env = sheriff_game()
    night(env, 8, guard=8)
    env.step({s: Action("elect", 9) for s in env.acting_seats()})
    vote(env, {s: 9 for s in range(12) if s != 9})
    assert env.phase == PH_BADGE and env.acting_seats() == [9]
    assert 9 not in env.legal_actions(9)[0].targets
    one(env, "badge", 10)
    assert env.sheriff == 10
    assert [e.target for e in env.events if e.kind == "badge"] == [10]


def test_badge_can_be_torn() -> None:
    env = sheriff_game()
    night(env, 8, guard=8)
    env.step({s: Action("elect", 9) for s in env.acting_seats()})
    vote(env, {s: 9 for s in range(12) if s != 9})
    one(env, "pass")
    assert env.sheriff == -1


def test_nobody_elected_when_everyone_passes() -> None:
    env = sheriff_game()
    assert env.sheriff == -1  # no sheriff before the election
    night(env, 8, guard=8)
    env.step({s: Action("pass") for s in env.acting_seats()})
    assert env.sheriff == -1 and env.phase != PH_SHERIFF
    [ev] = [e for e in env.events if e.kind == "sheriff"]
    assert (ev.target, ev.text) == (-1, "no_votes")


def test_only_the_witch_learns_the_night_victim() -> None:
    env = game(SIX)  # seat 3 is the witch
    skip_speech(env)
    env.step({s: Action("kill", 4) for s in env.acting_seats()})
    env.step({2: Action("inspect", 0)})
    assert env.knowledge(3).night_victim == 4
    assert all(env.knowledge(s).night_victim == -1 for s in (0, 1, 2, 4, 5))


@pytest.mark.parametrize(("order", "first"), [("clockwise", 5), ("counterclockwise", 3)])
def test_speaking_starts_next_to_the_sheriff(order: str, first: int) -> None:
    env = sheriff_game(discussion_rounds=1, speaking_order=order)
    night(env, 8, guard=8)
    env.step({s: Action("elect", 4) for s in env.acting_seats()})
    assert env.sheriff == 4 and env.phase == "day_discussion" and env.acting_seats() == [first]


def test_sheriff_tie_revote() -> None:
    env = sheriff_game(tie_rule="revote")
    night(env, 8, guard=8)
    env.step({s: Action("elect", 4 if s < 6 else 5) for s in env.acting_seats()})
    assert env.phase == PH_SHERIFF
    assert sorted(env.acting_seats()) == [s for s in range(12) if s not in (4, 5)]
    env.step({s: Action("elect", 5) for s in env.acting_seats()})
    assert env.sheriff == 5


# --- ties -----------------------------------------------------------------------------------------------


def test_tie_no_exile() -> None:
    env = game(NINE, win_rule="side_kill", tie_rule="no_exile")
    night(env, 6)
    vote(env, {0: 7, 1: 7, 2: 8, 3: 8})
    assert dead(env) == {6}
    assert [e.text for e in env.events if e.kind == "vote_result"] == ["tie"]
    assert env.phase == PH_WOLF_VOTE  # next night


def test_tie_revote_among_tied() -> None:
    env = game(NINE, win_rule="side_kill", tie_rule="revote")
    night(env, 6)
    vote(env, {0: 7, 1: 7, 2: 8, 3: 8})
    assert env.phase == PH_VOTE
    acting = env.acting_seats()
    assert 7 not in acting and 8 not in acting and 6 not in acting
    assert env.legal_actions(0)[0].targets == (7, 8)
    infos = env.step({0: Action("vote", 3)}).infos
    assert "tied" in infos[0]["invalid_reason"]
    env.step({s: Action("vote", 8) for s in env.acting_seats()})
    assert 8 in dead(env)


def test_revote_tie_again_exiles_nobody() -> None:
    env = game(NINE, win_rule="side_kill", tie_rule="revote")
    night(env, 6)
    vote(env, {0: 7, 1: 7, 2: 8, 3: 8})
    acting = env.acting_seats()
    half = len(acting) // 2
    env.step({s: Action("vote", 7 if i < half else 8) for i, s in enumerate(acting)})
    assert dead(env) == {6} and env.phase == PH_WOLF_VOTE


# --- win rules ------------------------------------------------------------------------------------------


def test_parity_wolves_win() -> None:
    env = game(SIX, win_rule="parity")
    night(env, 4)  # 2 wolves vs 3 good
    assert not env.done
    vote(env, {0: 5, 1: 5, 2: 5})
    assert env.done and env.winner() == "wolves"
    assert env.outcome() == {0: 1, 1: 1, 2: -1, 3: -1, 4: -1, 5: -1}
    assert env.phase == PH_GAME_OVER and env.acting_seats() == []


def test_village_wins_when_wolves_dead() -> None:
    env = game(SIX, win_rule="parity")
    night(env, 4, witch=Action("save", 4))
    vote(env, {2: 0, 3: 0, 4: 0, 5: 0})
    assert not env.done
    night(env, 4, witch=Action("poison", 1))
    assert env.done and env.winner() == "village"
    assert env.outcome()[2] == 1 and env.outcome()[0] == -1


def test_side_kill_villagers_dead() -> None:
    env = game([W, W, S, WI, H, V, V, V, V], win_rule="side_kill")
    night(env, 5)
    vote(env, {0: 6, 1: 6, 2: 6})
    night(env, 7)
    assert not env.done
    vote(env, {0: 8, 1: 8, 2: 8})
    assert env.done and env.winner() == "wolves"
    assert env.alive[2] and env.alive[3]  # gods alive, villagers all dead


def test_side_kill_gods_dead() -> None:
    env = game([W, W, S, WI, V, V, V, V], win_rule="side_kill")
    night(env, 2)
    vote(env, {0: 3, 1: 3})
    assert env.done and env.winner() == "wolves"


def test_parity_is_not_checked_under_side_kill() -> None:
    env = game([W, W, S, WI, V, V, V, V], win_rule="side_kill")
    night(env, 4)
    vote(env, {0: 5, 1: 5})
    night(env, 6)
    assert not env.done  # 2 wolves vs 3 good alive, both sides present


def test_day_limit_is_a_draw() -> None:
    env = game(SIX, max_days=1)
    night(env, 4, witch=Action("save", 4))
    vote(env, {})
    assert env.done and env.winner() == "" and env.truncated
    assert set(env.outcome().values()) == {0}


# --- last words, speaking order ---------------------------------------------------------------------------


def test_last_words_first_night_only() -> None:
    env = game(NINE, win_rule="side_kill", last_words="first_night", exile_last_words=True)
    night(env, 6)
    assert env.phase == PH_LAST_WORDS and env.acting_seats() == [6]
    env.step({6: "Remember me. <think>secret</think>"})
    ev = next(e for e in env.events if e.kind == "last_words")
    assert ev.text == "Remember me." and ev.actor == 6
    vote(env, {0: 7, 1: 7, 2: 7})
    assert env.phase == PH_LAST_WORDS and env.acting_seats() == [7]  # exile last words
    skip_speech(env)
    night(env, 8)
    assert env.phase != PH_LAST_WORDS


@pytest.mark.parametrize("order", ["clockwise", "counterclockwise", "seat_order"])
def test_speaking_order(order: str) -> None:
    env = game(SIX, discussion_rounds=2, speaking_order=order)
    night(env, 4, witch=Action("save", 4))
    speakers = []
    while env.phase == "day_discussion":
        (s,) = env.acting_seats()
        speakers.append(s)
        env.step({s: "hello"})
    assert len(speakers) == 12 and speakers[:6] == speakers[6:]
    if order == "seat_order":
        assert speakers[:6] == list(range(6))
    else:
        step = 1 if order == "clockwise" else -1
        assert all((speakers[i + 1] - speakers[i]) % 6 == step % 6 for i in range(5))


# --- legality & invalid handling -----------------------------------------------------------------------


def test_reprompt_then_default_with_penalty() -> None:
    env = game(SIX, max_reprompts=2)
    skip_speech(env)
    r = env.step({0: "dance", 1: Action("kill", 4)})
    assert r.infos[0]["invalid_reason"] and "defaulted" not in r.infos[0]
    assert env.acting_seats() == [0]
    assert "invalid" in env.observe(0).text and env.observe(0).feedback
    r = env.step({0: Action("kill", 99)})
    assert "no such player" in r.infos[0]["invalid_reason"]
    r = env.step({0: "kill player 9"})
    assert r.infos[0]["defaulted"] and r.infos[0]["penalty"]
    assert env.phase == PH_SEER


def test_legality_reasons() -> None:
    env = game(SIX)
    night(env, 4)
    vote(env, {})
    skip_speech(env)
    env.step({0: Action("kill", 2), 1: Action("kill", 2)})
    assert env.phase == PH_SEER
    assert "dead" in env._check(2, Action("inspect", 4))
    assert "yourself" in env._check(2, Action("inspect", 2))
    assert "not a legal action" in env._check(2, Action("vote", 1))
    assert env.step({0: Action("kill", 1)}).infos[0]["invalid_reason"] == "it is not your turn"


def test_parse_strings_through_step() -> None:
    env = game(SIX)
    skip_speech(env)
    env.step({0: "I'll kill seat 5", 1: '{"action": "kill", "target": 5}'})
    assert [e.target for e in env.events if e.kind == "wolf_kill"] == [4]
    env.step({2: "查验1号"})
    assert [e.target for e in env.events if e.kind == "inspect"] == [0]
    env.step({3: "救"})
    assert dead(env) == set()


def test_config_overrides_and_errors() -> None:
    env = WerewolfEnv("9p")
    env.reset(seed=1, options={"tie_rule": "no_exile", "language": "zh"})
    assert env.config.tie_rule == "no_exile" and env.config.language == "zh"
    assert "号玩家" in env.observe(0).text
    with pytest.raises(ValueError, match="valid options"):
        env.reset(seed=1, options={"nope": 1})
    with pytest.raises(ValueError, match="valid values"):
        WerewolfEnv("6p", win_rule="whatever")
    env.reset(seed=1)
    assert env.config.tie_rule == "revote"  # back to the constructor's config


def test_events_without_an_actor_or_target_say_minus_one() -> None:
    """The event log's convention (GameEvent.actor/target: -1 when none): phase announcements name nobody."""
    env = game(SIX)
    night(env, 4)
    announcements = [e for e in env.events if e.kind in ("night", "day")]
    assert announcements and all((e.actor, e.target) == (-1, -1) for e in announcements)
    assert [e.target for e in env.events if e.kind == "wolf_kill"] == [4]
    vote(env, {})  # everyone passes: each ballot names nobody
    ballots = [e for e in env.events if e.kind == "vote"]
    assert ballots and all(e.target == -1 for e in ballots)
    guarded = game(TWELVE, win_rule="side_kill")
    night(guarded, 8)  # the guard passes
    assert [e.target for e in guarded.events if e.kind == "protect"] == [-1]


def test_whose_night_turn_it_is_stays_hidden() -> None:
    """Non-acting seats see plain "night" (which power roles still act is private); the acting seer sees
    her phase, and so do wolves only in their own phases."""
    env = game(SIX)
    skip_speech(env)
    env.step({s: Action("kill", 4) for s in env.acting_seats()})
    assert env.phase == PH_SEER
    assert env.observe(2).phase == PH_SEER
    assert {env.observe(s).phase for s in (0, 1, 3, 4, 5)} == {"night"}


def test_a_dead_target_is_named_as_players_see_it() -> None:
    env = game(SIX)
    night(env, 4)  # seat 4 is "player 5"
    vote(env, {})
    skip_speech(env)
    env.step({0: Action("kill", 2), 1: Action("kill", 2)})
    assert env._check(2, Action("inspect", 4)) == "player 5 is dead"
