"""Verifier tables for allocation, cooperation, ultimatum, trust, public goods, PD and coalition.

Each row is (name, transcript, expected outcomes); adversarial rows cover quoting, think blocks,
malformed/out-of-range values, contradictions, missing confirmations and Chinese/full-width text.
"""

from __future__ import annotations

from typing import Any

import pytest

from wolfpack_games.scenarios import Scenario, verify
from wolfpack_games.scenarios.models import PlayerInfo

Row = tuple[str, list[tuple[int, str]], dict[int, int]]


def scenario(
    family: str, params: dict[str, Any], players: list[tuple[str, str, dict[str, Any]]], max_turns: int
) -> Scenario:
    return Scenario(
        family=family,
        difficulty="medium",
        template="test",
        tags=[family, "test"],
        public=f"test {family} scenario",
        params=params,
        players=[
            PlayerInfo(seat=i, name=n, role=r, private=p, brief=f"brief {i}")
            for i, (n, r, p) in enumerate(players)
        ],
        max_turns=max_turns,
    )


def rows_to_params(rows: list[Row]) -> Any:
    return pytest.mark.parametrize(("name", "transcript", "expected"), rows, ids=[r[0] for r in rows])


# ------------------------------------------------------------------------------------------ allocation
ALLOC = scenario(
    "allocation",
    {"items": ["desk", "lamp", "rug"], "first": 0},
    [
        (
            "Ann",
            "partner 1",
            {"values": {"lamp": 60, "desk": 30, "rug": 10}, "reservation": 40, "target": 60},
        ),
        ("Bo", "partner 2", {"values": {"lamp": 10, "desk": 30, "rug": 60}, "reservation": 40, "target": 60}),
    ],
    6,
)
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
    6,
)
A_GOOD = "ALLOCATION: {lamp: Ann, desk: Ann, rug: Bo}"
A_BAD = "ALLOCATION: {lamp: Bo, desk: Ann, rug: Ann}"
A_ALL = "ALLOCATION: {lamp: Ann, desk: Ann, rug: Ann}"
WW = {0: 1, 1: 1}
D2 = {0: 0, 1: 0}
L0 = {0: -1, 1: 0}
L1 = {0: 0, 1: -1}

ALLOCATION_ROWS: list[Row] = [
    ("agreed win-win", [(0, A_GOOD), (1, "ACCEPT")], WW),
    ("agreed bad for Bo", [(0, A_BAD), (1, "ACCEPT")], {0: 0, 1: -1}),
    ("agreed greedy", [(0, A_ALL), (1, "ACCEPT")], {0: 1, 1: -1}),
    ("json quoted keys", [(0, 'ALLOCATION: {"lamp": "Ann", "desk": "Ann", "rug": "Bo"}'), (1, "ACCEPT")], WW),
    (
        "multi-line json",
        [(0, 'ALLOCATION: {\n  "lamp": "Ann",\n  "desk": "Ann",\n  "rug": "Bo"\n}'), (1, "ACCEPT")],
        WW,
    ),
    ("case-insensitive names", [(0, "allocation: {LAMP: ann, Desk: ANN, rug: bo}"), (1, "ACCEPT")], WW),
    ("equals signs", [(0, "ALLOCATION = {lamp=Ann; desk=Ann; rug=Bo}"), (1, "ACCEPT")], WW),
    ("incomplete allocation loses", [(0, "ALLOCATION: {lamp: Ann, desk: Ann}")], L0),
    ("unknown item loses", [(0, "ALLOCATION: {lamp: Ann, desk: Ann, rug: Bo, sofa: Bo}")], L0),
    ("unknown player loses", [(0, "ALLOCATION: {lamp: Ann, desk: Zed, rug: Bo}")], L0),
    ("contradictory allocation loses", [(0, "ALLOCATION: {lamp: Ann, lamp: Bo, desk: Ann, rug: Bo}")], L0),
    (
        "repeated same owner is fine",
        [(0, "ALLOCATION: {lamp: Ann, lamp: Ann, desk: Ann, rug: Bo}"), (1, "ACCEPT")],
        WW,
    ),
    ("empty mapping loses", [(0, "ALLOCATION: {}")], L0),
    ("not a mapping loses", [(0, "ALLOCATION: lamp to Ann")], L0),
    ("unclosed brace loses", [(0, "ALLOCATION: {lamp: Ann, desk: Ann, rug: Bo")], L0),
    ("nested mapping loses", [(0, "ALLOCATION: {lamp: {Ann}, desk: Ann, rug: Bo}")], L0),
    ("two proposals: last valid counts", [(0, f"{A_BAD}\n{A_GOOD}"), (1, "ACCEPT")], WW),
    ("incomplete then complete", [(0, "ALLOCATION: {lamp: Ann}\n" + A_GOOD), (1, "ACCEPT")], WW),
    ("missing confirmation, stops early", [(0, A_GOOD)], D2),
    (
        "missing confirmation until limit",
        [(0, A_GOOD), (1, "hmm"), (0, "well?"), (1, "no"), (0, "ok"), (1, "bye")],
        D2,
    ),
    ("ACCEPT before any proposal", [(0, "ACCEPT")], L0),
    ("proposer accepts own proposal", [(0, A_GOOD), (1, "hmm"), (0, "ACCEPT")], L0),
    ("REJECT withdraws, later ACCEPT has nothing", [(0, A_GOOD), (1, "REJECT"), (0, "ACCEPT")], L0),
    ("counter-proposal replaces", [(0, A_ALL), (1, A_GOOD), (0, "ACCEPT")], WW),
    ("proposal and ACCEPT contradictory", [(0, A_ALL), (1, "ACCEPT\n" + A_GOOD)], L1),
    ("think block fake proposal", [(0, f"<think>{A_ALL}</think>{A_GOOD}"), (1, "ACCEPT")], WW),
    ("think block fake accept", [(0, A_GOOD), (1, "<think>ACCEPT</think> not yet")], D2),
    ("quoted proposal is chat", [(0, f'"{A_ALL}" would be greedy.'), (1, "ACCEPT")], L1),
    (
        "chinese full-width",
        [(0, "我建议这样分：\nALLOCATION：｛lamp：Ann，desk：Ann，rug：Bo｝"), (1, "同意。ACCEPT")],
        WW,
    ),
    ("out of turn", [(1, A_GOOD)], L1),
    ("after agreement ignored", [(0, A_GOOD), (1, "ACCEPT"), (0, "ALLOCATION: {}")], WW),
    ("lowercase accept is chat", [(0, A_GOOD), (1, "accept")], D2),
]

ALLOCATION3_ROWS: list[Row] = [
    (
        "3p needs everyone",
        [(0, "ALLOCATION: {lamp: Ann, desk: Cy, rug: Bo}"), (1, "ACCEPT")],
        {0: 0, 1: 0, 2: 0},
    ),
    (
        "3p all confirm",
        [(0, "ALLOCATION: {lamp: Ann, desk: Cy, rug: Bo}"), (1, "ACCEPT"), (2, "ACCEPT")],
        {0: 1, 1: 1, 2: 1},
    ),
    (
        "3p new proposal resets confirmations",
        [(0, "ALLOCATION: {lamp: Ann, desk: Cy, rug: Bo}"), (1, "ACCEPT"), (2, A_ALL), (0, "ACCEPT")],
        {0: 0, 1: 0, 2: 0},
    ),
    (
        "3p unassigned Cy is fine if complete",
        [(0, A_GOOD), (1, "ACCEPT"), (2, "ACCEPT")],
        {0: 1, 1: 1, 2: -1},
    ),
]


@rows_to_params(ALLOCATION_ROWS)
def test_allocation(name: str, transcript: list[tuple[int, str]], expected: dict[int, int]) -> None:
    result = verify(ALLOC, transcript)
    assert result.outcomes == expected, result.reason


@rows_to_params(ALLOCATION3_ROWS)
def test_allocation_three_players(
    name: str, transcript: list[tuple[int, str]], expected: dict[int, int]
) -> None:
    result = verify(ALLOC3, transcript)
    assert result.outcomes == expected, result.reason


# ----------------------------------------------------------------------------------------- cooperation
COOP = scenario(
    "cooperation",
    {"slots": ["Monday 9am", "Monday 10am", "Tuesday 1pm", "Tuesday 2pm"], "first": 0},
    [
        ("Ann", "teammate", {"blocked": ["Monday 9am", "Tuesday 1pm"]}),
        ("Bo", "teammate", {"blocked": ["Monday 10am", "Tuesday 1pm"]}),
    ],
    6,
)
RIGHT = "ANSWER: Tuesday 2pm"
WRONG = "ANSWER: Monday 9am"
TEAM_WIN = {0: 1, 1: 1}
TEAM_LOSS = {0: -1, 1: -1}

COOPERATION_ROWS: list[Row] = [
    ("both right", [(0, RIGHT), (1, RIGHT)], TEAM_WIN),
    ("both agree on wrong", [(0, WRONG), (1, WRONG)], TEAM_LOSS),
    ("disagree until limit", [(0, RIGHT), (1, WRONG)] * 3, TEAM_LOSS),
    ("revision reaches consensus", [(0, WRONG), (1, RIGHT), (0, RIGHT)], TEAM_WIN),
    ("last answer counts", [(0, RIGHT), (1, WRONG), (0, WRONG)], TEAM_LOSS),
    ("lowercase slot", [(0, "answer: tuesday 2pm"), (1, RIGHT)], TEAM_WIN),
    ("trailing punctuation", [(0, "ANSWER: Tuesday 2pm."), (1, "ANSWER: Tuesday 2pm!")], TEAM_WIN),
    ("unknown slot loses", [(0, "ANSWER: Sunday")], {0: -1, 1: 0}),
    ("ambiguous answer loses", [(0, "ANSWER: Tuesday 2pm or Monday 9am")], {0: -1, 1: 0}),
    ("near-miss slot loses", [(0, "ANSWER: Tuesday 22pm")], {0: -1, 1: 0}),
    ("think block fake answer", [(0, f"<think>{WRONG}</think>{RIGHT}"), (1, RIGHT)], TEAM_WIN),
    ("think-only answer does not count", [(0, f"<think>{RIGHT}</think>thinking"), (1, RIGHT)], TEAM_LOSS),
    ("quoted answer is chat", [(0, f'Bo said "{WRONG}"'), (1, RIGHT), (0, RIGHT)], TEAM_WIN),
    ("mid-sentence answer is chat", [(0, f"I think {WRONG} maybe"), (1, RIGHT), (0, RIGHT)], TEAM_WIN),
    (
        "chinese around answer",
        [(0, "我觉得是这个。ANSWER：Tuesday 2pm"), (1, "对，ANSWER: Tuesday 2pm")],
        TEAM_WIN,
    ),
    ("full-width digits", [(0, "ANSWER：Tuesday ２pm"), (1, RIGHT)], TEAM_WIN),
    ("several answers in one message", [(0, f"{WRONG}\n{RIGHT}"), (1, RIGHT)], TEAM_WIN),
    ("malformed then valid in one message", [(0, f"ANSWER: Sunday\n{RIGHT}"), (1, RIGHT)], TEAM_WIN),
    ("empty message loses", [(0, "<think>x</think>  ")], {0: -1, 1: 0}),
    ("stops early", [(0, RIGHT)], TEAM_LOSS),
    ("only chat", [(0, "hi"), (1, "hello")] * 3, TEAM_LOSS),
    ("out of turn", [(1, RIGHT)], {0: 0, 1: -1}),
    ("markdown bullet", [(0, "- **ANSWER:** Tuesday 2pm"), (1, RIGHT)], TEAM_WIN),
]


@rows_to_params(COOPERATION_ROWS)
def test_cooperation(name: str, transcript: list[tuple[int, str]], expected: dict[int, int]) -> None:
    result = verify(COOP, transcript)
    assert result.outcomes == expected, result.reason


# ------------------------------------------------------------------------------------------- ultimatum
ULT = scenario(
    "ultimatum",
    {"pot": 100, "first": 0},
    [("Ann", "proposer", {"target": 60}), ("Bo", "responder", {"threshold": 30})],
    4,
)
ULTIMATUM_ROWS: list[Row] = [
    ("fair offer accepted", [(0, "OFFER: 40"), (1, "ACCEPT")], WW),
    ("low offer accepted", [(0, "OFFER: 20"), (1, "ACCEPT")], {0: 1, 1: 0}),
    ("generous offer accepted", [(0, "OFFER: 50"), (1, "ACCEPT")], {0: 0, 1: 1}),
    ("zero offer accepted", [(0, "OFFER: 0"), (1, "ACCEPT")], {0: 1, 1: 0}),
    ("whole pot offered", [(0, "OFFER: 100"), (1, "ACCEPT")], {0: 0, 1: 1}),
    ("rejected: both lose", [(0, "OFFER: 40"), (1, "REJECT")], TEAM_LOSS),
    ("no offer by the limit", [(0, "hi"), (1, "hi"), (0, "hm"), (1, "well")], TEAM_LOSS),
    ("offer without decision", [(0, "OFFER: 40"), (1, "let me think")], TEAM_LOSS),
    ("responder cannot offer", [(0, "hi"), (1, "OFFER: 50")], L1),
    ("second offer is a violation", [(0, "OFFER: 40"), (1, "hmm"), (0, "OFFER: 30")], L0),
    ("accept before offer", [(0, "hi"), (1, "ACCEPT")], L1),
    ("proposer cannot accept", [(0, "OFFER: 40"), (1, "hmm"), (0, "ACCEPT")], L0),
    ("offer above pot", [(0, "OFFER: 101")], L0),
    ("negative offer", [(0, "OFFER: -5")], L0),
    ("fractional offer", [(0, "OFFER: 40.5")], L0),
    ("exponent offer", [(0, "OFFER: 4e1")], L0),
    ("NaN offer", [(0, "OFFER: nan")], L0),
    ("last valid offer in message counts", [(0, "OFFER: 20\nOFFER: 40"), (1, "ACCEPT")], WW),
    ("think fake offer", [(0, "<think>OFFER: 1</think>OFFER: 40"), (1, "ACCEPT")], WW),
    ("chinese full-width", [(0, "我给你：\nOFFER：４０"), (1, "好的。ACCEPT")], WW),
    ("chat between offer and accept", [(0, "OFFER: 40"), (1, "really?"), (0, "yes"), (1, "ACCEPT")], WW),
    ("ACCEPT and REJECT contradictory", [(0, "OFFER: 40"), (1, "ACCEPT\nREJECT")], L1),
    ("mid-line REJECT is prose, leading ACCEPT counts", [(0, "OFFER: 40"), (1, "ACCEPT or REJECT")], WW),
    ("quoted offer is chat", [(0, "'OFFER: 10' is what you expect?"), (1, "ACCEPT")], L1),
]


@rows_to_params(ULTIMATUM_ROWS)
def test_ultimatum(name: str, transcript: list[tuple[int, str]], expected: dict[int, int]) -> None:
    result = verify(ULT, transcript)
    assert result.outcomes == expected, result.reason


# ----------------------------------------------------------------------------------------------- trust
TRUST = scenario(
    "trust",
    {"endowment": 10, "multiplier": 3, "first": 0},
    [("Ann", "investor", {"target": 15}), ("Bo", "trustee", {"target": 12})],
    6,
)
TRUST_ROWS: list[Row] = [
    ("full trust, fair return", [(0, "SEND: 10"), (1, "RETURN: 15")], WW),
    ("break-even return", [(0, "SEND: 10"), (1, "RETURN: 10")], {0: 0, 1: 1}),
    ("betrayal", [(0, "SEND: 10"), (1, "RETURN: 0")], {0: -1, 1: 1}),
    ("send nothing ends the game", [(0, "SEND: 0"), (1, "RETURN: 0")], D2),
    ("partial send, generous return", [(0, "SEND: 5"), (1, "RETURN: 15")], {0: 1, 1: 0}),
    ("return more than received", [(0, "SEND: 5"), (1, "RETURN: 16")], L1),
    ("return before send", [(0, "hi"), (1, "RETURN: 5")], L1),
    ("investor cannot return", [(0, "RETURN: 5")], L0),
    ("trustee cannot send", [(0, "hi"), (1, "SEND: 5")], L1),
    ("second send", [(0, "SEND: 5"), (1, "hm"), (0, "SEND: 5")], L0),
    ("send above endowment", [(0, "SEND: 11")], L0),
    ("negative send", [(0, "SEND: -1")], L0),
    ("exponent send", [(0, "SEND: 1e1")], L0),
    (
        "send without return until limit",
        [(0, "SEND: 10"), (1, "thanks"), (0, "so?"), (1, "hmm"), (0, "well?"), (1, "later")],
        {0: -1, 1: -1},
    ),
    ("no send until limit", [(0, "hmm"), (1, "trust me")] * 3, D2),
    ("quoted send is chat", [(0, '"SEND: 10" is a lot'), (1, "RETURN: 5")], L1),
    ("chinese", [(0, "我全部投资。SEND：１０"), (1, "谢谢！RETURN：15")], WW),
    ("send and return together are contradictory", [(0, "SEND: 10\nRETURN: 5")], L0),
    ("decimal zero fraction is a whole number", [(0, "SEND: 10.0"), (1, "RETURN: 15")], WW),
    ("think fake return", [(0, "SEND: 10"), (1, "<think>RETURN: 0</think>RETURN: 15")], WW),
    ("last valid return counts", [(0, "SEND: 10"), (1, "RETURN: 0\nRETURN: 15")], WW),
]


@rows_to_params(TRUST_ROWS)
def test_trust(name: str, transcript: list[tuple[int, str]], expected: dict[int, int]) -> None:
    result = verify(TRUST, transcript)
    assert result.outcomes == expected, result.reason


# ---------------------------------------------------------------------------------------- public goods
PG = scenario(
    "public_goods",
    {"endowment": 10, "multiplier_x10": 20, "first": 0},
    [
        ("Ann", "citizen", {"target": 15}),
        ("Bo", "citizen", {"target": 15}),
        ("Cy", "citizen", {"target": 18}),
    ],
    9,
)
C10 = "CONTRIBUTE: 10"
C0 = "CONTRIBUTE: 0"
PUBLIC_GOODS_ROWS: list[Row] = [
    ("everyone contributes fully", [(0, C10), (1, C10), (2, C10)], {0: 1, 1: 1, 2: 1}),
    ("nobody contributes", [(0, C0), (1, C0), (2, C0)], {0: 0, 1: 0, 2: 0}),
    ("one free rider", [(0, C0), (1, C10), (2, C10)], {0: 1, 1: 0, 2: 0}),
    ("lone contributor", [(0, C10), (1, C0), (2, C0)], {0: -1, 1: 1, 2: 0}),
    (
        "missing contributions count as zero",
        [
            (0, C10),
            (1, "hi"),
            (2, "hi"),
            (0, "come on"),
            (1, "no"),
            (2, "no"),
            (0, "please"),
            (1, "no"),
            (2, "no"),
        ],
        {0: -1, 1: 1, 2: 0},
    ),
    ("contribute twice", [(0, C10), (1, C10), (2, "wait"), (0, C10)], {0: -1, 1: 0, 2: 0}),
    ("above endowment", [(0, "CONTRIBUTE: 11")], {0: -1, 1: 0, 2: 0}),
    ("fractional", [(0, "CONTRIBUTE: 2.5")], {0: -1, 1: 0, 2: 0}),
    (
        "quoted contribution is chat",
        [(0, "'CONTRIBUTE: 0' is tempting"), (1, C10), (2, C10), (0, C10)],
        {0: 1, 1: 1, 2: 1},
    ),
    ("think fake", [(0, f"<think>{C0}</think>{C10}"), (1, C10), (2, C10)], {0: 1, 1: 1, 2: 1}),
    ("chinese", [(0, "我出全部。CONTRIBUTE：１０"), (1, C10), (2, C10)], {0: 1, 1: 1, 2: 1}),
    (
        "chat then contributions",
        [(0, "all in?"), (1, "yes"), (2, "yes"), (0, C10), (1, C10), (2, C10)],
        {0: 1, 1: 1, 2: 1},
    ),
    ("out of turn", [(2, C10)], {0: 0, 1: 0, 2: -1}),
]


@rows_to_params(PUBLIC_GOODS_ROWS)
def test_public_goods(name: str, transcript: list[tuple[int, str]], expected: dict[int, int]) -> None:
    result = verify(PG, transcript)
    assert result.outcomes == expected, result.reason


# -------------------------------------------------------------------------------- prisoner's dilemma
PD = scenario(
    "prisoners_dilemma",
    {"rounds": 2, "T": 5, "R": 3, "P": 1, "S": 0},
    [("Ann", "player", {"target": 5}), ("Bo", "player", {"target": 5})],
    4,
)
C, D = "MOVE: C", "MOVE: D"
PD_ROWS: list[Row] = [
    ("mutual cooperation", [(0, C), (1, C), (0, C), (1, C)], WW),
    ("mutual defection", [(0, D), (1, D), (0, D), (1, D)], D2),
    ("sucker then defection", [(0, C), (1, D), (0, D), (1, D)], {0: -1, 1: 1}),
    ("either order within a round", [(1, C), (0, C), (0, C), (1, C)], WW),
    ("moving twice before the other is out of turn", [(0, C), (0, C)], L0),
    ("chat without a move", [(0, "let's cooperate")], L0),
    ("words", [(0, "MOVE: cooperate"), (1, "MOVE: Cooperate"), (0, "move: COOPERATE"), (1, "MOVE: c")], WW),
    ("chinese moves", [(0, "MOVE：合作"), (1, "MOVE: 合作"), (0, "我选择合作。MOVE: C"), (1, C)], WW),
    ("full-width keyword", [(0, "ＭＯＶＥ：Ｃ"), (1, C), (0, C), (1, C)], WW),
    ("unknown move", [(0, "MOVE: X")], L0),
    ("last valid move counts", [(0, "MOVE: C\nMOVE: D"), (1, C), (0, D), (1, D)], {0: 1, 1: -1}),
    ("quoted move is not a move", [(0, '"MOVE: C"')], L0),
    ("think fake move", [(0, "<think>MOVE: D</think>MOVE: C"), (1, C), (0, C), (1, C)], WW),
    ("truncated after one round", [(0, C), (1, C)], D2),
    ("messages after the last round ignored", [(0, C), (1, C), (0, C), (1, C), (0, D)], WW),
]


@rows_to_params(PD_ROWS)
def test_prisoners_dilemma(name: str, transcript: list[tuple[int, str]], expected: dict[int, int]) -> None:
    result = verify(PD, transcript)
    assert result.outcomes == expected, result.reason


# ------------------------------------------------------------------------------------------- coalition
COAL = scenario(
    "coalition",
    {
        "values": {
            "Ada": 10,
            "Bram": 5,
            "Cleo": 0,
            "Ada+Bram": 50,
            "Ada+Cleo": 40,
            "Bram+Cleo": 30,
            "Ada+Bram+Cleo": 90,
        },
        "first": 0,
    },
    [("Ada", "party", {"target": 40}), ("Bram", "party", {"target": 25}), ("Cleo", "party", {"target": 20})],
    9,
)
GRAND = "COALITION: {Ada: 40, Bram: 30, Cleo: 20}"
ALL3 = {0: 1, 1: 1, 2: 1}
DRAW3 = {0: 0, 1: 0, 2: 0}
COALITION_ROWS: list[Row] = [
    ("grand coalition, all accept", [(0, GRAND), (1, "ACCEPT"), (2, "ACCEPT")], ALL3),
    ("pair forms, outsider gets solo", [(0, "COALITION: {Ada: 30, Bram: 20}"), (1, "ACCEPT")], DRAW3),
    (
        "share below solo value loses",
        [(0, "COALITION: {Ada: 87, Bram: 3, Cleo: 0}"), (1, "ACCEPT"), (2, "ACCEPT")],
        {0: 1, 1: -1, 2: 0},
    ),
    (
        "shares not summing to the value",
        [(0, "COALITION: {Ada: 40, Bram: 30, Cleo: 30}")],
        {0: -1, 1: 0, 2: 0},
    ),
    ("proposer not a member", [(0, "COALITION: {Bram: 15, Cleo: 15}")], {0: -1, 1: 0, 2: 0}),
    (
        "non-member accepts",
        [(0, "COALITION: {Ada: 30, Bram: 20}"), (1, "hmm"), (2, "ACCEPT")],
        {0: 0, 1: 0, 2: -1},
    ),
    ("unknown player", [(0, "COALITION: {Ada: 40, Zed: 50}")], {0: -1, 1: 0, 2: 0}),
    ("contradictory shares", [(0, "COALITION: {Ada: 40, Ada: 30, Bram: 20}")], {0: -1, 1: 0, 2: 0}),
    ("negative share", [(0, "COALITION: {Ada: 95, Bram: -5}")], {0: -1, 1: 0, 2: 0}),
    ("partial acceptance until limit", [(0, GRAND), (1, "ACCEPT"), (2, "hmm")] * 3, DRAW3),
    ("REJECT withdraws", [(0, GRAND), (1, "REJECT"), (2, "ACCEPT")], {0: 0, 1: 0, 2: -1}),
    ("going alone ends the game", [(0, "COALITION: {Ada: 10}")], DRAW3),
    (
        "counter-proposal replaces",
        [(0, "COALITION: {Ada: 30, Bram: 20}"), (1, GRAND), (2, "ACCEPT"), (0, "ACCEPT")],
        ALL3,
    ),
    ("accept before proposal", [(0, "ACCEPT")], {0: -1, 1: 0, 2: 0}),
    (
        "think fake",
        [(0, f"<think>COALITION: {{Ada: 90}}</think>{GRAND}"), (1, "ACCEPT"), (2, "ACCEPT")],
        ALL3,
    ),
    (
        "chinese full-width",
        [
            (0, "大家合作吧。COALITION：｛Ada：４０，Bram：３０，Cleo：２０｝"),
            (1, "好。ACCEPT"),
            (2, "ACCEPT"),
        ],
        ALL3,
    ),
    ("quoted proposal is chat", [(0, f"“{GRAND}” is one idea"), (1, "ACCEPT")], {0: 0, 1: -1, 2: 0}),
    (
        "last valid proposal counts",
        [(0, "COALITION: {Ada: 99}\n" + GRAND), (1, "ACCEPT"), (2, "ACCEPT")],
        ALL3,
    ),
]


@rows_to_params(COALITION_ROWS)
def test_coalition(name: str, transcript: list[tuple[int, str]], expected: dict[int, int]) -> None:
    result = verify(COAL, transcript)
    assert result.outcomes == expected, result.reason


def test_public_goods_threshold_is_exact() -> None:
    # 2.3 * 30 / 3 is 22.999999999999996 in floating point; the verifier uses exact fractions.
    sc = scenario(
        "public_goods",
        {"endowment": 10, "multiplier_x10": 23, "first": 0},
        [
            ("Ann", "citizen", {"target": 23}),
            ("Bo", "citizen", {"target": 23}),
            ("Cy", "citizen", {"target": 23}),
        ],
        9,
    )
    assert verify(sc, [(0, C10), (1, C10), (2, C10)]).outcomes == {0: 1, 1: 1, 2: 1}


@pytest.mark.parametrize("seat", [-1, 2, 3, 99])
def test_seats_outside_the_scenario_are_rejected(seat: int) -> None:
    """ALLOC has seats 0 and 1: any other seat number is a malformed transcript, not a move."""
    assert ALLOC.num_players == 2
    with pytest.raises(ValueError, match=f"has seat {seat}"):
        verify(ALLOC, [(seat, "PROPOSE: 0 gets desk; 1 gets lamp, rug")])
    verify(ALLOC, [(1, "ACCEPT")])  # the last real seat is a seat (here: speaking out of turn)
