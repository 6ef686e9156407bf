"""Ultimatum's ``outside`` variant (the training demo's task): the responder must compare the offer with
its outside option, so no constant answer wins much more than half the games and reading both wins all."""

from __future__ import annotations

import random

import pytest

from wolfpack_games import get_game, make_game
from wolfpack_games.scenarios import generate_scenario, get_family, verify

SEEDS = range(1_000_000, 1_000_400)


def _responder_wins(move: str) -> float:
    bots = get_game("ultimatum_v1").bots
    wins = 0
    for seed in SEEDS:
        env = make_game("ultimatum_v1", "outside")
        env.reset(seed=seed)
        rng = random.Random(seed)
        while not env.done:
            env.step(
                {
                    s: bots["heuristic"](env, s, rng)
                    if s == 0
                    else bots[move](env, s, rng)
                    if move in bots
                    else move
                    for s in env.acting_seats()
                }
            )
        wins += env.outcome()[1] > 0
    return wins / len(SEEDS)


def test_generator_puts_offers_on_both_sides_of_the_outside_option() -> None:
    sides = []
    for seed in SEEDS:
        sc = generate_scenario("ultimatum", seed, "outside")
        pot, outside, target = (
            sc.param_int("pot"),
            sc.private_int(1, "threshold"),
            sc.private_int(0, "target"),
        )
        offer = pot - target
        assert pot == 10 and 4 <= outside <= 6 and 1 <= abs(offer - outside) <= 2
        assert sc.params["rule"] == "outside" and sc.params["outside"] == outside
        assert sc.difficulty == "medium" and sc.max_turns == 4
        sides.append(offer > outside)
        assert min(verify(sc, get_family("ultimatum").solution(sc)).outcomes.values()) >= 0
    assert 0.4 < sum(sides) / len(sides) < 0.6


@pytest.mark.parametrize(
    ("transcript", "outcomes"),
    [
        ([(0, "OFFER: 6"), (1, "ACCEPT")], {0: 1, 1: 1}),  # offer above the outside option 5: accept wins
        ([(0, "OFFER: 6"), (1, "REJECT")], {0: -1, 1: -1}),  # walking away from the better offer loses
        ([(0, "OFFER: 3"), (1, "REJECT")], {0: -1, 1: 1}),  # the outside option beats a low offer
        ([(0, "OFFER: 3"), (1, "ACCEPT")], {0: 1, 1: -1}),  # taking the smaller loses
        ([(0, "OFFER: 5"), (1, "REJECT")], {0: -1, 1: 1}),  # a tie: either answer wins
        ([(0, "OFFER: 5"), (1, "ACCEPT")], {0: 1, 1: 1}),
        ([(0, "OFFER: 6")], {0: -1, 1: -1}),  # no decision: both lose
    ],
)
def test_outside_verdict_table(transcript: list[tuple[int, str]], outcomes: dict[int, int]) -> None:
    sc = generate_scenario("ultimatum", 0, "outside")
    sc = sc.model_copy(
        update={
            "id": "",
            "split": None,
            "params": {**sc.params, "outside": 5},
            "players": [
                sc.players[0].model_copy(update={"private": {"target": 4}}),
                sc.players[1].model_copy(update={"private": {"threshold": 5}}),
            ],
        }
    )
    sc = type(sc).model_validate(sc.model_dump())
    assert verify(sc, transcript).outcomes == outcomes


def test_only_reading_offer_and_outside_option_wins_every_game() -> None:
    assert _responder_wins("heuristic") == 1.0
    accept, reject = _responder_wins("ACCEPT"), _responder_wins("REJECT")
    assert 0.35 < accept < 0.65 and 0.35 < reject < 0.65 and accept + reject == pytest.approx(1.0)
    assert _responder_wins("random") < 0.55


def test_the_outside_option_is_public_and_must_match_the_threshold() -> None:
    sc = generate_scenario("ultimatum", 7, "outside")
    outside = sc.param_int("outside")
    env = make_game("ultimatum_v1", "outside")
    env.reset(seed=7)
    env.step({0: f"OFFER: {outside + 1}"})
    assert f"outside option: {outside}." in env.observe(0).text  # the proposer sees it too
    bad = sc.model_dump()
    bad.update(id="", split=None, params={**sc.params, "outside": outside + 1})
    with pytest.raises(ValueError, match="outside option"):
        type(sc).model_validate(bad)
