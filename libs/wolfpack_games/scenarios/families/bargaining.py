"""Bilateral bargaining over a price, grounded in BATNA/ZOPA (Fisher & Ury, *Getting to Yes*, 1981;
Raiffa, *The Art and Science of Negotiation*, 1982).

Seat 0 is the buyer, seat 1 the seller. Each has a private reservation price (the BATNA: the walk-away
point) and a more ambitious private target. The ZOPA ``[seller reservation, buyer reservation]`` is
never empty. Statements: ``FINAL_BID: <amount>`` (an offer; a later bid by either side replaces it),
``ACCEPT`` (closes a deal at the other side's standing bid) and ``REJECT`` (walks away from the other
side's standing bid and ends the negotiation without a deal).

Verdict: with a deal at price ``p`` the buyer wins if ``p <= target``, draws if ``p <= reservation``
and loses otherwise; the seller mirrors that. No deal (REJECT or the turn limit) gives both their
BATNA: a draw.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from wolfpack_games.scenarios.families.base import PASS_TEXT, Family, Tracker
from wolfpack_games.scenarios.models import Difficulty, PlayerInfo, Scenario, VerificationResult
from wolfpack_games.scenarios.parsing import ParsedMessage, StatementSpec, parse_amount

BUYER, SELLER = 0, 1
ITEMS = (
    ("a used car", 8000),
    ("a vintage guitar", 1500),
    ("a second-hand laptop", 900),
    ("a sofa", 600),
    ("a domain name", 3000),
    ("a batch of coffee beans", 400),
    ("a one-year office lease (monthly rent)", 2500),
    ("a freelance logo design", 700),
    ("a mountain bike", 1200),
    ("a wedding photography package", 2200),
)
BUYER_NAMES = ("Alice", "Chen Wei", "Maria", "Tom", "Aiko", "Omar")
SELLER_NAMES = ("Bob", "Li Na", "Jonas", "Grace", "Ravi", "Sofia")
# ZOPA width as a share of the list price, and how far each target sits into the ZOPA.
ZOPA_SHARE: dict[Difficulty, tuple[float, float]] = {
    "easy": (0.25, 0.40),
    "medium": (0.10, 0.20),
    "hard": (0.03, 0.08),
}
TARGET_DEPTH: dict[Difficulty, tuple[float, float]] = {
    "easy": (0.15, 0.35),  # targets overlap: a win-win price range exists
    "medium": (0.35, 0.50),  # targets meet near the middle
    "hard": (0.55, 0.80),  # targets cross: at most one side can win
}
MAX_TURNS: dict[Difficulty, int] = {"easy": 12, "medium": 12, "hard": 10}


class BargainingTracker(Tracker):
    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.standing: tuple[int, float] | None = None  # (bidder, price)
        self.deal: float | None = None
        self.bids: dict[int, list[float]] = {BUYER: [], SELLER: []}

    def check(self, seat: int, msg: ParsedMessage) -> str:
        if msg.keyword in ("ACCEPT", "REJECT"):
            if self.standing is None:
                return f"{msg.keyword} needs a standing FINAL_BID from the other side; there is none yet"
            if self.standing[0] == seat:
                return f"{msg.keyword} answers the other side's bid; the standing bid is your own"
        return ""

    def apply(self, seat: int, msg: ParsedMessage) -> list[str]:
        if msg.keyword == "FINAL_BID":
            price = float(msg.value)
            self.standing = (seat, price)
            self.bids[seat].append(price)
        elif msg.keyword == "ACCEPT" and self.standing is not None:
            self.deal = self.standing[1]
            self.ended = f"deal at {self.deal:g}"
            return [f"Deal: {self.scenario.name(seat)} accepted {self.deal:g}."]
        elif msg.keyword == "REJECT":
            self.ended = "rejected"
            return [f"{self.scenario.name(seat)} rejected and walked away: no deal."]
        return []

    def status(self) -> str:
        if self.standing is None:
            return "No bid on the table yet."
        return f"Standing bid: {self.standing[1]:g} by {self.scenario.name(self.standing[0])}."

    def verdict(self) -> VerificationResult:
        sc = self.scenario
        if self.deal is None:
            why = "walked away" if self.ended == "rejected" else "turn limit reached"
            return VerificationResult(
                outcomes={BUYER: 0, SELLER: 0},
                reason=f"no deal ({why}): both keep their BATNA, a draw",
                details={"deal": None, "turns": self.turns},
            )
        p = self.deal
        b_res, b_tgt = sc.private_int(BUYER, "reservation"), sc.private_int(BUYER, "target")
        s_res, s_tgt = sc.private_int(SELLER, "reservation"), sc.private_int(SELLER, "target")
        buyer = 1 if p <= b_tgt else 0 if p <= b_res else -1
        seller = 1 if p >= s_tgt else 0 if p >= s_res else -1
        return VerificationResult(
            outcomes={BUYER: buyer, SELLER: seller},
            reason=f"deal at {p:g}: buyer target {b_tgt}/reservation {b_res}, "
            f"seller target {s_tgt}/reservation {s_res}",
            details={"deal": p, "turns": self.turns},
        )


class Bargaining(Family):
    name = "bargaining"
    game_id = "bargaining_v1"
    title = "Bargaining (BATNA/ZOPA)"
    theory = "BATNA and ZOPA (Fisher & Ury 1981; Raiffa 1982)"
    specs = (StatementSpec.value("FINAL_BID"), StatementSpec.flag("ACCEPT"), StatementSpec.flag("REJECT"))
    seats: ClassVar[dict[str, int]] = {"easy": 2, "medium": 2, "hard": 2}

    def generate(self, rng: random.Random, difficulty: Difficulty) -> Scenario:
        item, base = rng.choice(ITEMS)
        list_price = max(50, round(base * rng.uniform(0.6, 1.6) / 10) * 10)
        width = max(4, round(list_price * rng.uniform(*ZOPA_SHARE[difficulty])))
        s_res = round(list_price * rng.uniform(0.55, 0.85))
        b_res = s_res + width
        s_tgt = s_res + max(1, round(width * rng.uniform(*TARGET_DEPTH[difficulty])))
        b_tgt = b_res - max(1, round(width * rng.uniform(*TARGET_DEPTH[difficulty])))
        cap = list_price * 3
        buyer, seller = rng.choice(BUYER_NAMES), rng.choice(SELLER_NAMES)
        first = rng.randrange(2)
        max_turns = MAX_TURNS[difficulty]
        public = (
            f"{buyer} (buyer) wants to buy {item} from {seller} (seller). The list price is {list_price}. "
            f"Prices are amounts between 1 and {cap}. {[buyer, seller][first]} speaks first; "
            f"the negotiation lasts at most {max_turns} messages."
        )
        players = [
            PlayerInfo(
                seat=BUYER,
                name=buyer,
                role="buyer",
                private={"reservation": b_res, "target": b_tgt},
                brief=(
                    f"Your BATNA: you can buy an equivalent elsewhere for {b_res}, so never pay more. "
                    f"You win if the price is at most {b_tgt}; a price up to {b_res} is a draw; "
                    f"no deal is a draw."
                ),
            ),
            PlayerInfo(
                seat=SELLER,
                name=seller,
                role="seller",
                private={"reservation": s_res, "target": s_tgt},
                brief=(
                    f"Your BATNA: another buyer will pay {s_res}, so never sell for less. "
                    f"You win if the price is at least {s_tgt}; a price down to {s_res} is a draw; "
                    f"no deal is a draw."
                ),
            ),
        ]
        return Scenario(
            family=self.name,
            difficulty=difficulty,
            template="bilateral-batna-zopa",
            tags=["bargaining", "negotiation", "zopa", "2p"],
            public=public,
            params={"list_price": list_price, "cap": cap, "first": first, "item": item},
            players=players,
            max_turns=max_turns,
        )

    def check(self, scenario: Scenario) -> None:
        if scenario.num_players != 2:
            raise ValueError("bargaining needs exactly 2 players")
        if [p.role for p in scenario.players] != ["buyer", "seller"]:
            raise ValueError("bargaining seats are buyer then seller")
        b_res, b_tgt = scenario.private_int(BUYER, "reservation"), scenario.private_int(BUYER, "target")
        s_res, s_tgt = scenario.private_int(SELLER, "reservation"), scenario.private_int(SELLER, "target")
        cap = scenario.param_int("cap")
        if not (1 <= s_res <= b_res <= cap):
            raise ValueError(
                "the ZOPA [seller reservation, buyer reservation] must be non-empty and in range"
            )
        if b_tgt > b_res or s_tgt < s_res:
            raise ValueError("targets must be at least as ambitious as reservations")

    def parse_value(self, scenario: Scenario, keyword: str, rest: str) -> Any:
        return parse_amount(rest, 1, scenario.param_int("cap"), what="bid")

    def tracker(self, scenario: Scenario) -> BargainingTracker:
        return BargainingTracker(scenario)

    def instructions(self, scenario: Scenario, seat: int) -> str:
        return (
            "Talk freely. To make an offer write a line `FINAL_BID: <amount>`; the latest bid of either side "
            "is the standing bid. Write `ACCEPT` to close the deal at the other side's standing bid, or "
            "`REJECT` to walk away from it (ends without a deal). One kind of statement per message; "
            "quoted statements do not count."
        )

    def solution(self, scenario: Scenario) -> list[tuple[int, str]]:
        b_tgt, s_tgt = scenario.private_int(BUYER, "target"), scenario.private_int(SELLER, "target")
        b_res, s_res = scenario.private_int(BUYER, "reservation"), scenario.private_int(SELLER, "reservation")
        price = (s_tgt + b_tgt) // 2 if s_tgt <= b_tgt else (s_res + b_res) // 2
        first = scenario.param_int("first")
        return [(first, f"FINAL_BID: {price}"), (1 - first, "ACCEPT")]

    def heuristic(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        assert isinstance(tracker, BargainingTracker)
        sc = tracker.scenario
        target, res = sc.private_int(seat, "target"), sc.private_int(seat, "reservation")
        sign = 1 if seat == BUYER else -1  # buyer wants low prices: "better" means sign*(limit - p) >= 0
        late = tracker.turns_left <= 3
        limit = res if late else target
        st = tracker.standing
        if st is not None and st[0] != seat and sign * (limit - st[1]) >= 0:
            return "That works for me.\nACCEPT"
        mine = tracker.bids[seat]
        theirs = tracker.bids[1 - seat]
        if not mine:
            bid = float(target - sign * max(1, abs(res - target)))  # anchor beyond my target
        else:
            # Split the difference between my last bid and theirs, but never past my current limit.
            guess = theirs[-1] if theirs else limit
            bid = (mine[-1] + guess) / 2
        bid = min(bid, limit) if seat == BUYER else max(bid, limit)
        price = max(1, min(sc.param_int("cap"), round(bid)))
        return f"Here is my offer.\nFINAL_BID: {price}"

    def random_move(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        assert isinstance(tracker, BargainingTracker)
        options = ["say", "bid"]
        if tracker.standing is not None and tracker.standing[0] != seat:
            options += ["accept", "reject"]
        pick = rng.choice(options)
        if pick == "say":
            return rng.choice(["Let's talk.", "Hmm, I need to think.", PASS_TEXT, "我们再谈谈吧。"])
        if pick == "accept":
            return "ACCEPT"
        if pick == "reject":
            return "REJECT"
        return f"FINAL_BID: {rng.randint(1, tracker.scenario.param_int('cap'))}"


FAMILY = Bargaining()
