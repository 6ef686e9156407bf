"""bench/trainer/village_fidelity.py: the noisy heuristic village is the plain heuristic one at eps 0 and the
random one at eps 1, on the same held-out games, and which seats it makes noisy follows the dealt roles."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from wolfpack_games import make_game
from wolfpack_games.conformance import play
from wolfpack_games.werewolf.policies import heuristic_bot, random_bot

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench" / "trainer"))

from village_fidelity import village_roles, village_win_rate  # noqa: E402

GAMES = 60


def _plain(variant: str, village_bot: object) -> float:
    wins = 0
    for seed in range(1_000_000, 1_000_000 + GAMES):
        env = make_game("werewolf_v1", variant)
        env.reset(seed=seed)
        bots = {s: village_bot if env.knowledge(s).team == "village" else heuristic_bot for s in range(env.n)}
        play(env, bots, seed=seed)
        wins += env.winner() == "village"
    return wins / GAMES


def test_eps_0_is_the_heuristic_village_and_eps_1_the_random_one() -> None:
    assert village_win_rate("6p", 0.0, None, GAMES, "en", {}) == _plain("6p", heuristic_bot) > 0.2
    assert village_win_rate("6p", 1.0, None, GAMES, "en", {}) == _plain("6p", random_bot) < 0.1


def test_a_role_row_makes_only_that_role_noisy() -> None:
    assert village_roles("12p", {"wolf_king": True}) == ["guard", "hunter", "seer", "villager", "witch"]
    assert village_roles("6p", {}) == ["seer", "villager", "witch"]
    # the seer played at random sinks the 6p village, the witch much less (the table's eps 1 column)
    seer = village_win_rate("6p", 1.0, ["seer"], GAMES, "en", {})
    witch = village_win_rate("6p", 1.0, ["witch"], GAMES, "en", {})
    assert seer < witch < village_win_rate("6p", 0.0, ["witch"], GAMES, "en", {})


def test_a_kind_row_makes_only_that_kind_of_decision_noisy() -> None:
    from village_fidelity import decision_kind, decision_kinds

    kinds = decision_kinds("12p", "villager", 5, "zh", {"wolf_king": True})
    assert {"vote", "speak", "elect"} <= set(kinds) and "pass" not in kinds[:1]
    # a vote that may abstain is a vote; a decision offering only pass is a pass
    assert decision_kind([SimpleNamespace(kind="pass"), SimpleNamespace(kind="vote")]) == "vote"
    assert decision_kind([SimpleNamespace(kind="pass")]) == "pass"
    # the 12p villagers' votes carry the village, their speeches do not (the table's --by-kind rows)
    opts = {"wolf_king": True}
    plain = village_win_rate("12p", 0.0, ["villager"], GAMES, "zh", opts)
    votes = village_win_rate("12p", 1.0, ["villager"], GAMES, "zh", opts, frozenset({"vote"}))
    speeches = village_win_rate("12p", 1.0, ["villager"], GAMES, "zh", opts, frozenset({"speak"}))
    assert votes < 0.1 < plain and abs(speeches - plain) <= 0.15  # 60 games: the table (400) 0.51 vs 0.49
