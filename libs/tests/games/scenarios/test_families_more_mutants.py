"""Tests written against surviving mutants of the scenario families not covered by test_family_rules_mutants.py
(coalition, prisoners_dilemma, public_goods, trust, ultimatum).

Every expectation is the family rule written out by hand (the module docstrings) or a hand-computed table.
"""

from __future__ import annotations

import itertools
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
def test_public_text_names_every_player(family: str) -> None:
    for seed in range(20):
        sc = generate_scenario(family, seed, DIFFS[seed % 3])
        for p in sc.players:
            assert p.name in sc.public, (seed, p.name)


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


# ------------------------------------------------------------------------------------ prisoner's dilemma
# Design: rounds per difficulty; one of five public matrices (T, R, P, S) listed by hand below; each target
# sits this share of the way from mutual defection (P per round) to mutual cooperation (R per round),
# at least one point above P*rounds and at most R*rounds.
PD_ROUNDS = {"easy": (2, 3), "medium": (4, 5), "hard": (6, 8)}
PD_TARGET = {"easy": (0.2, 0.5), "medium": (0.5, 0.8), "hard": (0.85, 1.0)}
PD_MATRICES = {(5, 3, 1, 0), (6, 4, 1, 0), (7, 5, 2, 0), (4, 3, 1, 0), (10, 6, 2, 1)}


@pytest.mark.parametrize("difficulty", DIFFS)
def test_pd_generator_follows_its_difficulty_table(difficulty: str) -> None:
    lo, hi = PD_TARGET[difficulty]
    seen_rounds = set()
    for seed in range(120):
        sc = generate_scenario("prisoners_dilemma", seed, difficulty)
        rounds = sc.param_int("rounds")
        seen_rounds.add(rounds)
        t, r, p, s = (sc.param_int(k) for k in ("T", "R", "P", "S"))
        assert (t, r, p, s) in PD_MATRICES
        assert PD_ROUNDS[difficulty][0] <= rounds <= PD_ROUNDS[difficulty][1]
        assert sc.max_turns == 2 * rounds and f"rounds-{rounds}" in sc.tags
        for seat in (0, 1):
            target = sc.private_int(seat, "target")
            assert p * rounds + 1 <= target <= r * rounds
            if p * rounds + 1 < target < r * rounds:  # not clamped
                share = (target / rounds - p) / (r - p)
                slack = 0.5 / (rounds * (r - p))
                assert lo - slack <= share <= hi + slack, (seed, rounds, target)
    assert seen_rounds == set(range(PD_ROUNDS[difficulty][0], PD_ROUNDS[difficulty][1] + 1))


def _pd(
    matrix: tuple[int, int, int, int] = (5, 3, 1, 0), rounds: int = 3, targets: tuple[int, int] = (8, 8)
) -> Scenario:
    t, r, p, s = matrix
    return scenario(
        "prisoners_dilemma",
        {"rounds": rounds, "T": t, "R": r, "P": p, "S": s},
        [("Ari", "player", {"target": targets[0]}), ("Bo", "player", {"target": targets[1]})],
        2 * rounds,
    )


@pytest.mark.parametrize(
    "sc_args",
    [
        {"matrix": (3, 3, 1, 0)},  # T = R
        {"matrix": (5, 3, 3, 0)},  # R = P
        {"matrix": (5, 3, 1, 1)},  # P = S
        {"matrix": (7, 3, 1, 0)},  # 2R = 6 < T + S = 7
        {"matrix": (6, 3, 1, 0)},  # 2R = T + S
        {"matrix": (6, 4, 5, 0)},  # R < P (T > R, P > S and 2R > T + S all hold)
        {"targets": (10, 8)},  # 10 > R * rounds = 9
        {"targets": (8, 10)},
    ],
)
def test_pd_check_rejects(sc_args: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        get_family("prisoners_dilemma").check(_pd(**sc_args))


def test_pd_check_rejects_a_turn_limit_other_than_two_per_round() -> None:
    sc = _pd().model_copy(update={"max_turns": 7})
    with pytest.raises(ValueError):
        get_family("prisoners_dilemma").check(sc)


def test_pd_check_accepts_a_target_of_full_cooperation() -> None:
    get_family("prisoners_dilemma").check(_pd(targets=(9, 9)))


def test_pd_rounds_payoffs_notes_and_status_by_hand() -> None:
    # matrix T=5 R=3 P=1 S=0; round 1: Ari C, Bo D -> Ari +0, Bo +5; round 2: both D -> +1 each
    fam, sc = get_family("prisoners_dilemma"), _pd()
    t = fam.tracker(sc)
    assert t.acting() == [0, 1] and t.status() == "Round 1 of 3."
    assert t.record(0, fam.parse(sc, "MOVE: C")) == []
    assert t.acting() == [1]
    assert t.record(1, fam.parse(sc, "MOVE: D")) == ["Round 1: Ari cooperated (+0), Bo defected (+5)."]
    assert t.status() == "Round 2 of 3." and t.acting() == [0, 1]
    t.record(1, fam.parse(sc, "MOVE: D"))
    assert t.acting() == [0]
    assert t.record(0, fam.parse(sc, "MOVE: D")) == ["Round 2: Ari defected (+1), Bo defected (+1)."]
    assert not t.done
    t.record(0, fam.parse(sc, "MOVE: C"))
    t.record(1, fam.parse(sc, "MOVE: C"))  # round 3: +3 each -> Ari 4, Bo 9
    assert t.done and t.status() == "Round 3 of 3."
    result = t.verdict()
    assert result.details["totals"] == {0: 4, 1: 9}
    assert result.details["moves"] == {"Ari": "CDC", "Bo": "DDC"}
    # floor P*rounds = 3; Ari 4 < 8 draws, Bo 9 >= 8 wins
    assert result.outcomes == {0: 0, 1: 1} and result.reason == "totals after 3 rounds: Ari 4, Bo 9"


def test_pd_every_message_needs_a_move_and_the_default_is_defect() -> None:
    fam, sc = get_family("prisoners_dilemma"), _pd()
    t = fam.tracker(sc)
    assert "MOVE" in t.check(0, fam.parse(sc, "let us cooperate"))
    assert t.check(0, fam.parse(sc, "MOVE: C")) == ""
    assert t.legal_kinds(0) == ("final",) and t.default_text(0) == "MOVE: D"
    assert fam.parse(sc, "MOVE: cooperate").value == "C" and fam.parse(sc, "MOVE: 背叛").value == "D"


def test_pd_heuristic_is_tit_for_tat() -> None:
    fam, sc = get_family("prisoners_dilemma"), _pd(rounds=4, targets=(8, 8))
    rng = random.Random(0)

    def move(history: list[tuple[int, str]], seat: int) -> str:
        return str(fam.parse(sc, fam.heuristic(tracker_after(sc, history), seat, rng)).value)

    assert move([], 0) == "C" and move([], 1) == "C"
    # its chat line never claims to cooperate while it defects
    text = fam.heuristic(tracker_after(sc, [(0, "MOVE: C"), (1, "MOVE: D")]), 0, rng)
    assert "MOVE: D" in text and "Cooperat" not in text
    one = [(0, "MOVE: C"), (1, "MOVE: D")]
    assert move(one, 0) == "D" and move(one, 1) == "C"  # each copies the other's last move
    two = [*one, (0, "MOVE: D"), (1, "MOVE: C")]
    assert move(two, 0) == "C" and move(two, 1) == "D"


def test_pd_random_moves_use_both_choices() -> None:
    fam, sc = get_family("prisoners_dilemma"), _pd()
    rng = random.Random(0)
    moves = {fam.parse(sc, fam.random_move(fam.tracker(sc), 0, rng)).value for _ in range(50)}
    assert moves == {"C", "D"}


# ---------------------------------------------------------------------------------------- public goods
# Design: n = 3/4/5 players; endowment one of (10, 20, 50, 100); multiplier (x10) per difficulty; each
# target sits this share of the way from the endowment to the full-cooperation payoff e*m, clamped to
# [e + 1, floor(e*m)]; 3n messages.
PG_M10 = {"easy": (22, 26), "medium": (18, 24), "hard": (16, 22)}
PG_TARGET = {"easy": (0.2, 0.5), "medium": (0.5, 0.8), "hard": (0.85, 1.0)}


@pytest.mark.parametrize("difficulty", DIFFS)
def test_public_goods_generator_follows_its_difficulty_table(difficulty: str) -> None:
    lo, hi = PG_TARGET[difficulty]
    n_expected = {"easy": 3, "medium": 4, "hard": 5}[difficulty]
    below_full = 0
    for seed in range(120):
        sc = generate_scenario("public_goods", seed, difficulty)
        n, e, m10 = sc.num_players, sc.param_int("endowment"), sc.param_int("multiplier_x10")
        assert n == n_expected and e in (10, 20, 50, 100) and sc.max_turns == 3 * n
        assert PG_M10[difficulty][0] <= m10 <= PG_M10[difficulty][1]
        full = e * m10 / 10
        for seat in range(n):
            target = sc.private_int(seat, "target")
            assert e + 1 <= target <= full
            if e + 1 < target < int(full):
                below_full += 1
                share = (target - e) / (full - e)
                assert lo - 0.5 / (full - e) <= share <= hi + 0.5 / (full - e), (seed, target)
    # even on hard (85-100 % of the way) the targets are not all pinned at the full-cooperation payoff
    assert below_full > 0


def _pg(m10: int = 20, targets: tuple[int, ...] = (15, 15, 15), e: int = 10) -> Scenario:
    return scenario(
        "public_goods",
        {"endowment": e, "multiplier_x10": m10, "first": 0},
        [(f"P{i}", "citizen", {"target": t}) for i, t in enumerate(targets)],
        3 * len(targets),
    )


@pytest.mark.parametrize(
    "sc_args",
    [
        {"m10": 10},  # m = 1: contributing never pays
        {"m10": 30},  # m = n = 3: no dilemma
        {"m10": 40},  # m > n: contributing pays for itself
        {"targets": (9, 15, 15)},  # below the endowment
        {"targets": (15, 15, 21)},  # above the full-cooperation payoff 10 * 2 = 20
    ],
)
def test_public_goods_check_rejects(sc_args: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        get_family("public_goods").check(_pg(**sc_args))


def test_public_goods_check_accepts_the_bounds() -> None:
    get_family("public_goods").check(_pg(m10=11, targets=(10, 11, 11)))
    get_family("public_goods").check(_pg(m10=29, targets=(29, 10, 10)))


def test_public_goods_payoffs_notes_and_status_by_hand() -> None:
    # e=10, m=2, n=3; contributions 10, 4, 0 -> pool 14, share 14*2/3 = 28/3
    # payoffs: 0 + 28/3 = 9.33 (loss), 6 + 28/3 = 15.33 (win at 15), 10 + 28/3 = 19.33 (win)
    fam, sc = get_family("public_goods"), _pg()
    t = fam.tracker(sc)
    assert t.status() == "Sealed contributions received from: nobody yet."
    assert t.record(1, fam.parse(sc, "CONTRIBUTE: 4")) == []
    assert t.record(0, fam.parse(sc, "CONTRIBUTE: 10")) == []
    assert t.status() == "Sealed contributions received from: P0, P1."
    assert "already contributed" in t.check(0, fam.parse(sc, "CONTRIBUTE: 1"))
    assert t.check(0, fam.parse(sc, "just talking")) == ""
    assert t.record(2, fam.parse(sc, "CONTRIBUTE: 0")) == ["All contributions revealed: P0 10, P1 4, P2 0."]
    assert t.done
    result = t.verdict()
    assert result.outcomes == {0: -1, 1: 1, 2: 1}
    assert result.details["contributions"] == {"P0": 10, "P1": 4, "P2": 0}
    assert result.details["payoffs"] == pytest.approx({0: 28 / 3, 1: 6 + 28 / 3, 2: 10 + 28 / 3})


def test_public_goods_missing_contributions_count_as_zero() -> None:
    # only P0 contributes 9: share 9*2/3 = 6 -> P0 1+6 = 7 (loss), others 10+6 = 16 (win at 15)
    result = verify(_pg(), [(0, "CONTRIBUTE: 9")])
    assert result.outcomes == {0: -1, 1: 1, 2: 1}


def test_public_goods_heuristic_talks_for_a_round_then_contributes_everything() -> None:
    fam, sc = get_family("public_goods"), _pg()
    rng = random.Random(0)
    first_round = [(0, "hi"), (1, "hi")]
    assert not fam.parse(sc, fam.heuristic(tracker_after(sc, first_round), 2, rng)).keyword  # 2 < n turns
    after_round = [(0, "hi"), (1, "hi"), (2, "hi")]
    msg = fam.parse(sc, fam.heuristic(tracker_after(sc, after_round), 0, rng))
    assert (msg.keyword, msg.value) == ("CONTRIBUTE", 10)
    done = [*after_round, (0, "CONTRIBUTE: 10"), (1, "hm"), (2, "hm")]
    assert not fam.parse(sc, fam.heuristic(tracker_after(sc, done), 0, rng)).keyword


def test_public_goods_contribution_range_and_instructions() -> None:
    fam, sc = get_family("public_goods"), _pg()
    assert fam.parse(sc, "CONTRIBUTE: 10").value == 10 and fam.parse(sc, "CONTRIBUTE: 11").error
    assert "CONTRIBUTE: <0..10>" in fam.instructions(sc, 0)


# ------------------------------------------------------------------------------------------- coalition
# Hand-built 3-player table: solo values Ada 10, Bram 5, Cleo 0; pairs 50/40/30; all three 90.
# Shapley values by hand over the six orders (marginal contributions):
#   ABC: 10 40 40 | ACB: 10 50 30 | BAC: 45 5 40 | BCA: 60 5 25 | CAB: 40 50 0 | CBA: 60 30 0
#   Ada 225/6 = 37.5, Bram 180/6 = 30, Cleo 135/6 = 22.5 (sum 90).
COAL_VALUES = {
    "Ada": 10,
    "Bram": 5,
    "Cleo": 0,
    "Ada+Bram": 50,
    "Ada+Cleo": 40,
    "Bram+Cleo": 30,
    "Ada+Bram+Cleo": 90,
}


def _coal(values: dict[str, int] | None = None, targets: tuple[int, int, int] = (40, 25, 20)) -> Scenario:
    return scenario(
        "coalition",
        {"values": dict(COAL_VALUES if values is None else values), "first": 0},
        [(n, "party", {"target": t}) for n, t in zip(("Ada", "Bram", "Cleo"), targets, strict=True)],
        9,
    )


def test_coalition_shapley_by_hand() -> None:
    from wolfpack_games.scenarios.families.coalition import shapley

    assert shapley(_coal()) == pytest.approx([37.5, 30.0, 22.5])


@pytest.mark.parametrize("family_seed", range(30))
def test_coalition_grand_split_is_an_imputation_near_shapley(family_seed: int) -> None:
    from wolfpack_games.scenarios.families.coalition import grand_split, shapley, value

    sc = generate_scenario("coalition", family_seed, DIFFS[family_seed % 3])
    n = sc.num_players
    split, phi = grand_split(sc), shapley(sc)
    assert sum(phi) == pytest.approx(value(sc, set(range(n))))  # efficiency
    assert sum(split.values()) == value(sc, set(range(n)))
    for s in range(n):
        solo = value(sc, {s})
        assert split[s] >= solo
        if phi[s] >= solo:
            assert abs(split[s] - phi[s]) < 1, (s, split, phi)


@pytest.mark.parametrize("difficulty", DIFFS)
def test_coalition_generator_follows_its_design(difficulty: str) -> None:
    from wolfpack_games.scenarios.families.coalition import NAMES, grand_split, value

    lo, hi = {"easy": (0.7, 0.9), "medium": (0.95, 1.05), "hard": (1.1, 1.3)}[difficulty]
    bonus = 10 if difficulty == "hard" else 0
    for seed in range(60):
        sc = generate_scenario("coalition", seed, difficulty)
        n = sc.num_players
        assert n == {"easy": 3, "medium": 3, "hard": 4}[difficulty] and sc.max_turns == 4 * n
        names = [p.name for p in sc.players]
        assert names == sorted(names, key=NAMES.index)
        solo = [value(sc, {s}) for s in range(n)]
        assert all(0 <= v <= 10 for v in solo)
        grand = value(sc, set(range(n)))
        best_partition = max(
            value(sc, set(members)) + sum(solo[s] for s in range(n) if s not in members)
            for size in range(1, n)
            for members in itertools.combinations(range(n), size)
        )
        assert grand == max(100, best_partition)  # 100, raised only to beat every sub-coalition + singletons
        for size in range(2, n):
            for members in itertools.combinations(range(n), size):
                v = value(sc, set(members))
                base = sum(solo[s] for s in members)
                low = base + 10 * (size - 1) + bonus
                assert v == 99 or low <= v <= base + 25 * (size - 1) + bonus, (seed, members, v)
                assert v <= 99
                outside = sum(solo[s] for s in range(n) if s not in members)
                assert grand >= v + outside  # the grand coalition beats any sub-coalition plus singletons
        split = grand_split(sc)
        for s in range(n):
            target = sc.private_int(s, "target")
            assert target >= solo[s] + 1
            if target > solo[s] + 1:
                assert lo * split[s] - 0.5 <= target <= hi * split[s] + 0.5, (seed, s, target, split)


@pytest.mark.parametrize(
    "values",
    [
        {k: v for k, v in COAL_VALUES.items() if k != "Ada+Cleo"},  # a coalition missing
        {**COAL_VALUES, "Ada+Zed": 5},  # an unknown one
        {**COAL_VALUES, "Ada+Bram+Cleo": 14},  # grand worth less than 10 + 5 + 0
    ],
)
def test_coalition_check_rejects(values: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        get_family("coalition").check(_coal(values))


def test_coalition_check_accepts_a_grand_value_equal_to_the_solo_sum() -> None:
    get_family("coalition").check(_coal({**COAL_VALUES, "Ada+Bram+Cleo": 15}))


def test_coalition_heuristic_first_proposal_by_hand() -> None:
    # Ada at turn 0 demands her target 40 (cap 90 - 5 - 0 = 85); the other 50 go to Bram and Cleo in
    # proportion to their grand-split shares (30 and 22 or 23): 50*30//52 = 28, 50*22//52 = 21 (same with
    # 53), and the leftover 1 to Bram.
    fam, sc = get_family("coalition"), _coal()
    msg = fam.parse(sc, fam.heuristic(tracker_after(sc, []), 0, random.Random(0)))
    assert (msg.keyword, msg.value) == ("COALITION", {0: 40, 1: 29, 2: 21})


@pytest.mark.parametrize(
    ("turn_chat", "bram_share", "accepts"),
    [
        # Bram (target 25, solo 5) at turn 1 of 9: demand round(25 - 20 * 1.5/9) = round(21.67) = 22
        (0, 22, True),
        (0, 21, False),
        # at turn 7 of 9: 1.5 * 7/9 >= 1, so the demand has fallen to the solo value 5
        (6, 5, True),
    ],
)
def test_coalition_heuristic_accepts_at_its_conceding_demand(
    turn_chat: int, bram_share: int, accepts: bool
) -> None:
    fam, sc = get_family("coalition"), _coal()
    history = [(s % 3, "hi") for s in range(turn_chat)]
    proposer = turn_chat % 3
    assert proposer != 1
    history.append((proposer, f"COALITION: {{Ada: {90 - bram_share - 10}, Bram: {bram_share}, Cleo: 10}}"))
    tracker = tracker_after(sc, history)
    assert tracker.acting() == [1]
    keyword = fam.parse(sc, fam.heuristic(tracker, 1, random.Random(0))).keyword
    assert (keyword == "ACCEPT") is accepts
    if not accepts:
        assert keyword == "COALITION"


def test_coalition_proposer_waits_for_answers() -> None:
    fam, sc = get_family("coalition"), _coal()
    tracker = tracker_after(sc, [(0, "COALITION: {Ada: 40, Bram: 30, Cleo: 20}"), (1, "ACCEPT"), (2, "hm")])
    assert not fam.parse(sc, fam.heuristic(tracker, 0, random.Random(0))).keyword


def test_coalition_heuristic_never_loses_against_random_players() -> None:
    """Its own share is never below its solo value, and it accepts only at or above its demand (>= solo)."""
    for seed in range(40):
        sc = generate_scenario("coalition", seed, DIFFS[seed % 3])
        for me in range(sc.num_players):
            bots = {s: "heuristic" if s == me else "random" for s in range(sc.num_players)}
            transcript, _ = play(sc, bots, seed)
            assert verify(sc, transcript).outcomes[me] >= 0, (seed, me)


def test_coalition_status_and_notes_by_hand() -> None:
    fam, sc = get_family("coalition"), _coal()
    t = tracker_after(sc, [])
    assert t.status() == "No coalition proposal is standing."
    assert t.record(0, fam.parse(sc, "COALITION: {Ada: 40, Bram: 30, Cleo: 20}")) == []
    assert t.status() == "Standing: COALITION: {Ada: 40, Bram: 30, Cleo: 20}; waiting for Bram, Cleo."
    assert t.record(1, fam.parse(sc, "ACCEPT")) == []
    assert t.status().endswith("waiting for Cleo.")
    assert "you proposed it yourself" in t.check(0, fam.parse(sc, "ACCEPT"))
    assert t.record(2, fam.parse(sc, "REJECT")) == ["Cleo rejected; no proposal is standing."]
    assert t.status() == "No coalition proposal is standing." and not t.done
    t.record(0, fam.parse(sc, "COALITION: {Ada: 30, Bram: 20}"))
    assert t.record(1, fam.parse(sc, "ACCEPT")) == ["Coalition formed: COALITION: {Ada: 30, Bram: 20}."]
    result = t.verdict()
    assert result.details == {"coalition": {"Ada": 30, "Bram": 20}, "payoffs": {0: 30, 1: 20, 2: 0}}
    assert result.reason == "COALITION: {Ada: 30, Bram: 20}; payoffs Ada 30, Bram 20, Cleo 0"
    alone = tracker_after(sc, [])
    assert alone.record(0, fam.parse(sc, "COALITION: {Ada: 10}")) == ["Ada goes alone."] and alone.done
    none = verify(sc, [])
    assert none.reason.startswith("no coalition formed (turn limit)") and none.outcomes == {0: 0, 1: 0, 2: 0}


def test_trust_witness_is_win_win_when_the_slack_allows() -> None:
    """Docstring: with slack k*e - targets >= 0, full trust and a fair return make both win."""
    seen = 0
    for seed in range(90):
        sc = generate_scenario("trust", seed, DIFFS[seed % 3])
        e, k = sc.param_int("endowment"), sc.param_int("multiplier")
        if k * e - sc.private_int(0, "target") - sc.private_int(1, "target") >= 0:
            seen += 1
            assert verify(sc, get_family("trust").solution(sc)).outcomes == {0: 1, 1: 1}, seed
    assert seen > 0


def test_coalition_shares_must_sum_exactly_to_the_value() -> None:
    fam, sc = get_family("coalition"), _coal()
    assert "worth exactly 90" in fam.parse(sc, "COALITION: {Ada: 40, Bram: 30, Cleo: 10}").error  # 80 < 90
    assert "worth exactly 50" in fam.parse(sc, "COALITION: {Ada: 30, Bram: 30}").error  # 60 > 50
    assert fam.parse(sc, "COALITION: {Ada: 30, Bram: 20}").value == {0: 30, 1: 20}


def test_coalition_repeating_a_member_with_the_same_share_is_not_a_contradiction() -> None:
    fam = get_family("coalition")
    sc = _coal({**COAL_VALUES, "Ada+Bram": 400, "Ada+Bram+Cleo": 500})
    assert fam.parse(sc, "COALITION: {Ada: 300, Ada: 300, Bram: 100}").value == {0: 300, 1: 100}
    assert "contradictory" in fam.parse(sc, "COALITION: {Ada: 300, Ada: 299, Bram: 100}").error
