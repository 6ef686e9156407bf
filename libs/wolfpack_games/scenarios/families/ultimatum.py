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

Variant ``outside`` (the responder has an outside option; the training demo's task). In the difficulty
variants accepting is weakly dominant — rejecting loses for both — and the heuristic proposer never
offers below an ``easy`` threshold, so the one-word policy "always ACCEPT" wins every game and a learner
learns nothing about the game. Here the responder's threshold is an *outside option* it takes by
rejecting: ACCEPT gets the offer, REJECT gets the outside option (the proposer gets nothing either way
it is rejected). The responder wins if it takes the larger of the two (both, on a tie) and loses if it
takes the smaller; no decision by the turn limit loses for both. The proposer wins an accepted offer
that leaves it its target, draws an accepted one that does not, and loses a rejection. The outside
option is public (the status line shows it beside the offer: "Offer: 5; outside option: 6."), as in
bargaining with outside options (Binmore, Shaked & Sutton 1989). The numbers are small (pot 10, outside
option 4..6) and the proposer's target leaves an offer 1-2 below or above the outside option, each side
with probability 1/2, so the heuristic proposer's single offer (exactly ``pot - target`` here, no
half-pot cap) falls on either side of it: every constant answer wins about half the games, a policy
that reads only the offer at most 11 of 12 (an offer of 5 is above an option of 4 and below one of 6),
and only reading the offer *and* the option wins them all (the heuristic responder: ACCEPT iff offer >=
outside option). Names are fixed and texts short, so the prompts of a tiny CPU model differ in the two
numbers only. The generated scenario is labelled ``medium`` (the difficulty levels stay the three of
every family) and carries ``params["rule"] = "outside"`` and ``params["outside"]`` (equal to the
responder's private ``threshold``), which the verdict, the status line and the bots read.
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
OUTSIDE = "outside"
"""The outside-option variant's name (registry variant) and its ``params["rule"]`` value."""
OUTSIDE_POT = 10
OUTSIDE_OPTION = (4, 6)
"""Range of the responder's outside option in the ``outside`` variant (inclusive)."""
OUTSIDE_GAP = (1, 2)
"""How far below or above the outside option the proposer's planned offer lies (inclusive)."""


def outside_rule(scenario: Scenario) -> bool:
    """True for a scenario of the ``outside`` variant (the responder may take its outside option)."""
    return scenario.params.get("rule") == OUTSIDE


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
        if self.offer is None:
            return "No offer yet."
        if outside_rule(self.scenario):  # public in this variant: both numbers side by side
            return f"Offer: {self.offer}; outside option: {self.scenario.param_int(OUTSIDE)}."
        return f"Offer on the table: {self.offer} for the responder."

    def verdict(self) -> VerificationResult:
        sc = self.scenario
        pot = sc.param_int("pot")
        if outside_rule(sc):
            return self._outside_verdict(pot)
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

    def _outside_verdict(self, pot: int) -> VerificationResult:
        """The ``outside`` variant: the responder wins by taking the larger of offer and outside option."""
        sc = self.scenario
        outside = sc.private_int(RESPONDER, "threshold")
        if self.accepted is None or self.offer is None:
            return VerificationResult(
                outcomes={PROPOSER: -1, RESPONDER: -1},
                reason=f"no decision before the turn limit: the pot of {pot} is lost, both lose",
                details={"offer": self.offer, "accepted": False},
            )
        if self.accepted:
            share = pot - self.offer
            p = 1 if share >= sc.private_int(PROPOSER, "target") else 0
            r = 1 if self.offer >= outside else -1
            reason = (
                f"accepted: proposer keeps {share}, responder gets {self.offer} (outside option {outside})"
            )
        else:
            p, r = -1, 1 if outside >= self.offer else -1
            reason = f"rejected: responder takes its outside option {outside} over the offer of {self.offer}"
        return VerificationResult(
            outcomes={PROPOSER: p, RESPONDER: r},
            reason=reason,
            details={"offer": self.offer, "accepted": self.accepted, "outside": outside},
        )


class Ultimatum(Family):
    name = "ultimatum"
    game_id = "ultimatum_v1"
    title = "Ultimatum game"
    theory = "the ultimatum game (Güth, Schmittberger & Schwarze 1982)"
    specs = (StatementSpec.value("OFFER"), StatementSpec.flag("ACCEPT"), StatementSpec.flag("REJECT"))
    seats: ClassVar[dict[str, int]] = {"easy": 2, "medium": 2, "hard": 2, OUTSIDE: 2}

    def generate(self, rng: random.Random, difficulty: Difficulty) -> Scenario:
        if str(difficulty) == OUTSIDE:
            return self._generate_outside(rng)
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

    def _generate_outside(self, rng: random.Random) -> Scenario:
        pot = OUTSIDE_POT
        outside = rng.randint(*OUTSIDE_OPTION)
        gap = rng.randint(*OUTSIDE_GAP)
        offer = outside - gap if rng.random() < 0.5 else outside + gap
        a, b = NAMES[0], NAMES[1]  # fixed names: the prompts differ in the two numbers only
        # Short texts: the demo's tiny model reads every token of them on every turn.
        public = f"{a} offers {b} part of {pot}; {b} may take an outside option of {outside} instead."
        return Scenario(
            family=self.name,
            difficulty="medium",
            template="ultimatum-outside-option",
            tags=["ultimatum", "outside-option", "2p"],
            public=public,
            params={"pot": pot, "first": 0, "rule": OUTSIDE, OUTSIDE: outside},
            players=[
                PlayerInfo(
                    seat=PROPOSER,
                    name=a,
                    role="proposer",
                    private={"target": pot - offer},
                    brief=f"Keep at least {pot - offer} to win; a rejection loses.",
                ),
                PlayerInfo(
                    seat=RESPONDER,
                    name=b,
                    role="responder",
                    private={"threshold": outside},
                    brief="Take the larger of the offer and the outside option to win.",
                ),
            ],
            max_turns=4,
        )

    def check(self, scenario: Scenario) -> None:
        rule = scenario.params.get("rule", "")
        if rule not in ("", OUTSIDE):
            raise ValueError(f"unknown ultimatum rule {rule!r}; rules: {OUTSIDE!r} (or none)")
        if rule == OUTSIDE and scenario.param_int(OUTSIDE) != scenario.private_int(RESPONDER, "threshold"):
            raise ValueError("the public outside option must be the responder's threshold")
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
        if outside_rule(scenario):
            if seat == PROPOSER:
                return "Make one offer: `OFFER: <amount for the responder>`."
            return "`ACCEPT` the offer or `REJECT` it for the outside option."
        if seat == PROPOSER:
            return "Talk freely. Make your single offer with a line `OFFER: <amount for the responder>`."
        return "Talk freely. Once an offer is made, answer with `ACCEPT` or `REJECT` (this ends the game)."

    def solution(self, scenario: Scenario) -> list[tuple[int, str]]:
        offer = scenario.param_int("pot") - scenario.private_int(PROPOSER, "target")
        if outside_rule(scenario):  # at least the outside option: the responder wins, the proposer draws
            offer = max(offer, scenario.private_int(RESPONDER, "threshold"))
        return [(PROPOSER, f"OFFER: {offer}"), (RESPONDER, "ACCEPT")]

    def heuristic(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        assert isinstance(tracker, UltimatumTracker)
        sc = tracker.scenario
        pot = sc.param_int("pot")
        if seat == PROPOSER:
            if tracker.offer is not None:
                return "That is my final offer."
            if outside_rule(sc):  # exactly what leaves it its target: on either side of the outside option
                return f"OFFER: {pot - sc.private_int(PROPOSER, 'target')}"
            offer = min(pot - sc.private_int(PROPOSER, "target"), pot // 2)
            return f"A fair split, I think.\nOFFER: {max(offer, 1 if pot > 1 else 0)}"
        if tracker.offer is None:
            return "I am waiting for your offer."
        if outside_rule(sc):  # take the larger of the offer and the outside option
            return "ACCEPT" if tracker.offer >= sc.private_int(RESPONDER, "threshold") else "REJECT"
        # Rational responder: any positive offer beats losing the pot.
        return "ACCEPT" if tracker.offer > 0 else "REJECT"

    def random_move(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        assert isinstance(tracker, UltimatumTracker)
        if seat == PROPOSER and tracker.offer is None and rng.random() < 0.6:
            return f"OFFER: {rng.randint(0, tracker.scenario.param_int('pot'))}"
        if seat == RESPONDER and tracker.offer is not None and outside_rule(tracker.scenario):
            return rng.choice(("ACCEPT", "REJECT"))  # a random decision, never chat: the demo's initial clone
        if seat == RESPONDER and tracker.offer is not None and rng.random() < 0.6:
            return rng.choice(("ACCEPT", "REJECT"))
        return rng.choice((PASS_TEXT, "Be reasonable.", "你先说吧。"))


FAMILY = Ultimatum()
