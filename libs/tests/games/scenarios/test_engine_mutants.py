"""Tests written against surviving mutants of the scenario engine (libs/wolfpack_games/scenarios/engine.py).

Each expectation comes from the rules as written in the engine docstring and the family docs, worked out by
hand; none is copied from the engine's output.
"""

from __future__ import annotations

import pytest

from wolfpack_games.base import Action, LegalAction
from wolfpack_games.scenarios import Scenario
from wolfpack_games.scenarios.engine import (
    ScenarioGame,
    game_class,
    redact,
    render_observation,
    render_scenario,
    render_transcript,
)

# A hand-built ultimatum: pot 100; Ann (proposer) wins keeping >= 60, Bob (responder) wins when offered >= 30.
# Turns alternate Ann, Bob, Ann, Bob; four messages at most.
SCENARIO = {
    "family": "ultimatum",
    "difficulty": "easy",
    "template": "ultimatum",
    "public": "Ann and Bob split a pot of 100.",
    "params": {"pot": 100, "first": 0},
    "players": [
        {"seat": 0, "name": "Ann", "role": "proposer", "private": {"target": 60}, "brief": "ANN-SECRET"},
        {"seat": 1, "name": "Bob", "role": "responder", "private": {"threshold": 30}, "brief": "BOB-SECRET"},
    ],
    "max_turns": 4,
}


def _game(max_reprompts: int = 2) -> ScenarioGame:
    env = game_class("ultimatum")(max_reprompts=max_reprompts)
    env.reset(seed=3, options={"scenario": SCENARIO})
    return env


def test_game_class_name_and_ids() -> None:
    cls = game_class("prisoners_dilemma")
    assert cls.__name__ == cls.__qualname__ == "PrisonersDilemmaGame"
    assert cls.game_id == "prisoners_dilemma_v1" and cls.family_name == "prisoners_dilemma"
    assert game_class("trust").__name__ == "TrustGame"


def test_unknown_variant_is_refused() -> None:
    with pytest.raises(KeyError, match="unknown variant"):
        game_class("ultimatum")("giant")


@pytest.mark.parametrize("bad", [-1, 6, True, 1.5, "2"])
def test_max_reprompts_outside_0_to_5_is_refused(bad: object) -> None:
    env = game_class("ultimatum")()
    with pytest.raises(ValueError, match="max_reprompts"):
        env.reset(seed=0, options={"scenario": SCENARIO, "max_reprompts": bad})


@pytest.mark.parametrize("ok", [0, 5])
def test_max_reprompts_bounds_are_allowed(ok: int) -> None:
    env = game_class("ultimatum")()
    env.reset(seed=0, options={"scenario": SCENARIO, "max_reprompts": ok})
    assert env.max_reprompts == ok


def test_before_reset_the_game_says_so() -> None:
    env = game_class("ultimatum")()
    with pytest.raises(RuntimeError, match="reset"):
        _ = env.tracker
    with pytest.raises(RuntimeError, match="reset"):
        _ = env.active_scenario
    assert not env.done


def test_reset_reports_roles_and_private_briefs_per_seat() -> None:
    env = game_class("ultimatum")()
    obs, infos = env.reset(seed=0, options={"scenario": SCENARIO})
    assert sorted(obs) == [0, 1] == env.possible_agents
    assert infos[0]["role"] == "proposer" and infos[1]["role"] == "responder"
    assert infos[0]["scenario_id"] == env.active_scenario.id != ""
    assert "ANN-SECRET" in obs[0].text and "BOB-SECRET" not in obs[0].text
    assert "BOB-SECRET" in obs[1].text and "ANN-SECRET" not in obs[1].text
    private = [(e.channel, e.text) for e in env.events if e.kind == "private"]
    assert private == [("seat:0", "ANN-SECRET"), ("seat:1", "BOB-SECRET")]
    assert env.events[0].kind == "start" and env.events[0].channel == "public"
    assert [e.index for e in env.events] == list(range(len(env.events)))


def test_turns_alternate_and_observations_track_rounds() -> None:
    env = _game()
    assert env.acting_seats() == [0]
    assert env.legal_actions(1) == ()
    assert env.legal_actions(0) == (
        LegalAction("say", needs_text=True),
        LegalAction("final", needs_text=True),
    )
    o0 = env.observe(0)
    assert o0.your_turn and not env.observe(1).your_turn
    assert (o0.round, o0.turn_id, o0.done, o0.role) == (1, 0, False, "proposer")
    env.step({0: "hello"})
    assert env.acting_seats() == [1]
    env.step({1: "hi"})
    # two seats, two messages: round 2, turn 2
    o = env.observe(0)
    assert (o.round, o.turn_id) == (2, 2)
    say_rounds = [e.round for e in env.events if e.kind == "say"]
    assert say_rounds == [1, 1]  # both messages of round 1
    env.step({0: "OFFER: 40"})
    finals = [e for e in env.events if e.kind == "final"]
    assert [e.round for e in finals] == [2] and finals[0].actor == 0


def test_accepted_offer_both_reach_their_targets() -> None:
    env = _game()
    env.step({0: "OFFER: 40"})  # Ann keeps 60 >= 60, Bob gets 40 >= 30
    r = env.step({1: "ACCEPT"})
    assert env.done and r.terminations == {0: True, 1: True} and r.truncations == {0: False, 1: False}
    assert r.rewards == {0: 1.0, 1: 1.0}
    assert r.infos[0]["outcome"] == 1 and r.infos[1]["outcome"] == 1
    assert r.infos[0]["reason"] == r.infos[1]["reason"] == env.result.reason  # type: ignore[union-attr]
    assert env.outcome() == {0: 1, 1: 1}
    assert env.winner() == "proposer,responder"
    assert env.role(1) == env.team(1) == "responder"
    outcome_events = [e for e in env.events if e.kind == "outcome"]
    assert len(outcome_events) == 1 and outcome_events[0].channel == "public"
    # stepping a finished game changes nothing
    again = env.step({0: "OFFER: 1"})
    assert env.transcript == [(0, "OFFER: 40"), (1, "ACCEPT")] and again.rewards == {0: 1.0, 1: 1.0}


def test_rejection_loses_for_both_and_nobody_wins() -> None:
    env = _game()
    env.step({0: "OFFER: 50"})
    r = env.step({1: "REJECT"})
    assert r.rewards == {0: -1.0, 1: -1.0} and env.winner() == ""


def test_running_game_has_no_outcome_or_winner() -> None:
    env = _game()
    r = env.step({0: "OFFER: 50"})
    assert r.rewards == {0: 0.0, 1: 0.0} and r.terminations == {0: False, 1: False}
    assert env.outcome() == {0: 0, 1: 0} and env.winner() == "" and env.result is None
    assert "outcome" not in r.infos[0] and "outcome" not in r.infos[1]


def test_turn_limit_without_decision_loses_for_both() -> None:
    env = _game()
    for seat in (0, 1, 0):
        env.step({seat: "thinking"})
        assert not env.done
    r = env.step({1: "still thinking"})
    assert env.done and r.rewards == {0: -1.0, 1: -1.0} and env.acting_seats() == []


def test_reprompts_then_default_and_penalty() -> None:
    env = _game(max_reprompts=2)
    r1 = env.step({0: "OFFER: 500"})  # outside 0..pot
    assert r1.infos[0]["reprompt"] == 1 and "invalid_reason" in r1.infos[0] and "defaulted" not in r1.infos[0]
    assert env.transcript == [] and env.acting_seats() == [0]
    assert env.observe(0).feedback.startswith("Invalid: ") and env.observe(0).feedback.endswith("Try again.")
    assert env.observe(1).feedback == ""
    assert "Try again." in env.observe(0).text
    r2 = env.step({0: "OFFER: 500"})
    assert r2.infos[0]["reprompt"] == 2
    r3 = env.step({0: "OFFER: 500"})
    assert r3.infos[0]["defaulted"] and r3.infos[0]["penalty"]
    assert r3.infos[0]["default_action"] == Action("say", text="(pass)")
    assert env.transcript == [(0, "(pass)")] and env.acting_seats() == [1]
    assert env.observe(0).feedback == ""
    assert sum(e.kind == "invalid" for e in env.events) == 3


def test_a_valid_message_resets_the_reprompt_count() -> None:
    env = _game(max_reprompts=1)
    assert env.step({0: "OFFER: -3"}).infos[0]["reprompt"] == 1
    env.step({0: "fine"})
    env.step({1: "ok"})
    # a fresh invalid message is a first re-prompt again, not a default
    r = env.step({0: "OFFER: 101"})
    assert r.infos[0]["reprompt"] == 1 and "defaulted" not in r.infos[0]


def test_zero_reprompts_defaults_at_once() -> None:
    env = _game(max_reprompts=0)
    r = env.step({1: "ACCEPT", 0: "ACCEPT"})  # Bob is not acting; Ann may not ACCEPT
    assert r.infos[1] == {"invalid_reason": "it is not your turn", "ignored": True}
    assert r.infos[0]["defaulted"] and env.transcript == [(0, "(pass)")]


@pytest.mark.parametrize(
    ("action", "fragment"),
    [
        (Action("final", text="just talk"), "'final' action must contain a formal statement"),
        (Action("say", text="OFFER: 40"), "'say' action must not contain a formal statement"),
        (Action("shout", text="hello"), "unknown action kind"),
    ],
)
def test_action_kind_must_match_the_text(action: Action, fragment: str) -> None:
    env = _game()
    r = env.step({0: action})
    assert fragment in r.infos[0]["invalid_reason"] and env.transcript == []


def test_structured_actions_of_the_right_kind_are_applied() -> None:
    env = _game()
    env.step({0: Action("final", text="OFFER: 40")})
    env.step({1: Action("final", text="ACCEPT")})
    assert env.outcome() == {0: 1, 1: 1}


def test_parse_classifies_text_and_checks_the_acting_seat() -> None:
    env = _game()
    assert env.parse(0, "OFFER: 40").action == Action("final", text="OFFER: 40")
    assert env.parse(0, "hello").action == Action("say", text="hello")
    bad = env.parse(0, "ACCEPT")  # Ann is acting, but only the responder accepts
    assert bad.action is None and bad.error
    assert env.parse(0, "OFFER: 101").action is None
    assert env.default_action(0) == Action("say", text="(pass)")


def test_redact_drops_only_lines_with_the_keyword() -> None:
    assert (
        redact("I put in seven.\nCONTRIBUTE: 7", "CONTRIBUTE")
        == "I put in seven.\n[sealed decision submitted]"
    )
    # underscores and spaces are ignored when matching, and case too
    assert redact("deal?\nfinal bid: 10\nFinal_Bid 3", "FINAL_BID") == "deal?\n[sealed decision submitted]"
    assert redact("MOVE: D", "MOVE") == "[sealed decision submitted]"


def test_observation_text_before_during_and_after() -> None:
    env = _game()
    t0 = render_observation(env, 0)
    assert "Nobody has spoken yet." in t0 and "Conversation so far:" not in t0
    assert "It is your turn (4 messages left in the game)." in t0
    assert "you are Ann (proposer)" in t0 and "Ann and Bob split a pot of 100." in t0
    assert "Waiting for Ann." in render_observation(env, 1)
    env.step({0: "Take this.\nOFFER: 40"})
    t1 = render_observation(env, 1)
    assert "Conversation so far:" in t1 and "Nobody has spoken yet." not in t1
    assert "  [1] Ann (proposer): Take this.\n    OFFER: 40" in t1
    assert "Offer on the table: 40 for the responder." in t1
    assert "It is your turn (3 messages left in the game)." in t1
    env.step({1: "ACCEPT"})
    lines = render_observation(env, 1).splitlines()
    i = lines.index("  [2] Bob (responder): ACCEPT")
    assert lines[i + 1] == "  * The responder accepted the offer of 40."
    assert lines[-1].startswith("Game over: ") and lines[-1].endswith("Your outcome: +1.")


def test_notes_are_placed_after_the_message_that_caused_them() -> None:
    # prisoner's dilemma: the reveal note follows the second move of the round, not the first
    env = game_class("prisoners_dilemma")("easy")
    env.reset(seed=0)
    env.step({0: "MOVE: C", 1: "MOVE: C"})
    lines = render_observation(env, 0).splitlines()
    idx = [i for i, line in enumerate(lines) if line.startswith("  [")]
    assert len(idx) == 2
    assert not lines[idx[0] + 1].startswith("  * ")
    assert lines[idx[1] + 1].startswith("  * ")


def test_transcript_rendering() -> None:
    env = _game()
    env.step({0: "OFFER: 40"})
    text = render_transcript(env)
    assert text.endswith("Game not finished.\n")
    assert "  Ann (proposer): ANN-SECRET" in text and "  Bob (responder): BOB-SECRET" in text
    assert "[ 1] Ann (proposer): OFFER: 40" in text
    env.step({1: "ACCEPT"})
    lines = render_transcript(env).splitlines()
    i = lines.index("[ 2] Bob (responder): ACCEPT")
    assert lines[i + 1] == "     * The responder accepted the offer of 40."
    assert lines[-2:] == ["  Ann (proposer): +1", "  Bob (responder): +1"]
    assert lines[-3].startswith("Verified outcome: accepted")
    assert render_transcript(env) == render_transcript(env)


def test_scenario_card() -> None:
    sc = Scenario.model_validate(SCENARIO)
    shown, hidden = render_scenario(sc), render_scenario(sc, reveal_private=False)
    assert "  seat 0 Ann (proposer): ANN-SECRET" in shown
    assert "ANN-SECRET" not in hidden and "  seat 1 Bob (responder): (hidden)" in hidden
    assert "Game: ultimatum_v1" in shown and "Max turns: 4" in shown


def test_message_events_carry_the_round_they_were_played_in() -> None:
    # Bug found by a mutant: the second message of round 1 was labelled round 2 (the round was read after
    # the tracker had counted the message). Two seats: messages 1-2 are round 1, messages 3-4 round 2.
    env = _game()
    for seat, text in ((0, "a"), (1, "b"), (0, "c")):
        env.step({seat: text})
    assert [e.round for e in env.events if e.kind == "say"] == [1, 1, 2]
    assert env.events[0].round == 1 and env.events[0].actor == -1


def test_reveal_note_is_in_the_round_of_the_moves() -> None:
    env = game_class("prisoners_dilemma")("easy")
    env.reset(seed=0)
    env.step({0: "MOVE: C", 1: "MOVE: C"})
    notes = [e for e in env.events if e.kind == "note"]
    assert notes and all(e.round == 1 and e.actor == -1 for e in notes)


def test_simultaneous_round_applies_a_later_seat_when_an_earlier_one_is_silent() -> None:
    env = game_class("prisoners_dilemma")("easy")
    env.reset(seed=0)
    env.step({1: "MOVE: C"})
    assert env.transcript == [(1, "MOVE: C")] and env.acting_seats() == [0]


def test_observation_round_is_a_whole_number_mid_round() -> None:
    env = _game()
    env.step({0: "a"})  # one of two messages of round 1
    assert env.observe(1).round == 1 and type(env.observe(1).round) is int


def test_invalid_and_outcome_events_carry_the_current_round() -> None:
    env = _game(max_reprompts=3)
    env.step({0: "a"})
    env.step({1: "b"})
    env.step({0: "OFFER: 999"})  # invalid, in round 2 (two messages already played by two seats)
    invalid = [e for e in env.events if e.kind == "invalid"]
    assert [(e.round, e.actor, e.channel) for e in invalid] == [(2, 0, "seat:0")]
    env.step({0: "OFFER: 40"})
    env.step({1: "ACCEPT"})  # four messages: the game is over after round 2
    outcome = [e for e in env.events if e.kind == "outcome"]
    assert len(outcome) == 1 and outcome[0].round >= 2  # not before the round of the last message


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reset_generates_the_scenario_of_its_seed(seed: int) -> None:
    from wolfpack_games.scenarios import generate_scenario

    env = game_class("trust")("hard")
    env.reset(seed=seed)
    assert env.active_scenario == generate_scenario("trust", seed, "hard")
    other = game_class("trust")("hard")
    other.reset(seed=seed)
    assert other.active_scenario == env.active_scenario


def test_different_seeds_give_different_scenarios() -> None:
    ids = set()
    for seed in range(1, 6):
        env = game_class("trust")("hard")
        env.reset(seed=seed)
        ids.add(env.active_scenario.id)
    assert len(ids) > 1
