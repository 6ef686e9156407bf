"""Tests written against surviving mutants of the scenario families not covered by test_family_rules_mutants.py
(coalition, prisoners_dilemma, public_goods, trust, ultimatum).

Every expectation is the family rule written out by hand (the module docstrings) or a hand-computed table.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from wolfpack_games.scenarios import Scenario, generate_scenario, get_family, verify
from wolfpack_games.scenarios.families.base import Tracker
from wolfpack_games.scenarios.models import PlayerInfo

FAMILIES = ("ultimatum", "trust", "prisoners_dilemma", "public_goods", "coalition")
DIFFS = ("easy", "medium", "hard")


def scenario(
    family: str, params: dict[str, Any], players: list[tuple[str, str, dict[str, Any]]], turns: int
) -> Scenario:
    return Scenario(
        family=family,
        difficulty="medium",
        template="test",
        tags=[family],
        public=f"test {family}",
        params=params,
        players=[
            PlayerInfo(seat=i, name=n, role=r, private=p, brief=f"brief {i}")
            for i, (n, r, p) in enumerate(players)
        ],
        max_turns=turns,
    )


def play(sc: Scenario, bots: dict[int, str], seed: int) -> tuple[list[tuple[int, str]], list[str]]:
    """Self-play on the family's tracker (acting seats in order); every message must be legal.
    Returns the transcript and the keyword of each message ("chat" for none)."""
    fam = get_family(sc.family)
    tracker = fam.tracker(sc)
    rng = random.Random(seed)
    transcript: list[tuple[int, str]] = []
    kinds: list[str] = []
    while not tracker.done:
        seat = tracker.acting()[0]
        bot = fam.heuristic if bots[seat] == "heuristic" else fam.random_move
        text = bot(tracker, seat, rng)
        msg = fam.parse(sc, text)
        assert not msg.error and not tracker.check(seat, msg), (bots[seat], text, msg.error)
        tracker.record(seat, msg)
        transcript.append((seat, text))
        kinds.append(msg.keyword or "chat")
    return transcript, kinds


def tracker_after(sc: Scenario, messages: list[tuple[int, str]]) -> Tracker:
    fam = get_family(sc.family)
    tracker = fam.tracker(sc)
    for seat, text in messages:
        msg = fam.parse(sc, text)
        assert not msg.error and not tracker.check(seat, msg), (text, msg.error)
        tracker.record(seat, msg)
    return tracker


# ----------------------------------------------------------------------------------------- all families
@pytest.mark.parametrize("family", FAMILIES)
def test_generated_scenarios_are_valid_and_solvable(family: str) -> None:
    """``generate`` gives "a valid, solvable scenario": ``check`` accepts it and the family's own witness
    (``solution``) is a legal transcript in which no seat loses."""
    fam = get_family(family)
    for seed in range(60):
        difficulty = DIFFS[seed % 3]
        sc = generate_scenario(family, seed, difficulty)
        assert sc.difficulty == difficulty and sc.family == family
        assert len({p.name for p in sc.players}) == sc.num_players == fam.seats[difficulty]
        fam.check(sc)
        witness = fam.solution(sc)
        tracker_after(sc, witness)
        assert min(verify(sc, witness).outcomes.values()) >= 0, (seed, witness)


@pytest.mark.parametrize("family", FAMILIES)
def test_random_moves_are_legal_and_cover_every_kind(family: str) -> None:
    kinds: set[str] = set()
    for seed in range(40):
        sc = generate_scenario(family, seed, DIFFS[seed % 3])
        _, moves = play(sc, dict.fromkeys(range(sc.num_players), "random"), seed)
        kinds |= set(moves)
    statements = {s.keyword for s in get_family(family).specs}
    assert statements <= kinds


@pytest.mark.parametrize("family", FAMILIES)
def test_instructions_name_the_statements_of_each_seat(family: str) -> None:
    fam = get_family(family)
    sc = generate_scenario(family, 5, "medium")
    text = " ".join(fam.instructions(sc, s) for s in range(sc.num_players))
    for spec in fam.specs:
        assert spec.keyword in text


# -------------------------------------------------------------------------------------------- ultimatum
# The module's design: pot = one of (10, 20, 50, 100, 200, 500, 1000) times 1..3; the responder's threshold
# is 20-45 % of the pot; slack = pot - proposer target - threshold is this share of the pot (rounded).
ULT_SLACK = {"easy": (0.15, 0.3), "medium": (0.0, 0.1), "hard": (-0.2, -0.05)}
POTS = {b * m for b in (10, 20, 50, 100, 200, 500, 1000) for m in (1, 2, 3)}


@pytest.mark.parametrize("difficulty", DIFFS)
def test_ultimatum_generator_follows_its_difficulty_table(difficulty: str) -> None:
    lo, hi = ULT_SLACK[difficulty]
    for seed in range(120):
        sc = generate_scenario("ultimatum", seed, difficulty)
        pot = sc.param_int("pot")
        target, threshold = sc.private_int(0, "target"), sc.private_int(1, "threshold")
        assert pot in POTS
        assert 0.2 * pot - 0.5 <= threshold <= 0.45 * pot + 0.5
        assert lo * pot - 0.5 <= pot - target - threshold <= hi * pot + 0.5, (seed, pot, target, threshold)
        assert sc.max_turns in (4, 6) and sc.params["first"] == 0
        assert [p.role for p in sc.players] == ["proposer", "responder"]


def _ult(pot: int = 100, target: int = 60, threshold: int = 30) -> Scenario:
    return scenario(
        "ultimatum",
        {"pot": pot, "first": 0},
        [("Ann", "proposer", {"target": target}), ("Bo", "responder", {"threshold": threshold})],
        6,
    )


@pytest.mark.parametrize(
    ("pot", "target", "threshold"), [(0, 0, 0), (100, 101, 30), (100, -1, 30), (100, 60, 101), (100, 60, -1)]
)
def test_ultimatum_check_rejects(pot: int, target: int, threshold: int) -> None:
    with pytest.raises(ValueError):
        get_family("ultimatum").check(_ult(pot, target, threshold))


@pytest.mark.parametrize(("target", "threshold"), [(0, 0), (100, 100), (1, 99)])
def test_ultimatum_check_accepts_the_bounds(target: int, threshold: int) -> None:
    get_family("ultimatum").check(_ult(100, target, threshold))


@pytest.mark.parametrize(
    ("pot", "target", "offer"),
    [
        (100, 60, 40),  # keep the target: offer 40 (below half)
        (100, 30, 50),  # the target leaves 70, but the bot offers at most half the pot
        (100, 100, 1),  # wants everything: offers the minimum positive amount
        (101, 40, 50),  # half of an odd pot rounds down
        (1, 1, 0),  # a pot of 1: a positive offer would give the whole pot away, so it offers 0
    ],
)
def test_ultimatum_proposer_heuristic_by_hand(pot: int, target: int, offer: int) -> None:
    fam = get_family("ultimatum")
    sc = _ult(pot, target, min(10, pot))
    tracker = fam.tracker(sc)
    msg = fam.parse(sc, fam.heuristic(tracker, 0, random.Random(0)))
    assert (msg.keyword, msg.value) == ("OFFER", offer)
    after = tracker_after(sc, [(0, f"OFFER: {offer}"), (1, "hm")])
    assert not fam.parse(sc, fam.heuristic(after, 0, random.Random(0))).keyword  # one offer only


def test_ultimatum_responder_heuristic_by_hand() -> None:
    fam = get_family("ultimatum")
    sc = _ult()
    rng = random.Random(0)
    assert not fam.parse(sc, fam.heuristic(tracker_after(sc, [(0, "hi")]), 1, rng)).keyword
    assert fam.parse(sc, fam.heuristic(tracker_after(sc, [(0, "OFFER: 5")]), 1, rng)).keyword == "ACCEPT"
    assert fam.parse(sc, fam.heuristic(tracker_after(sc, [(0, "OFFER: 0")]), 1, rng)).keyword == "REJECT"


def test_ultimatum_status_and_notes() -> None:
    sc = _ult()
    assert tracker_after(sc, []).status() == "No offer yet."
    assert tracker_after(sc, [(0, "OFFER: 40")]).status() == "Offer on the table: 40 for the responder."
    fam = get_family("ultimatum")
    t = tracker_after(sc, [(0, "OFFER: 40")])
    assert t.record(1, fam.parse(sc, "REJECT")) == ["The responder rejected the offer of 40."]
    assert t.done


def test_ultimatum_verdict_reasons() -> None:
    sc = _ult()
    assert verify(sc, [(0, "OFFER: 40"), (1, "REJECT")]).reason.startswith("rejected")
    assert verify(sc, [(0, "OFFER: 40")]).reason.startswith("no decision before the turn limit")
    accepted = verify(sc, [(0, "OFFER: 40"), (1, "ACCEPT")])
    assert accepted.details == {"offer": 40, "accepted": True}
    assert "proposer keeps 60" in accepted.reason and "responder gets 40" in accepted.reason


# ------------------------------------------------------------------------------------------------ trust
# Design: endowment = one of (10, 20, 50, 100) times 1..4, multiplier 3; the investor's target exceeds the
# endowment by 10-60 % of it (at least 1); slack = k*e - investor target - trustee target is this share of
# k*e/2 (rounded).
TRUST_SLACK = {"easy": (0.3, 0.6), "medium": (0.05, 0.25), "hard": (-0.4, -0.1)}


@pytest.mark.parametrize("difficulty", DIFFS)
def test_trust_generator_follows_its_difficulty_table(difficulty: str) -> None:
    lo, hi = TRUST_SLACK[difficulty]
    for seed in range(120):
        sc = generate_scenario("trust", seed, difficulty)
        e, k = sc.param_int("endowment"), sc.param_int("multiplier")
        inv, tru = sc.private_int(0, "target"), sc.private_int(1, "target")
        assert k == 3 and e in {b * m for b in (10, 20, 50, 100) for m in (1, 2, 3, 4)}
        assert max(1, 0.1 * e - 0.5) <= inv - e <= 0.6 * e + 0.5
        assert tru >= 1
        assert lo * k * e / 2 - 0.5 <= k * e - inv - tru <= hi * k * e / 2 + 0.5, (seed, e, inv, tru)
        assert sc.max_turns in (4, 6) and [p.role for p in sc.players] == ["investor", "trustee"]


def _trust(e: int = 10, k: int = 3, inv: int = 15, tru: int = 12) -> Scenario:
    return scenario(
        "trust",
        {"endowment": e, "multiplier": k, "first": 0},
        [("Ann", "investor", {"target": inv}), ("Bo", "trustee", {"target": tru})],
        6,
    )


@pytest.mark.parametrize(("e", "k", "inv"), [(0, 3, 0), (10, 0, 10), (10, 3, 9), (10, 3, 31)])
def test_trust_check_rejects(e: int, k: int, inv: int) -> None:
    with pytest.raises(ValueError):
        get_family("trust").check(_trust(e, k, inv))


@pytest.mark.parametrize("inv", [10, 30])
def test_trust_check_accepts_the_bounds(inv: int) -> None:
    get_family("trust").check(_trust(10, 3, inv))


def test_trust_amount_ranges() -> None:
    fam, sc = get_family("trust"), _trust()
    assert fam.parse(sc, "SEND: 10").value == 10 and fam.parse(sc, "SEND: 11").error
    assert fam.parse(sc, "RETURN: 30").value == 30 and fam.parse(sc, "RETURN: 31").error


@pytest.mark.parametrize(
    ("tru", "sent", "ret"),
    [
        (12, 10, 18),  # pool 30: keep the target 12, return 18
        (25, 10, 10),  # pool 30: keeping 25 would not repay the 10 sent; keep 20, return 10
        (12, 4, 4),  # pool 12: keep at most 8, return 4
    ],
)
def test_trust_trustee_heuristic_by_hand(tru: int, sent: int, ret: int) -> None:
    fam, sc = get_family("trust"), _trust(tru=tru)
    rng = random.Random(0)
    assert not fam.parse(sc, fam.heuristic(tracker_after(sc, []), 1, rng)).keyword
    msg = fam.parse(sc, fam.heuristic(tracker_after(sc, [(0, f"SEND: {sent}")]), 1, rng))
    assert (msg.keyword, msg.value) == ("RETURN", ret)


def test_trust_investor_heuristic_sends_everything_once() -> None:
    fam, sc = get_family("trust"), _trust()
    rng = random.Random(0)
    msg = fam.parse(sc, fam.heuristic(tracker_after(sc, []), 0, rng))
    assert (msg.keyword, msg.value) == ("SEND", 10)
    assert not fam.parse(sc, fam.heuristic(tracker_after(sc, [(0, "SEND: 10"), (1, "hm")]), 0, rng)).keyword


def test_trust_status_and_notes() -> None:
    fam, sc = get_family("trust"), _trust()
    assert tracker_after(sc, []).status() == "Nothing sent yet."
    t = tracker_after(sc, [])
    assert t.record(0, fam.parse(sc, "SEND: 10")) == ["The investor sent 10; the trustee receives 30."]
    assert t.status() == "Sent 10; the trustee holds 30."
    assert t.record(1, fam.parse(sc, "RETURN: 18")) == ["The trustee returned 18."]
    assert t.done
    z = tracker_after(sc, [])
    assert z.record(0, fam.parse(sc, "SEND: 0")) == ["The investor sent nothing; the game ends."] and z.done


def test_trust_verdict_payoffs_by_hand() -> None:
    # e=10, k=3: send 10, return 18 -> investor 10-10+18 = 18, trustee 30-18 = 12
    result = verify(_trust(), [(0, "SEND: 10"), (1, "RETURN: 18")])
    assert result.details == {"sent": 10, "returned": 18}
    assert "investor payoff 18" in result.reason and "trustee payoff 12" in result.reason
    late = verify(_trust(), [(0, "SEND: 10")])
    assert "never decided" in late.reason and late.outcomes[1] == -1


def test_ultimatum_instructions_per_role() -> None:
    fam, sc = get_family("ultimatum"), _ult()
    proposer, responder = fam.instructions(sc, 0), fam.instructions(sc, 1)
    assert "OFFER" in proposer and "ACCEPT" not in proposer
    assert "ACCEPT" in responder and "REJECT" in responder and "OFFER:" not in responder


def test_ultimatum_random_proposer_usually_offers() -> None:
    """A random proposer facing no offer makes one more often than not (the bots test needs offers)."""
    fam, sc = get_family("ultimatum"), _ult()
    rng = random.Random(0)
    tracker = tracker_after(sc, [])
    offers = sum(fam.parse(sc, fam.random_move(tracker, 0, rng)).keyword == "OFFER" for _ in range(400))
    assert offers > 200
    answered = tracker_after(sc, [(0, "OFFER: 40")])
    decisions = sum(bool(fam.parse(sc, fam.random_move(answered, 1, rng)).keyword) for _ in range(400))
    assert decisions > 200
