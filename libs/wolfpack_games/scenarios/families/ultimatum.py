"""The ultimatum game (Güth, Schmittberger & Schwarze 1982).

Seat 0 (proposer) splits a public pot; seat 1 (responder) either takes the offer or both get nothing.
The players may talk first. The proposer makes exactly one ``OFFER: <amount for the responder>``
(whole number, 0..pot); a second offer is a violation. The responder answers with ``ACCEPT`` or
``REJECT``, which ends the game. Private info: the proposer's target share, and the responder's
fairness threshold (the smallest offer it counts as a win). Difficulty knob: the slack
``pot - proposer target - responder threshold`` (positive: a win-win split exists; negative: the
targets conflict).

Verdict: accepted — the proposer wins if its share reaches its target, else draws; the responder wins if
the offer reaches its threshold, else draws. Rejected, or no decision by the turn limit — both lose
(the pot is gone).
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from wolfpack_games.scenarios.families.base import PASS_TEXT, Family, Tracker
from wolfpack_games.scenarios.models import Difficulty, PlayerInfo, Scenario, VerificationResult
from wolfpack_games.scenarios.parsing import ParsedMessage, StatementSpec, parse_amount

PROPOSER, RESPONDER = 0, 1
NAMES = ("Quinn", "Rosa", "Sam", "Tara", "Uma", "Victor", "Wen", "Xia")
SLACK: dict[Difficulty, tuple[float, float]] = {
    "easy": (0.15, 0.3),
    "medium": (0.0, 0.1),
    "hard": (-0.2, -0.05),
}


class UltimatumTracker(Tracker):
    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.offer: int | None = None
        self.accepted: bool | None = None

    def check(self, seat: int, msg: ParsedMessage) -> str:
        if msg.keyword == "OFFER":
            if seat != PROPOSER:
                return "only the proposer makes an OFFER"
            if self.offer is not None:
                return "the proposer has already made its one OFFER"
        if msg.keyword in ("ACCEPT", "REJECT"):
            if seat != RESPONDER:
                return f"only the responder may {msg.keyword}"
            if self.offer is None:
                return f"{msg.keyword} needs an OFFER first"
        return ""

    def apply(self, seat: int, msg: ParsedMessage) -> list[str]:
        if msg.keyword == "OFFER":
            self.offer = int(msg.value)
        elif msg.keyword in ("ACCEPT", "REJECT"):
            self.accepted = msg.keyword == "ACCEPT"
            self.ended = msg.keyword.lower()
            return [f"The responder {'accepted' if self.accepted else 'rejected'} the offer of {self.offer}."]
        return []

    def status(self) -> str:
        return (
            "No offer yet." if self.offer is None else f"Offer on the table: {self.offer} for the responder."
        )

    def verdict(self) -> VerificationResult:
        sc = self.scenario
        pot = sc.param_int("pot")
        if not self.accepted or self.offer is None:
            why = "rejected" if self.accepted is False else "no decision before the turn limit"
            return VerificationResult(
                outcomes={PROPOSER: -1, RESPONDER: -1},
                reason=f"{why}: the pot of {pot} is lost, both lose",
                details={"offer": self.offer, "accepted": False},
            )
        share = pot - self.offer
        p = 1 if share >= sc.private_int(PROPOSER, "target") else 0
        r = 1 if self.offer >= sc.private_int(RESPONDER, "threshold") else 0
        return VerificationResult(
            outcomes={PROPOSER: p, RESPONDER: r},
            reason=f"accepted: proposer keeps {share}, responder gets {self.offer}",
            details={"offer": self.offer, "accepted": True},
        )


class Ultimatum(Family):
    name = "ultimatum"
    game_id = "ultimatum_v1"
    title = "Ultimatum game"
    theory = "the ultimatum game (Güth, Schmittberger & Schwarze 1982)"
    specs = (StatementSpec.value("OFFER"), StatementSpec.flag("ACCEPT"), StatementSpec.flag("REJECT"))
    seats: ClassVar[dict[str, int]] = {"easy": 2, "medium": 2, "hard": 2}

    def generate(self, rng: random.Random, difficulty: Difficulty) -> Scenario:
        pot = rng.choice((10, 20, 50, 100, 200, 500, 1000)) * rng.randint(1, 3)
        slack = round(pot * rng.uniform(*SLACK[difficulty]))
        threshold = max(1, round(pot * rng.uniform(0.2, 0.45)))
        target = max(1, min(pot, pot - threshold - slack))
        a, b = rng.sample(NAMES, 2)
        max_turns = rng.choice((4, 6))
        public = (
            f"{a} (proposer) and {b} (responder) split a pot of {pot}. {a} may make one offer; if {b} rejects, "
            f"both get nothing. {a} speaks first; at most {max_turns} messages."
        )
        return Scenario(
            family=self.name,
            difficulty=difficulty,
            template="ultimatum",
            tags=["ultimatum", "classic", "fairness", "2p"],
            public=public,
            params={"pot": pot, "first": 0},
            players=[
                PlayerInfo(
                    seat=PROPOSER,
                    name=a,
                    role="proposer",
                    private={"target": target},
                    brief=f"You win if you keep at least {target} of {pot}; less is a draw; a rejection loses.",
                ),
                PlayerInfo(
                    seat=RESPONDER,
                    name=b,
                    role="responder",
                    private={"threshold": threshold},
                    brief=f"You win if you are offered at least {threshold}; accepting less is a draw; "
                    "rejecting loses for both.",
                ),
            ],
            max_turns=max_turns,
        )

    def check(self, scenario: Scenario) -> None:
        pot = scenario.param_int("pot")
        if pot < 1 or not 0 <= scenario.private_int(PROPOSER, "target") <= pot:
            raise ValueError("0 <= proposer target <= pot")
        if not 0 <= scenario.private_int(RESPONDER, "threshold") <= pot:
            raise ValueError("0 <= responder threshold <= pot")

    def parse_value(self, scenario: Scenario, keyword: str, rest: str) -> Any:
        return int(parse_amount(rest, 0, scenario.param_int("pot"), integer=True, what="offer"))

    def tracker(self, scenario: Scenario) -> UltimatumTracker:
        return UltimatumTracker(scenario)

    def instructions(self, scenario: Scenario, seat: int) -> str:
        if seat == PROPOSER:
            return "Talk freely. Make your single offer with a line `OFFER: <amount for the responder>`."
        return "Talk freely. Once an offer is made, answer with `ACCEPT` or `REJECT` (this ends the game)."

    def solution(self, scenario: Scenario) -> list[tuple[int, str]]:
        return [
            (PROPOSER, f"OFFER: {scenario.param_int('pot') - scenario.private_int(PROPOSER, 'target')}"),
            (RESPONDER, "ACCEPT"),
        ]

    def heuristic(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        assert isinstance(tracker, UltimatumTracker)
        sc = tracker.scenario
        pot = sc.param_int("pot")
        if seat == PROPOSER:
            if tracker.offer is not None:
                return "That is my final offer."
            offer = min(pot - sc.private_int(PROPOSER, "target"), pot // 2)
            return f"A fair split, I think.\nOFFER: {max(offer, 1 if pot > 1 else 0)}"
        if tracker.offer is None:
            return "I am waiting for your offer."
        # Rational responder: any positive offer beats losing the pot.
        return "ACCEPT" if tracker.offer > 0 else "REJECT"

    def random_move(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        assert isinstance(tracker, UltimatumTracker)
        if seat == PROPOSER and tracker.offer is None and rng.random() < 0.6:
            return f"OFFER: {rng.randint(0, tracker.scenario.param_int('pot'))}"
        if seat == RESPONDER and tracker.offer is not None and rng.random() < 0.6:
            return rng.choice(("ACCEPT", "REJECT"))
        return rng.choice((PASS_TEXT, "Be reasonable.", "你先说吧。"))


FAMILY = Ultimatum()
