"""Engine behaviour beyond conformance (sealed moves, simultaneous rounds, registry) and bot quality."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wolfpack_games import list_games, make_game
from wolfpack_games.base import GameEnv
from wolfpack_games.conformance import compare_bots
from wolfpack_games.scenarios import (
    FAMILY_NAMES,
    Scenario,
    available_families,
    generate_scenario,
    get_family,
    heuristic_bot,
    random_bot,
    render_scenario,
    verify,
)


def test_all_families_registered_with_variants_and_bots() -> None:
    assert set(available_families()) == set(FAMILY_NAMES)
    ids = {spec.game_id for spec in list_games()}
    for family in FAMILY_NAMES:
        spec = next(s for s in list_games() if s.game_id == get_family(family).game_id)
        assert spec.game_id in ids
        extra = {"outside"} if family == "ultimatum" else set()  # ultimatum's outside-option variant
        assert set(spec.variants) == {"easy", "medium", "hard", *extra}
        assert spec.default_bot == "heuristic" and set(spec.bots) == {"heuristic", "random"}
        for variant, seats in spec.variants.items():
            env = make_game(spec.game_id, variant)
            obs, _ = env.reset(seed=1)
            assert len(obs) == seats


def test_reset_with_scenario_of_another_family_fails() -> None:
    env = make_game("bargaining_v1")
    with pytest.raises(ValueError, match="does not match"):
        env.reset(seed=0, options={"scenario": generate_scenario("trust", 0, "easy")})


def test_passed_scenario_overrides_generation() -> None:
    sc = generate_scenario("bargaining", 42, "hard")
    env = make_game("bargaining_v1", "easy")
    env.reset(seed=0, options={"scenario": sc.model_dump(mode="json")})
    assert env.active_scenario == sc  # type: ignore[attr-defined]


def test_public_goods_contributions_are_sealed_until_everyone_contributed() -> None:
    env = make_game("public_goods_v1", "easy")
    env.reset(seed=0)
    env.step({0: "I put in seven.\nCONTRIBUTE: 7"})
    other = env.observe(1).text
    assert "CONTRIBUTE: 7" not in other and "sealed decision submitted" in other
    assert "I put in seven." in other
    assert "CONTRIBUTE: 7" in env.observe(0).text
    assert all(ev.text.find("CONTRIBUTE: 7") < 0 for ev in env.events if ev.channel == "public")
    env.step({1: "CONTRIBUTE: 1"})
    env.step({2: "CONTRIBUTE: 2"})
    assert env.done
    assert "All contributions revealed" in env.observe(1).text


def test_prisoners_dilemma_rounds_are_simultaneous_and_sealed() -> None:
    env = make_game("prisoners_dilemma_v1", "easy")
    env.reset(seed=0)
    assert env.acting_seats() == [0, 1]
    env.step({0: "MOVE: D"})
    assert env.acting_seats() == [1]
    convo = env.observe(1).text.split("Conversation so far:")[1]
    assert "defected" not in convo and "MOVE: D" not in convo and "sealed decision" in convo
    env.step({1: "MOVE: C"})
    assert env.acting_seats() == [0, 1]
    assert "Round 1:" in env.observe(1).text
    r = env.step({0: "just chatting", 1: "MOVE: C"})
    assert "MOVE" in r.infos[0]["invalid_reason"] and env.acting_seats() == [0]


def test_prisoners_dilemma_garbage_defaults_to_defect() -> None:
    env = make_game("prisoners_dilemma_v1", "easy", max_reprompts=0)
    env.reset(seed=0)
    r = env.step({0: "???", 1: "MOVE: C"})
    assert r.infos[0]["defaulted"] and r.infos[0]["penalty"]
    assert env.transcript[0] == (0, "MOVE: D")  # type: ignore[attr-defined]


def test_not_your_turn_is_reported_without_penalty() -> None:
    env = make_game("bargaining_v1")
    env.reset(seed=0)
    idle = 1 - env.acting_seats()[0]
    r = env.step({idle: "FINAL_BID: 10"})
    assert r.infos[idle]["invalid_reason"] == "it is not your turn" and "penalty" not in r.infos[idle]


def _nonneg(env: GameEnv) -> bool:
    return min(env.outcome().values()) >= 0


def _detail(key: str) -> Callable[[GameEnv], bool]:
    def success(env: GameEnv) -> bool:
        return bool(verify(env.active_scenario, env.transcript).details[key])  # type: ignore[attr-defined]

    return success


# The claim, stated before measuring: on the same 120 seeds (difficulties in rotation), the heuristic bots
# reach the game's goal (every seat's outcome >= 0, or an agreement) on at least 90% of seeds, at least 10
# percentage points more often than random bots, and a one-sided exact sign test on the seeds where they
# differ gives p < 0.001. Measured on 150 seeds (2026-11-26): heuristic 100% in every game; random 6%
# (cooperation) to 80% (prisoner's dilemma), so effects +0.20..+0.94.
GOALS: dict[str, Callable[[GameEnv], bool]] = {
    "cooperation_v1": _nonneg,
    "public_goods_v1": _nonneg,
    "prisoners_dilemma_v1": _nonneg,
    "trust_v1": _nonneg,
    "ultimatum_v1": _detail("accepted"),
    "coalition_v1": _detail("coalition"),
    "bargaining_v1": lambda env: verify(env.active_scenario, env.transcript).details["deal"] is not None,  # type: ignore[attr-defined]
}


@pytest.mark.parametrize("game_id", sorted(GOALS))
def test_heuristic_bots_beat_random_bots(game_id: str) -> None:
    result = compare_bots(
        lambda seed: make_game(game_id, ["easy", "medium", "hard"][seed % 3]),
        lambda env: heuristic_bot,
        lambda env: random_bot,
        GOALS[game_id],
        range(120),
    )
    assert result.a_successes >= 0.9 * result.seeds, result
    assert result.effect >= 0.10 and result.p_value < 1e-3, result


def test_render_scenario_hides_private_on_request() -> None:
    sc = generate_scenario("allocation", 3, "medium")
    assert sc.players[0].brief in render_scenario(sc)
    assert sc.players[0].brief not in render_scenario(sc, reveal_private=False)


def test_invalid_scenarios_raise_validation_errors() -> None:
    data = generate_scenario("trust", 0, "easy").model_dump()
    data.pop("id"), data.pop("split")
    data["players"][0]["private"] = {}
    with pytest.raises(ValueError, match="invalid trust scenario"):
        Scenario.model_validate(data)
    data["family"] = "chess"
    with pytest.raises(ValueError):
        Scenario.model_validate(data)


SCENARIOS = {f: generate_scenario(f, 0, "medium") for f in FAMILY_NAMES}
texts = st.one_of(
    st.text(max_size=60),
    st.builds(
        lambda kw, sep, val, pre: f"{pre}{kw}{sep}{val}",
        st.sampled_from(
            [
                "FINAL_BID",
                "ACCEPT",
                "REJECT",
                "ALLOCATION",
                "ANSWER",
                "OFFER",
                "SEND",
                "RETURN",
                "CONTRIBUTE",
                "MOVE",
                "COALITION",
            ]
        ),
        st.sampled_from([": ", "：", "=", " ", ""]),
        st.one_of(st.text(max_size=20), st.integers(-10, 10**6).map(str), st.just("{a: b}"), st.just("C")),
        st.sampled_from(["", "\n", "<think>", "</think>", '"', "。", "> "]),
    ),
)


@settings(max_examples=150, deadline=None)
@given(
    family=st.sampled_from(FAMILY_NAMES), messages=st.lists(st.tuples(st.integers(0, 4), texts), max_size=8)
)
def test_verify_never_crashes(family: str, messages: list[tuple[int, str]]) -> None:
    sc = SCENARIOS[family]
    transcript = [(seat % sc.num_players, text) for seat, text in messages]
    result = verify(sc, transcript)
    assert set(result.outcomes) == set(range(sc.num_players))
    assert all(v in (-1, 0, 1) for v in result.outcomes.values())
    assert verify(sc, transcript) == result  # pure


@settings(max_examples=100, deadline=None)
@given(family=st.sampled_from(FAMILY_NAMES), text=texts)
def test_engine_never_crashes_on_text(family: str, text: str) -> None:
    env = make_game(get_family(family).game_id, "medium")
    env.reset(seed=0)
    for _ in range(3):
        if env.done:
            break
        env.step({s: text for s in env.acting_seats()})
