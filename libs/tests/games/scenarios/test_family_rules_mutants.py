"""Bargaining, allocation and cooperation: generator knobs, validity checks, statement parsing and the
scripted bots, written for mutants that survived the verifier tables (bench/results/2026-11-26-mutation-games.md).

Oracles: the difficulty ranges each module documents (restated here by hand), hand-computed bot moves on
fixed scenarios, and properties (a heuristic bot never takes a deal below its BATNA; a random move is
always legal and every kind of move occurs).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest

from wolfpack_games.scenarios import Scenario, generate_scenario, get_family, verify
from wolfpack_games.scenarios.families.base import Tracker
from wolfpack_games.scenarios.models import PlayerInfo

SEEDS = range(150)
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


Bot = Callable[[Tracker, int, random.Random], str]


def self_play(
    sc: Scenario, bots: dict[int, str], seed: int
) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """Play on the family's tracker; every message must be legal. Returns (transcript, [(seat, keyword)])."""
    fam = get_family(sc.family)
    tracker = fam.tracker(sc)
    rng = random.Random(seed)
    transcript: list[tuple[int, str]] = []
    moves: list[tuple[int, str]] = []
    while not tracker.done:
        (seat,) = tracker.acting()
        bot = fam.heuristic if bots[seat] == "heuristic" else fam.random_move
        text = bot(tracker, seat, rng)
        msg = fam.parse(sc, text)
        assert not msg.error and not tracker.check(seat, msg), (bots[seat], text, msg.error)
        tracker.record(seat, msg)
        transcript.append((seat, text))
        moves.append((seat, msg.keyword or "chat"))
    return transcript, moves


# ------------------------------------------------------------------------------------------- bargaining
# The module's design table: ZOPA width as a share of the list price; how deep into the ZOPA each target sits.
ZOPA = {"easy": (0.25, 0.40), "medium": (0.10, 0.20), "hard": (0.03, 0.08)}
DEPTH = {"easy": (0.15, 0.35), "medium": (0.35, 0.50), "hard": (0.55, 0.80)}


@pytest.mark.parametrize("difficulty", DIFFS)
def test_bargaining_generator_follows_its_difficulty_table(difficulty: str) -> None:
    lo, hi = ZOPA[difficulty]
    dlo, dhi = DEPTH[difficulty]
    firsts = set()
    for seed in SEEDS:
        sc = generate_scenario("bargaining", seed, difficulty)
        lp, cap = sc.param_int("list_price"), sc.param_int("cap")
        b_res, b_tgt = sc.private_int(0, "reservation"), sc.private_int(0, "target")
        s_res, s_tgt = sc.private_int(1, "reservation"), sc.private_int(1, "target")
        assert lp >= 50 and lp % 10 == 0 and cap == 3 * lp
        width = b_res - s_res
        assert lp * lo - 0.5 <= width <= max(4, lp * hi + 0.5), (seed, lp, width)
        for inside in (s_tgt - s_res, b_res - b_tgt):  # each target's depth into the ZOPA
            assert width * dlo - 0.5 <= inside <= max(1, width * dhi + 0.5), (seed, width, inside)
        if difficulty == "easy":
            assert s_tgt <= b_tgt  # targets overlap: a win-win price exists
        if difficulty == "hard":
            assert s_tgt >= b_tgt  # targets meet or cross
        firsts.add(sc.param_int("first"))
    assert firsts == {0, 1}


def test_bargaining_list_prices_spread_around_the_base_price() -> None:
    # list price = base * U(0.6, 1.6), rounded to tens: the same item appears below and well above its
    # lowest price in the sample.
    prices: dict[str, list[int]] = {}
    for seed in range(300):
        sc = generate_scenario("bargaining", seed, "easy")
        prices.setdefault(str(sc.params["item"]), []).append(sc.param_int("list_price"))
    spread = [max(p) / min(p) for p in prices.values() if len(p) >= 10]
    assert spread and min(spread) > 1.8  # (1.6 / 0.6 = 2.67 at most)


BARG = scenario(
    "bargaining",
    {"list_price": 100, "cap": 300, "first": 0, "item": "a bike"},
    [
        ("Ann", "buyer", {"reservation": 120, "target": 100}),
        ("Bo", "seller", {"reservation": 80, "target": 95}),
    ],
    8,
)


def _bargaining_with(private: list[dict[str, int]]) -> dict[str, Any]:
    data = BARG.model_dump()
    data.pop("id"), data.pop("split")
    for p, priv in zip(data["players"], private, strict=True):
        p["private"] = priv
    return data


@pytest.mark.parametrize(
    "private",
    [
        [{"reservation": 120, "target": 100}, {"reservation": 80, "target": 79}],  # seller target below BATNA
        [{"reservation": 120, "target": 121}, {"reservation": 80, "target": 95}],  # buyer target above BATNA
        [{"reservation": 70, "target": 60}, {"reservation": 80, "target": 95}],  # empty ZOPA
    ],
)
def test_bargaining_rejects_unambitious_targets_and_empty_zopa(private: list[dict[str, int]]) -> None:
    with pytest.raises(ValueError):
        Scenario.model_validate(_bargaining_with(private))
    ok = [{"reservation": 120, "target": 120}, {"reservation": 80, "target": 80}]  # targets = BATNA: allowed
    Scenario.model_validate(_bargaining_with(ok))


def test_bargaining_solution_is_win_win_when_targets_overlap() -> None:
    assert verify(BARG, get_family("bargaining").solution(BARG)).outcomes == {0: 1, 1: 1}  # 95 <= 100
    # Lopsided targets: the ZOPA's middle (100) is above the buyer's target (85), but any price in
    # [82, 85] lets both win, so the witness must find one.
    lopsided = Scenario.model_validate(
        _bargaining_with([{"reservation": 120, "target": 85}, {"reservation": 80, "target": 82}])
    )
    assert verify(lopsided, get_family("bargaining").solution(lopsided)).outcomes == {0: 1, 1: 1}
    for seed in SEEDS:
        sc = generate_scenario("bargaining", seed, "easy")
        assert verify(sc, get_family("bargaining").solution(sc)).outcomes == {0: 1, 1: 1}, seed


def _tracker_after(sc: Scenario, messages: list[tuple[int, str]]) -> Tracker:
    fam = get_family(sc.family)
    tracker = fam.tracker(sc)
    for seat, text in messages:
        msg = fam.parse(sc, text)
        assert not msg.error and not tracker.check(seat, msg)
        tracker.record(seat, msg)
    return tracker


def test_bargaining_heuristic_moves_by_hand() -> None:
    fam = get_family("bargaining")
    rng = random.Random(0)
    # Opening anchors beyond the target by the target-to-BATNA distance: buyer 100 - 20, seller 95 + 15.
    assert fam.heuristic(_tracker_after(BARG, []), 0, rng).endswith("FINAL_BID: 80")
    assert fam.heuristic(_tracker_after(BARG, [(0, "hi")]), 1, rng).endswith("FINAL_BID: 110")
    # Later: split the difference between my last bid (90) and theirs (106) = 98, within my target 100.
    t = _tracker_after(
        BARG, [(0, "FINAL_BID: 80"), (1, "FINAL_BID: 110"), (0, "FINAL_BID: 90"), (1, "FINAL_BID: 106")]
    )
    assert fam.heuristic(t, 0, rng).endswith("FINAL_BID: 98")
    # Seller with 3 turns left concedes to the BATNA (80): a standing 98 is acceptable.
    t = _tracker_after(
        BARG,
        [
            (0, "FINAL_BID: 80"),
            (1, "FINAL_BID: 110"),
            (0, "FINAL_BID: 90"),
            (1, "FINAL_BID: 106"),
            (0, "FINAL_BID: 98"),
        ],
    )
    assert fam.heuristic(t, 1, rng).endswith("ACCEPT")
    # Buyer early (limit = target 100) does not accept a standing 101, but accepts 100.
    assert not fam.heuristic(_tracker_after(BARG, [(0, "hi"), (1, "FINAL_BID: 101")]), 0, rng).endswith(
        "ACCEPT"
    )
    assert fam.heuristic(_tracker_after(BARG, [(0, "hi"), (1, "FINAL_BID: 100")]), 0, rng).endswith("ACCEPT")


@pytest.mark.parametrize("family", ["bargaining", "allocation"])
def test_heuristic_never_takes_a_deal_below_its_batna(family: str) -> None:
    """Against a random opponent, in either seat, the heuristic bot never ends with a loss (-1)."""
    for seed in range(60):
        sc = generate_scenario(family, seed, DIFFS[seed % 3])
        for me in range(sc.num_players):
            bots = {s: "heuristic" if s == me else "random" for s in range(sc.num_players)}
            transcript, _ = self_play(sc, bots, seed)
            assert verify(sc, transcript).outcomes[me] >= 0, (seed, me, transcript)


@pytest.mark.parametrize("family", ["bargaining", "allocation", "cooperation"])
def test_random_moves_are_legal_and_cover_every_kind(family: str) -> None:
    """``random_move`` is "a random *legal* message": never a violation, and every kind of statement
    (and chat) occurs, including ACCEPT/REJECT by a seat that did not make the standing proposal."""
    kinds: set[str] = set()
    for seed in range(40):
        sc = generate_scenario(family, seed, DIFFS[seed % 3])
        _, moves = self_play(sc, dict.fromkeys(range(sc.num_players), "random"), seed)
        kinds |= {k for _, k in moves}
    expected = {"chat", *(s.keyword for s in get_family(family).specs)}
    assert kinds == expected


# ------------------------------------------------------------------------------------------- allocation
ITEMS = {"easy": (3, 4), "medium": (4, 5), "hard": (5, 7)}
RES = {"easy": (0.4, 0.6), "medium": (0.6, 0.8), "hard": (0.8, 0.95)}
TGT = {"easy": (0.8, 0.95), "medium": (0.95, 1.05), "hard": (1.05, 1.2)}


def maximin_utilities(values: list[dict[str, int]], items: list[str]) -> list[int]:
    """Second implementation: the utilities of the first (lexicographic) allocation maximising the
    lowest utility."""
    best: list[int] | None = None
    for owners in itertools.product(range(len(values)), repeat=len(items)):
        util = [
            sum(values[s][i] for i, o in zip(items, owners, strict=True) if o == s)
            for s in range(len(values))
        ]
        if best is None or min(util) > min(best):
            best = util
    assert best is not None
    return best


@pytest.mark.parametrize("difficulty", DIFFS)
def test_allocation_generator_follows_its_difficulty_table(difficulty: str) -> None:
    counts = set()
    for seed in range(60):
        sc = generate_scenario("allocation", seed, difficulty)
        items = sc.param_strs("items")
        counts.add(len(items))
        values = [dict(sc.private_value(s, "values")) for s in range(sc.num_players)]  # type: ignore[arg-type]
        assert all(sum(v.values()) == 100 for v in values)
        best = maximin_utilities(values, items)
        for s in range(sc.num_players):
            res, tgt = sc.private_int(s, "reservation"), sc.private_int(s, "target")
            lo, hi = RES[difficulty]
            assert res <= best[s] and (res == 1 or best[s] * lo - 0.5 <= res <= best[s] * hi + 0.5), (seed, s)
            lo, hi = TGT[difficulty]
            assert res < tgt <= 100
            assert tgt in (res + 1, 100) or best[s] * lo - 0.5 <= tgt <= best[s] * hi + 0.5, (
                seed,
                s,
                best[s],
                tgt,
            )
    lo, hi = ITEMS[difficulty]
    assert counts == set(range(lo, hi + 1))


def _pearson(x: list[int], y: list[int]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sx = sum((a - mx) ** 2 for a in x) ** 0.5
    sy = sum((b - my) ** 2 for b in y) ** 0.5
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / (sx * sy) if sx and sy else 0.0


@pytest.mark.parametrize(
    ("difficulty", "seeds", "low", "high"),
    [("easy", 200, -0.2, 0.25), ("medium", 200, 0.3, 0.7), ("hard", 60, 0.85, 1.0)],
)
def test_allocation_conflict_is_the_correlation_of_valuations(
    difficulty: str, seeds: int, low: float, high: float
) -> None:
    """The conflict knob c mixes a shared weight b with a private one o (both uniform): values are
    proportional to c*b + (1-c)*o, so two players' values correlate with c^2 / (c^2 + (1-c)^2): 0.01 on
    easy (c 0.1), 0.5 on medium (c 0.5), 0.97 on hard (c 0.85). The mean over many scenarios of the
    sample correlation (3-7 items: noisy, hence wide bounds) lands around those."""
    corr = []
    for seed in range(seeds):
        sc = generate_scenario("allocation", seed, difficulty)
        items = sc.param_strs("items")
        v0, v1 = (dict(sc.private_value(s, "values")) for s in (0, 1))  # type: ignore[arg-type]
        corr.append(_pearson([v0[i] for i in items], [v1[i] for i in items]))
    assert low < sum(corr) / len(corr) < high


def test_allocation_public_text_names_who_speaks_first() -> None:
    for seed in range(20):
        sc = generate_scenario("allocation", seed, DIFFS[seed % 3])
        (first,) = get_family("allocation").tracker(sc).acting()
        assert f"{sc.name(first)} speaks first" in sc.public
        others = [sc.name(s) for s in range(sc.num_players) if s != first]
        assert not any(f"{n} speaks first" in sc.public for n in others)


ALLOC3 = scenario(
    "allocation",
    {"items": ["desk", "lamp", "rug"], "first": 0},
    [
        (
            "Ann",
            "partner 1",
            {"values": {"lamp": 60, "desk": 30, "rug": 10}, "reservation": 20, "target": 60},
        ),
        ("Bo", "partner 2", {"values": {"lamp": 10, "desk": 30, "rug": 60}, "reservation": 20, "target": 60}),
        ("Cy", "partner 3", {"values": {"lamp": 10, "desk": 80, "rug": 10}, "reservation": 20, "target": 60}),
    ],
    14,
)


def test_allocation_heuristic_proposal_by_hand() -> None:
    fam = get_family("allocation")
    # Turn 0: Ann demands her target 60; her most valued item (lamp, 60) meets it; the rest goes round the
    # others in seat order: desk -> Bo, rug -> Cy (listed in the scenario's item order).
    text = fam.heuristic(fam.tracker(ALLOC3), 0, random.Random(0))
    assert text.endswith("ALLOCATION: {desk: Bo, lamp: Ann, rug: Cy}")
    # Bo at turn 1 (progress 1/14): demand round(60 - 40 * 1.5 / 14) = 56; the standing proposal gives him
    # the desk (30): not enough. In his own order of value (rug 60, desk 30, lamp 10) he keeps the rug, then
    # the others get the rest in seat order: desk -> Ann, lamp -> Cy.
    t = _tracker_after(ALLOC3, [(0, "ALLOCATION: {desk: Bo, lamp: Ann, rug: Cy}")])
    assert fam.heuristic(t, 1, random.Random(0)).endswith("ALLOCATION: {desk: Ann, lamp: Cy, rug: Bo}")
    # Cy values the desk at 80 >= her demand: she confirms.
    t = _tracker_after(ALLOC3, [(0, "ALLOCATION: {desk: Cy, lamp: Ann, rug: Bo}")])
    assert fam.heuristic(t, 1, random.Random(0)).endswith("ACCEPT")  # Bo gets the rug (60)
    t = _tracker_after(ALLOC3, [(0, "ALLOCATION: {desk: Cy, lamp: Ann, rug: Bo}"), (1, "ACCEPT")])
    assert fam.heuristic(t, 2, random.Random(0)).endswith("ACCEPT")


# ------------------------------------------------------------------------------------------ cooperation
def _blocked_sets(sc: Scenario) -> list[set[str]]:
    return [set(sc.private_value(s, "blocked")) for s in range(sc.num_players)]  # type: ignore[arg-type]


@pytest.mark.parametrize("difficulty", DIFFS)
def test_cooperation_nobody_can_solve_it_alone(difficulty: str) -> None:
    """Hidden profile: pooled, the conflicts leave exactly one slot; alone, every player still sees at
    least two possible slots."""
    for seed in SEEDS:
        sc = generate_scenario("cooperation", seed, difficulty)
        slots = set(sc.param_strs("slots"))
        blocked = _blocked_sets(sc)
        assert len(slots - set().union(*blocked)) == 1
        assert all(len(slots - b) >= 2 for b in blocked), seed


def test_cooperation_overlap_of_private_information_grows_with_difficulty() -> None:
    """The difficulty knob "how much each player's private information overlaps": the share of slots
    that two or more players know to be blocked is positive on easy and grows with difficulty."""
    mean = {}
    for difficulty in DIFFS:
        shares = []
        for seed in range(100):
            sc = generate_scenario("cooperation", seed, difficulty)
            blocked = _blocked_sets(sc)
            slots = sc.param_strs("slots")
            shares.append(sum(1 for x in slots if sum(x in b for b in blocked) >= 2) / len(slots))
        mean[difficulty] = sum(shares) / len(shares)
    assert 0 < mean["easy"] < mean["medium"] < mean["hard"]


COOP = scenario(
    "cooperation",
    {"slots": ["Monday 9am", "Monday 10am", "Tuesday 1pm", "Tuesday 2pm"], "first": 0},
    [
        ("Ann", "teammate", {"blocked": ["Monday 9am", "Tuesday 1pm"]}),
        ("Bo", "teammate", {"blocked": ["Monday 10am", "Tuesday 1pm"]}),
    ],
    6,
)


@pytest.mark.parametrize(
    ("transcript", "expected"),
    [
        # The answer is the rest of its line; a reason on the next line may name other slots.
        (
            [
                (0, "ANSWER: Tuesday 2pm\nbecause Monday 9am and Tuesday 1pm are out"),
                (1, "ANSWER: Tuesday 2pm"),
            ],
            {0: 1, 1: 1},
        ),
        # Two slots on the answer line are ambiguous, whichever comes first.
        ([(0, "ANSWER: Monday 9am or Tuesday 2pm")], {0: -1, 1: 0}),
        ([(0, "ANSWER: Tuesday 2pm or Monday 9am")], {0: -1, 1: 0}),
        ([(0, "ANSWER: Monday 10am or Monday 9am")], {0: -1, 1: 0}),
    ],
)
def test_cooperation_answer_line(transcript: list[tuple[int, str]], expected: dict[int, int]) -> None:
    assert verify(COOP, transcript).outcomes == expected


def test_allocation_heuristic_concedes_to_its_batna_late() -> None:
    """The heuristic's demand falls from its target to its reservation over the first 2/3 of the game:
    a proposal worth 30 to Bo (target 60, reservation 20) is refused at turn 1 and accepted at turn 10."""
    fam = get_family("allocation")
    offer = (0, "ALLOCATION: {desk: Bo, lamp: Ann, rug: Cy}")  # Bo gets the desk: 30
    early = _tracker_after(ALLOC3, [offer])
    assert not fam.heuristic(early, 1, random.Random(0)).endswith(
        "ACCEPT"
    )  # demand round(60 - 40*1.5/14) = 56
    chat = [(t % 3, "hi") for t in range(9)]
    late = _tracker_after(ALLOC3, [*chat, offer])  # Bo acts at turn 10: 1.5 * 10/14 > 1, demand = 20
    assert late.turns == 10 and late.acting() == [1]
    assert fam.heuristic(late, 1, random.Random(0)).endswith("ACCEPT")


def test_cooperation_status_line_reports_the_answers() -> None:
    t = _tracker_after(COOP, [])
    assert t.status() == "Nobody has answered yet."
    t = _tracker_after(COOP, [(0, "ANSWER: Tuesday 2pm")])
    assert t.status() == "Current answers: Ann Tuesday 2pm"
    t = _tracker_after(COOP, [(0, "ANSWER: Tuesday 2pm"), (1, "ANSWER: Monday 9am")])
    assert t.status() == "Current answers: Ann Tuesday 2pm, Bo Monday 9am"


def test_cooperation_instructions_render_for_every_valid_scenario() -> None:
    """A scenario passed in from outside only has to pass validation; the smallest valid one (a single
    candidate slot nobody blocks) must still render its instructions, with a candidate slot as example."""
    one_slot = scenario(
        "cooperation",
        {"slots": ["Monday 9am"], "first": 0},
        [("Ann", "teammate", {"blocked": []}), ("Bo", "teammate", {"blocked": []})],
        4,
    )
    fam = get_family("cooperation")
    for seat in (0, 1):
        assert "`ANSWER: Monday 9am`" in fam.instructions(one_slot, seat)
    text = fam.instructions(COOP, 0)
    assert any(f"`ANSWER: {slot}`" in text for slot in COOP.param_strs("slots"))
