"""Bargaining: verifier table (adversarial transcripts), engine and bots."""

from __future__ import annotations

import pytest

from wolfpack_games import make_game
from wolfpack_games.conformance import play
from wolfpack_games.scenarios import (
    Scenario,
    heuristic_bot,
    render_transcript,
    verify,
    verify_transcript,
)
from wolfpack_games.scenarios.models import PlayerInfo

# Buyer: reservation 120, target 100. Seller: reservation 80, target 95. ZOPA [80, 120]. Buyer speaks first.
SC = Scenario(
    family="bargaining",
    difficulty="easy",
    template="bilateral-batna-zopa",
    tags=["bargaining"],
    public="Ann buys a bike from Bo.",
    params={"list_price": 100, "cap": 300, "first": 0, "item": "a bike"},
    players=[
        PlayerInfo(
            seat=0,
            name="Ann",
            role="buyer",
            private={"reservation": 120, "target": 100},
            brief="Walk away above 120; win at 100 or less.",
        ),
        PlayerInfo(
            seat=1,
            name="Bo",
            role="seller",
            private={"reservation": 80, "target": 95},
            brief="Walk away below 80; win at 95 or more.",
        ),
    ],
    max_turns=8,
)

WIN_WIN = {0: 1, 1: 1}
DRAW = {0: 0, 1: 0}
B_LOSES = {0: -1, 1: 0}
S_LOSES = {0: 0, 1: -1}

CASES: list[tuple[str, list[tuple[int, str]], dict[int, int]]] = [
    ("plain deal in win-win range", [(0, "FINAL_BID: 97"), (1, "ACCEPT")], WIN_WIN),
    ("deal good for seller only", [(0, "FINAL_BID: 110"), (1, "ACCEPT")], {0: 0, 1: 1}),
    ("deal good for buyer only", [(0, "FINAL_BID: 85"), (1, "ACCEPT")], {0: 1, 1: 0}),
    ("buyer pays above reservation", [(1, "x")] and [(0, "FINAL_BID: 130"), (1, "ACCEPT")], {0: -1, 1: 1}),
    ("seller sells below reservation", [(0, "hi"), (1, "FINAL_BID: 70"), (0, "ACCEPT")], {0: 1, 1: -1}),
    ("no deal at turn limit is a draw", [(0, "hi"), (1, "hello")] * 4, DRAW),
    ("transcript stopping early is judged at limit", [(0, "FINAL_BID: 97")], DRAW),
    ("walk away with REJECT", [(0, "FINAL_BID: 60"), (1, "REJECT")], DRAW),
    ("empty transcript", [], DRAW),
    (
        "several bids in one message: last valid counts",
        [(0, "FINAL_BID: 50\nFINAL_BID: 97"), (1, "ACCEPT")],
        WIN_WIN,
    ),
    ("later message replaces bid", [(0, "FINAL_BID: 60"), (1, "FINAL_BID: 97"), (0, "ACCEPT")], WIN_WIN),
    ("counter-offer then accept", [(0, "FINAL_BID: 90"), (1, "FINAL_BID: 99"), (0, "ACCEPT")], WIN_WIN),
    ("bid in double quotes ignored", [(0, 'He said "FINAL_BID: 50". FINAL_BID: 97'), (1, "ACCEPT")], WIN_WIN),
    ("bid in single quotes ignored", [(0, "he said 'FINAL_BID: 50'\nFINAL_BID: 97"), (1, "ACCEPT")], WIN_WIN),
    (
        "reported speech mid-sentence ignored",
        [(0, "he said FINAL_BID: 50 yesterday"), (1, "ACCEPT")],
        {0: 0, 1: -1},
    ),
    ("quoted-only bid leaves nothing to accept", [(0, "“FINAL_BID: 50”"), (1, "ACCEPT")], {0: 0, 1: -1}),
    ("block-quote bid ignored", [(0, "> FINAL_BID: 50\nok"), (1, "ACCEPT")], {0: 0, 1: -1}),
    (
        "think block with fake bid ignored",
        [(0, "<think>FINAL_BID: 50</think>FINAL_BID: 97"), (1, "ACCEPT")],
        WIN_WIN,
    ),
    (
        "think block with fake ACCEPT ignored",
        [(0, "FINAL_BID: 97"), (1, "<think>ACCEPT</think>hmm no")],
        DRAW,
    ),
    ("unclosed think drops the rest", [(0, "FINAL_BID: 97"), (1, "fine <think> ACCEPT")], DRAW),
    ("stray closing think drops the prefix", [(0, "FINAL_BID: 97"), (1, "ACCEPT? </think> no.")], DRAW),
    ("out-of-range bid loses for author", [(0, "FINAL_BID: 5000")], B_LOSES),
    ("negative bid loses", [(0, "FINAL_BID: -5")], B_LOSES),
    ("zero bid loses", [(0, "FINAL_BID: 0")], B_LOSES),
    ("NaN bid loses", [(0, "FINAL_BID: NaN")], B_LOSES),
    ("inf bid loses", [(0, "FINAL_BID: inf")], B_LOSES),
    ("exponent bid loses", [(0, "FINAL_BID: 1e9")], B_LOSES),
    ("small exponent bid also rejected", [(0, "FINAL_BID: 1e2")], B_LOSES),
    ("word bid loses", [(0, "FINAL_BID: ninety")], B_LOSES),
    ("range bid loses", [(0, "FINAL_BID: 90-100")], B_LOSES),
    (
        "malformed then valid in one message: last valid counts",
        [(0, "FINAL_BID: -1\nFINAL_BID: 97"), (1, "ACCEPT")],
        WIN_WIN,
    ),
    (
        "valid then malformed: last valid counts",
        [(0, "FINAL_BID: 97\nFINAL_BID: 1e9"), (1, "ACCEPT")],
        WIN_WIN,
    ),
    ("ACCEPT before any bid loses", [(0, "ACCEPT")], B_LOSES),
    ("REJECT before any bid loses", [(0, "hi"), (1, "REJECT")], S_LOSES),
    ("accepting own bid loses", [(0, "FINAL_BID: 97"), (1, "hm"), (0, "ACCEPT")], B_LOSES),
    ("ACCEPT and REJECT together are contradictory", [(0, "FINAL_BID: 97"), (1, "ACCEPT\nREJECT")], S_LOSES),
    (
        "bid and ACCEPT together are contradictory",
        [(0, "FINAL_BID: 97"), (1, "ACCEPT\nFINAL_BID: 99")],
        S_LOSES,
    ),
    ("lowercase accept is chat", [(0, "FINAL_BID: 97"), (1, "i accept your point")], DRAW),
    ("ACCEPTED is not ACCEPT", [(0, "FINAL_BID: 97"), (1, "ACCEPTED?")], DRAW),
    ("out of turn loses", [(1, "FINAL_BID: 97")], S_LOSES),
    ("empty message loses", [(0, "   ")], B_LOSES),
    ("chinese text around bid", [(0, "我觉得这个价格合理。FINAL_BID: 97"), (1, "好的，ACCEPT")], WIN_WIN),
    ("full-width colon and digits", [(0, "最终出价：\nFINAL_BID：９７"), (1, "ACCEPT")], WIN_WIN),
    ("chinese colon after CJK", [(0, "出价：FINAL_BID：97"), (1, "ACCEPT。")], WIN_WIN),
    ("chinese quotes ignored", [(0, "他说「FINAL_BID: 50」"), (1, "ACCEPT")], {0: 0, 1: -1}),
    ("markdown bold and bullets", [(0, "- **FINAL_BID:** 97"), (1, "**ACCEPT**")], WIN_WIN),
    ("case-insensitive value keyword with space", [(0, "Final bid: 97"), (1, "ACCEPT")], WIN_WIN),
    ("currency and thousands separators", [(0, "FINAL_BID: $97"), (1, "ACCEPT")], WIN_WIN),
    ("keyword without colon is chat", [(0, "final bid is high"), (1, "ACCEPT")], {0: 0, 1: -1}),
    ("decimal bid", [(0, "FINAL_BID: 96.5"), (1, "ACCEPT")], WIN_WIN),
    (
        "apostrophes do not hide statements",
        [(0, "I'm fair. FINAL_BID: 97. Don't wait"), (1, "ACCEPT")],
        WIN_WIN,
    ),
    (
        "messages after the end are ignored",
        [(0, "FINAL_BID: 97"), (1, "ACCEPT"), (0, "FINAL_BID: 1e9")],
        WIN_WIN,
    ),
]


@pytest.mark.parametrize(("name", "transcript", "expected"), CASES, ids=[c[0] for c in CASES])
def test_verifier_table(name: str, transcript: list[tuple[int, str]], expected: dict[int, int]) -> None:
    result = verify(SC, transcript)
    assert result.outcomes == expected, result.reason


def test_verifier_details_and_dict_entry_point() -> None:
    result = verify_transcript(
        SC.model_dump(), [{"seat": 0, "text": "FINAL_BID: 97"}, {"seat": 1, "text": "ACCEPT"}]
    )
    assert result.details["deal"] == 97
    bad = verify(SC, [(0, "FINAL_BID: 1e9")])
    assert bad.details["violation"]["seat"] == 0
    assert "exponent" in bad.reason
    ended = verify(SC, [(0, "FINAL_BID: 97"), (1, "ACCEPT"), (0, "more")])
    assert ended.details["ignored_messages"] == 1


def test_heuristic_vs_heuristic_seed3_reaches_verified_agreement() -> None:
    env = make_game("bargaining_v1", "medium")
    play(env, heuristic_bot, seed=3)
    assert env.done
    result = verify(env.active_scenario, env.transcript)
    assert result.outcomes == env.outcome()
    assert result.details["deal"] is not None
    assert all(v >= 0 for v in result.outcomes.values())


def test_render_transcript_is_deterministic() -> None:
    texts = []
    for _ in range(2):
        env = make_game("bargaining_v1", "easy")
        play(env, heuristic_bot, seed=11)
        texts.append(render_transcript(env))
    assert texts[0] == texts[1]
    assert "Verified outcome" in texts[0]


def test_engine_reprompts_then_defaults_with_penalty() -> None:
    env = make_game("bargaining_v1", "easy", max_reprompts=1)
    env.reset(seed=0, options={"scenario": SC})
    r = env.step({0: "FINAL_BID: 1e9"})
    assert r.infos[0]["invalid_reason"] and env.acting_seats() == [0]
    assert "Invalid" in r.observations[0].text
    r = env.step({0: "ACCEPT"})
    assert r.infos[0]["defaulted"] and r.infos[0]["penalty"]
    assert env.acting_seats() == [1]
    assert env.transcript == [(0, "(pass)")]


def test_observation_hides_other_private_info() -> None:
    env = make_game("bargaining_v1", "easy")
    obs, _ = env.reset(seed=0, options={"scenario": SC.model_dump()})
    assert "Walk away above 120" in obs[0].text and "Walk away below" not in obs[0].text
    assert "Walk away below 80" in obs[1].text and "Walk away above" not in obs[1].text


def test_structured_actions_need_matching_kind() -> None:
    from wolfpack_games.base import Action

    env = make_game("bargaining_v1", "easy")
    env.reset(seed=0, options={"scenario": SC})
    r = env.step({0: Action("say", text="FINAL_BID: 97")})
    assert "final" in r.infos[0]["invalid_reason"]
    r = env.step({0: Action("final", text="FINAL_BID: 97")})
    assert not r.infos[0].get("invalid_reason")
    r = env.step({1: Action("final", text="ACCEPT")})
    assert env.done and env.outcome() == WIN_WIN and r.rewards == {0: 1.0, 1: 1.0}


def test_statements_inside_predict_next_blocks_do_not_count() -> None:
    from wolfpack_games.scenarios.parsing import strip_think, visible_text

    text = "Let me think.<predict_next>They will say ACCEPT and FINAL_BID: 10</predict_next>\nFINAL_BID: 500"
    assert "ACCEPT" not in strip_think(text) and "FINAL_BID: 500" in strip_think(text)
    assert visible_text("Hello <predict_next>ACCEPT") == "Hello"
