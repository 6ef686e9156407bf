"""The parser's shortcut for answers in the prompt's own form ("vote 3", "pass") reads them exactly as
its general rules do.

Why: ``parse_action`` reads the exact form the prompt asks for with one small regex before the general
one (the general regex was most of an LLM turn's parse time). The shortcut is only right if every text it
accepts gets the same result as the general rules, so this test runs both on every such text — each
canonical kind word alone and with every 1-2 digit number — against the legal-action sets of real games.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from wolfpack_games.base import LegalAction
from wolfpack_games.werewolf import WerewolfEnv, random_bot
from wolfpack_games.werewolf import parser as parser_mod
from wolfpack_games.werewolf.parser import parse_action

KINDS = ("kill", "protect", "inspect", "save", "poison", "shoot", "badge", "elect", "vote")
CANONICAL = ["pass", *KINDS] + [f"{k} {n}" for k in KINDS for n in [*range(22), 99, "00", "07"]]


class _NeverMatches:
    def fullmatch(self, text: str) -> None:
        return None


def _legal_sets() -> list[tuple[LegalAction, ...]]:
    """Distinct legal-action sets of a few games of each size with sheriff and wolf king (a fixed
    sample of 100: the general rules take ~20 µs a text)."""
    seen: dict[Any, tuple[LegalAction, ...]] = {}
    for variant in ("6p", "9p", "12p"):
        env = WerewolfEnv(variant, sheriff=True, wolf_king=True, witch_self_save="always")
        for seed in range(3):
            env.reset(seed=seed)
            rng = random.Random(seed)
            while not env.done:
                acting = env.acting_seats()
                for s in acting:
                    legal = env.legal_actions(s)
                    seen.setdefault((legal, env.n), legal)
                env.step({s: random_bot(env, s, rng) for s in acting})
    sets = sorted(seen.values(), key=repr)
    return [(), *random.Random(0).sample(sets, min(100, len(sets)))]


def test_canonical_answers_parse_as_the_general_rules_read_them(monkeypatch: pytest.MonkeyPatch) -> None:
    legal_sets = _legal_sets()
    assert {la.kind for legal in legal_sets for la in legal} >= {*KINDS, "pass", "speak"}
    assert all(parser_mod._CANON_RE.fullmatch(t) for t in CANONICAL)  # the shortcut takes all of them
    fast = [[parse_action(t, legal, n) for t in CANONICAL] for legal in legal_sets for n in (6, 12)]
    monkeypatch.setattr(parser_mod, "_CANON_RE", _NeverMatches())
    slow = [[parse_action(t, legal, n) for t in CANONICAL] for legal in legal_sets for n in (6, 12)]
    assert fast == slow


@pytest.mark.parametrize("text", ["Vote 3", "vote 3.", " vote  3", "vote 123", "vote player 3", "passes"])
def test_other_forms_still_take_the_general_rules(text: str) -> None:
    assert parser_mod._CANON_RE.fullmatch(text.strip()) is None
