"""Every family: conformance checks, generator determinism/diversity/solvability, store round-trip."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from wolfpack_games import get_game, make_game
from wolfpack_games.base import Action, GameEnv
from wolfpack_games.conformance import BotFn, api_test, malformed_action_test, play, seed_test
from wolfpack_games.scenarios import (
    RedisScenarioStore,
    Scenario,
    ScenarioStore,
    available_families,
    generate_scenario,
    generate_scenarios,
    get_family,
    heuristic_bot,
    open_store,
    random_bot,
    render_transcript,
    verify,
)

FAMILIES = available_families()
DIFFS = ["easy", "medium", "hard"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("difficulty", DIFFS)
def test_conformance(family: str, difficulty: str) -> None:
    game_id = get_family(family).game_id
    spec = get_game(game_id)
    assert set(spec.bots) == {"heuristic", "random"}
    assert difficulty in spec.variants

    def make() -> object:
        return make_game(game_id, difficulty)

    for seed in range(3):
        api_test(make, heuristic_bot, seed=seed)  # type: ignore[arg-type]
        api_test(make, random_bot, seed=seed)  # type: ignore[arg-type]
    seed_test(make, random_bot)  # type: ignore[arg-type]
    seed_test(make, heuristic_bot)  # type: ignore[arg-type]
    malformed_action_test(make)  # type: ignore[arg-type]


def _recording(bot: BotFn, sent: list[tuple[int, str]]) -> BotFn:
    """``bot``, noting each (seat, text) it sends: a transcript kept outside the engine."""

    def recording(env: GameEnv, seat: int, rng: random.Random) -> Action:
        action = bot(env, seat, rng)
        sent.append((seat, action if isinstance(action, str) else action.text))
        return action

    return recording


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_scores_exactly_the_moves_played(family: str) -> None:
    """The engine's outcome is the verifier's verdict on the moves the players actually sent, in order.

    (``outcome()`` calls ``verify`` on the engine's own transcript, so comparing those two would test
    nothing; the oracle here is a transcript recorded outside the engine, from what the bots returned.
    ``verify`` itself is checked against hand-computed tables in test_verifier_tables.py.)"""
    game_id = get_family(family).game_id
    for seed in range(10):
        sent: list[tuple[int, str]] = []
        env = make_game(game_id, DIFFS[seed % 3])
        env.reset(seed=seed)
        assert env.outcome() == {s: 0 for s in env.possible_agents}  # no verdict before the end
        play(env, _recording(heuristic_bot, sent), seed=seed)
        assert env.done and sent
        assert env.outcome() == verify(env.active_scenario, sent).outcomes  # type: ignore[attr-defined]
        assert render_transcript(env).endswith("\n")  # type: ignore[arg-type]


@pytest.mark.parametrize("family", FAMILIES)
def test_observations_never_leak_other_private_briefs(family: str) -> None:
    env = make_game(get_family(family).game_id, "medium")
    play(env, heuristic_bot, seed=5)
    sc = env.active_scenario  # type: ignore[attr-defined]
    for p in sc.players:
        text = env.observe(p.seat).text
        assert p.brief in text
        for other in sc.players:
            if other.seat != p.seat and other.brief != p.brief:
                assert other.brief not in text


def test_generator_is_deterministic() -> None:
    a = generate_scenarios(200, seed=5)
    b = generate_scenarios(200, seed=5)
    assert [s.id for s in a] == [s.id for s in b]
    assert [s.model_dump() for s in a] == [s.model_dump() for s in b]
    c = generate_scenarios(200, seed=6)
    assert {s.id for s in a} != {s.id for s in c}
    for family in FAMILIES:
        assert generate_scenario(family, 9, "hard") == generate_scenario(family, 9, "hard")


def test_generator_1000_distinct_valid_solvable() -> None:
    # No wall-clock bound here: generator speed is a bench/ number, not a pass/fail on a shared CPU.
    scenarios = generate_scenarios(1000, seed=1)
    assert len({s.id for s in scenarios}) == 1000
    assert {s.family for s in scenarios} == set(FAMILIES)
    assert {s.difficulty for s in scenarios} == set(DIFFS)
    splits = {s.split for s in scenarios}
    assert splits == {"train", "eval"}
    for sc in scenarios:
        # Valid by construction: the JSON round-trip re-runs every check, including the id hash.
        assert Scenario.model_validate_json(sc.model_dump_json()) == sc
        # Solvable: the family's constructive solver yields a transcript where nobody loses.
        result = verify(sc, get_family(sc.family).solution(sc))
        assert min(result.outcomes.values()) >= 0, (sc.id, result.reason)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_difficulty_many_seeds_solvable(family: str) -> None:
    fam = get_family(family)
    for difficulty in DIFFS:
        for seed in range(150):
            sc = generate_scenario(family, seed, difficulty)
            assert sc.num_players == fam.seats[difficulty]
            result = verify(sc, fam.solution(sc))
            assert min(result.outcomes.values()) >= 0, (sc.id, result.reason)


def test_scenario_rejects_tampering() -> None:
    sc = generate_scenario(FAMILIES[0], 1, "easy")
    data = sc.model_dump()
    data["max_turns"] = data["max_turns"] + 1
    with pytest.raises(ValueError, match="content hash"):
        Scenario.model_validate(data)
    data = sc.model_dump()
    data["unexpected"] = 1
    with pytest.raises(ValueError):
        Scenario.model_validate(data)
    data = sc.model_dump()
    data.pop("id")
    data.pop("split")
    assert Scenario.model_validate(data) == sc


@pytest.fixture(params=["sqlite", "redis"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], ScenarioStore]:
    """Opens the same store each call: a SQLite file, or Redis under a key prefix unique to the test
    (never flushing a database that may be shared)."""
    if request.param == "sqlite":
        return lambda: open_store(f"sqlite:///{tmp_path / 's.sqlite3'}")
    url: str = request.getfixturevalue("redis_url")
    prefix = f"test:{uuid.uuid4().hex}"
    return lambda: RedisScenarioStore(url, prefix=prefix)


def test_store_round_trip(make_store: Callable[[], ScenarioStore]) -> None:
    scenarios = generate_scenarios(60, seed=2)
    store = make_store()
    assert isinstance(store, ScenarioStore)
    assert store.insert(scenarios) == 60
    assert store.insert(scenarios[:10]) == 0  # idempotent by id
    assert store.count() == 60
    for sc in scenarios[:5]:
        assert store.get(sc.id) == sc
    assert store.get("nope") is None
    store.close()
    reopened = make_store()
    fam = scenarios[0].family
    assert reopened.count(family=fam) == sum(s.family == fam for s in scenarios)
    listed = reopened.list(family=fam)
    assert [s.id for s in listed] == sorted(s.id for s in scenarios if s.family == fam)
    for split in ("train", "eval"):
        assert reopened.count(split=split) == sum(s.split == split for s in scenarios)
    assert reopened.count(difficulty="hard") == sum(s.difficulty == "hard" for s in scenarios)
    tag = scenarios[0].tags[0]
    assert reopened.count(tag=tag) == sum(tag in s.tags for s in scenarios)
    assert reopened.count(tag=tag, family=fam, difficulty="easy") == sum(
        tag in s.tags and s.family == fam and s.difficulty == "easy" for s in scenarios
    )
    page = reopened.list(limit=7, offset=3)
    assert [s.id for s in page] == sorted(s.id for s in scenarios)[3:10]
    reopened.close()


def test_unknown_store_scheme_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unsupported scenario store URL"):
        open_store("mongodb://localhost")


def test_random_vs_heuristic_never_crashes() -> None:
    rng = random.Random(0)
    for family in FAMILIES:
        game_id = get_family(family).game_id
        for seed in range(5):
            env = make_game(game_id, rng.choice(DIFFS))
            bots = {s: (heuristic_bot if s % 2 else random_bot) for s in range(8)}
            env.reset(seed=seed)
            play(env, {s: bots[s] for s in env.possible_agents}, seed=seed)
            assert env.done
