"""Seeded scenario generation: ``generate_scenario(family, seed, difficulty)`` and batches.

Why derive a per-scenario RNG from ``sha256(family|difficulty|seed)``: every scenario is reproducible on
its own (the CLI can regenerate #537 without generating #0-#536), and batches are stable when the
family list changes order. Distinctness is by content hash (the scenario id); a batch skips duplicates
and keeps drawing until it has ``n`` distinct scenarios.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from wolfpack_games.scenarios.families import available_families, get_family
from wolfpack_games.scenarios.models import DIFFICULTIES, Difficulty, Scenario


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def generate_scenario(family: str, seed: int, difficulty: Difficulty | str = "medium") -> Scenario:
    """One scenario; the same (family, seed, difficulty) always gives the same scenario. ``difficulty`` may
    also be one of the family's own variants (``Family.seats`` keys beyond the three levels, e.g.
    ultimatum's ``outside``), which the family's ``generate`` handles."""
    fam = get_family(family)
    if not isinstance(difficulty, str) or (difficulty not in DIFFICULTIES and difficulty not in fam.seats):
        raise ValueError(f"unknown difficulty {difficulty!r}; use one of {', '.join(fam.seats)}")
    diff: Difficulty = difficulty  # type: ignore[assignment]
    return fam.generate(_rng(family, diff, seed), diff)


def generate_scenarios(
    n: int,
    seed: int,
    families: Sequence[str] | None = None,
    difficulty: Difficulty | str | None = None,
) -> list[Scenario]:
    """``n`` distinct scenarios, cycling over families (and difficulties unless one is given)."""
    fams = list(families) if families else available_families()
    if not fams:
        raise ValueError("no scenario families available")
    diffs: list[str] = [difficulty] if difficulty else list(DIFFICULTIES)
    out: list[Scenario] = []
    seen: set[str] = set()
    i = 0
    attempts = 0
    while len(out) < n:
        family = fams[i % len(fams)]
        diff = diffs[(i // len(fams)) % len(diffs)]
        scenario = generate_scenario(family, seed * 1_000_003 + attempts, diff)
        attempts += 1
        if scenario.id in seen:
            if attempts > 50 * n + 100:
                raise RuntimeError(f"could not find {n} distinct scenarios for {fams} / {diffs}")
            continue
        seen.add(scenario.id)
        out.append(scenario)
        i += 1
    return out
