"""Cooperation with information split across players: a *hidden profile* task (Stasser & Titus 1985).

The team must pick the one meeting slot everyone can attend. Each player privately knows only which
slots *they* cannot make; no player can find the answer alone, but pooling the information leaves
exactly one slot. Every player states ``ANSWER: <slot>``; a player's last answer counts and may be
revised. The game ends as soon as all players' current answers coincide.

Verdict (a team outcome): agreement on the correct slot — everyone +1; agreement on a wrong slot, or no
agreement by the turn limit — everyone -1. Difficulty knobs: players, slots, and how much each
player's private information overlaps.
"""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar

from wolfpack_games.scenarios.families.base import PASS_TEXT, Family, Tracker
from wolfpack_games.scenarios.models import (
    Difficulty,
    PlayerInfo,
    Scenario,
    VerificationResult,
    as_strs,
)
from wolfpack_games.scenarios.parsing import ParsedMessage, StatementError, StatementSpec

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
HOURS = ("9am", "10am", "11am", "1pm", "2pm", "3pm", "4pm")
NAMES = ("Ivy", "Jon", "Kai", "Lea", "Max", "Nia", "Oto", "Pia")
SLOTS: dict[Difficulty, int] = {"easy": 5, "medium": 8, "hard": 12}
EXTRA_BLOCK: dict[Difficulty, float] = {"easy": 0.1, "medium": 0.25, "hard": 0.35}
SHARE_PREFIX = "I cannot make:"


def blocked_of(scenario: Scenario, seat: int) -> list[str]:
    return as_strs(scenario.private_value(seat, "blocked"), "blocked")


def answer_of(scenario: Scenario) -> str:
    """The unique slot nobody blocked (derived, never stored, so the scenario cannot disagree with it)."""
    blocked = {b for s in range(scenario.num_players) for b in blocked_of(scenario, s)}
    free = [slot for slot in scenario.param_strs("slots") if slot not in blocked]
    if len(free) != 1:
        raise ValueError(f"exactly one slot must be free for everyone, found {free}")
    return free[0]


class CooperationTracker(Tracker):
    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.answers: dict[int, str] = {}

    def check(self, seat: int, msg: ParsedMessage) -> str:
        return ""

    def apply(self, seat: int, msg: ParsedMessage) -> list[str]:
        if msg.keyword == "ANSWER":
            self.answers[seat] = str(msg.value)
            if len(self.answers) == self.n and len(set(self.answers.values())) == 1:
                self.ended = "consensus"
                return [f"Everyone answered {msg.value}."]
        return []

    def status(self) -> str:
        if not self.answers:
            return "Nobody has answered yet."
        return "Current answers: " + ", ".join(
            f"{self.scenario.name(s)} {a}" for s, a in sorted(self.answers.items())
        )

    def verdict(self) -> VerificationResult:
        correct = answer_of(self.scenario)
        seats = range(self.n)
        if self.ended:
            chosen = next(iter(self.answers.values()))
            ok = chosen == correct
            return VerificationResult(
                outcomes={s: 1 if ok else -1 for s in seats},
                reason=f"team agreed on {chosen}; the correct slot is {correct}",
                details={"answer": chosen, "correct": correct},
            )
        return VerificationResult(
            outcomes={s: -1 for s in seats},
            reason=f"no consensus before the turn limit; the correct slot was {correct}",
            details={
                "answers": {self.scenario.name(s): a for s, a in self.answers.items()},
                "correct": correct,
            },
        )


class Cooperation(Family):
    name = "cooperation"
    game_id = "cooperation_v1"
    title = "Cooperation: hidden-profile scheduling"
    theory = "hidden profiles and information pooling in groups (Stasser & Titus 1985)"
    specs = (StatementSpec.value("ANSWER"),)
    seats: ClassVar[dict[str, int]] = {"easy": 2, "medium": 3, "hard": 4}

    def generate(self, rng: random.Random, difficulty: Difficulty) -> Scenario:
        n = self.seats[difficulty]
        all_slots = [f"{d} {h}" for d in DAYS for h in HOURS]
        chosen = set(rng.sample(all_slots, SLOTS[difficulty]))
        slots = [s for s in all_slots if s in chosen]
        answer = rng.choice(slots)
        blocked: list[set[str]] = [set() for _ in range(n)]
        for slot in slots:
            if slot == answer:
                continue
            blocked[rng.randrange(n)].add(slot)
            for s in range(n):
                if rng.random() < EXTRA_BLOCK[difficulty]:
                    blocked[s].add(slot)
        # Nobody may solve it alone: every player must still see at least two possible slots.
        for s in range(n):
            while len(slots) - len(blocked[s]) < 2:
                slot = sorted(blocked[s])[rng.randrange(len(blocked[s]))]
                blocked[s].discard(slot)
                blocked[(s + 1 + rng.randrange(n - 1)) % n].add(slot)
        names = rng.sample(NAMES, n)
        max_turns = 4 * n
        players = [
            PlayerInfo(
                seat=s,
                name=names[s],
                role="teammate",
                private={"blocked": [x for x in slots if x in blocked[s]]},
                brief=(
                    "You cannot attend: "
                    + (", ".join(x for x in slots if x in blocked[s]) or "(no conflicts)")
                    + "."
                ),
            )
            for s in range(n)
        ]
        public = (
            f"{', '.join(names)} must schedule one meeting that everyone can attend. Candidate slots: "
            f"{', '.join(slots)}. Exactly one slot works for everybody. Each of you privately knows only your own "
            f"conflicts. Everyone must state the same answer; at most {max_turns} messages."
        )
        return Scenario(
            family=self.name,
            difficulty=difficulty,
            template="hidden-profile-scheduling",
            tags=["cooperation", "information-pooling", f"{n}p", f"slots-{len(slots)}"],
            public=public,
            params={"slots": slots, "first": 0},
            players=players,
            max_turns=max_turns,
        )

    def check(self, scenario: Scenario) -> None:
        slots = scenario.param_strs("slots")
        for s in range(scenario.num_players):
            if not set(blocked_of(scenario, s)) <= set(slots):
                raise ValueError("blocked slots must be candidate slots")
        answer_of(scenario)

    def parse_value(self, scenario: Scenario, keyword: str, rest: str) -> Any:
        line = rest.split("\n", 1)[0].strip().lower()
        slots = sorted(scenario.param_strs("slots"), key=len, reverse=True)
        for slot in slots:
            m = re.match(re.escape(slot.lower()) + r"(?![A-Za-z0-9])", line)
            if m:
                tail = line[m.end() :]
                others = [
                    o
                    for o in slots
                    if o != slot and re.search(re.escape(o.lower()) + r"(?![A-Za-z0-9])", tail)
                ]
                if others:
                    raise StatementError(f"ambiguous answer: names {slot} and {others[0]}")
                return slot
        raise StatementError(f"{line[:40]!r} is not one of the candidate slots")

    def tracker(self, scenario: Scenario) -> CooperationTracker:
        return CooperationTracker(scenario)

    def instructions(self, scenario: Scenario, seat: int) -> str:
        return (
            "Share what you know and reason together. State your answer with a line `ANSWER: <slot>` "
            "(e.g. `ANSWER: "
            + scenario.param_strs("slots")[0]
            + "`); your last answer counts. The game ends when "
            "all answers agree."
        )

    def solution(self, scenario: Scenario) -> list[tuple[int, str]]:
        answer = answer_of(scenario)
        return [(s, f"ANSWER: {answer}") for s in range(scenario.num_players)]

    def heuristic(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        sc = tracker.scenario
        slots = sc.param_strs("slots")
        known = set(blocked_of(sc, seat))
        heard: set[int] = {seat}
        shared = False
        for s, msg in tracker.history:
            if s == seat and SHARE_PREFIX in msg.visible:
                shared = True
            if s != seat and SHARE_PREFIX in msg.visible:
                heard.add(s)
                tail = msg.visible.split(SHARE_PREFIX, 1)[1].split("\n", 1)[0]
                known.update(x for x in slots if x in tail)
        if not shared:
            mine = ", ".join(blocked_of(sc, seat)) or "nothing"
            return f"{SHARE_PREFIX} {mine}"
        free = [x for x in slots if x not in known]
        if len(heard) == sc.num_players and free:
            return f"Then it must be {free[0]}.\nANSWER: {free[0]}"
        return "Waiting for everyone to share their conflicts."

    def random_move(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        slots = tracker.scenario.param_strs("slots")
        if rng.random() < 0.5:
            return f"ANSWER: {rng.choice(slots)}"
        return rng.choice([PASS_TEXT, "What about Monday?", "我周一不行。"])


FAMILY = Cooperation()
