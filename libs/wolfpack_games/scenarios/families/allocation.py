"""Multi-issue resource allocation with private valuations, grounded in integrative bargaining and
fair division (Raiffa 1982; Brams & Taylor, *Fair Division*, 1996).

Each player privately values indivisible items (values sum to 100). A player proposes a complete
``ALLOCATION: {item: name, ...}``; it becomes the standing proposal (the proposer counts as
confirming). Every other player must ``ACCEPT`` the standing proposal for it to bind; ``REJECT``
withdraws it; a new proposal replaces it and clears confirmations. Difficulty knobs: number of items,
conflict of valuations (how correlated the players' values are), and threshold tightness.

Verdict: with an agreement each player wins if its utility reaches its private target, draws if it
reaches its private reservation (BATNA), and loses otherwise. Without agreement (turn limit) everyone
keeps their BATNA: a draw.
"""

from __future__ import annotations

import itertools
import random
from typing import Any, ClassVar

from wolfpack_games.scenarios.families.base import PASS_TEXT, Family, Tracker, threshold_outcome
from wolfpack_games.scenarios.models import (
    Difficulty,
    PlayerInfo,
    Scenario,
    VerificationResult,
    as_int_map,
)
from wolfpack_games.scenarios.parsing import (
    ParsedMessage,
    StatementError,
    StatementSpec,
    parse_mapping,
)

ITEMS = (
    "laptop",
    "desk",
    "lamp",
    "bookshelf",
    "plant",
    "printer",
    "chair",
    "monitor",
    "rug",
    "kettle",
    "whiteboard",
    "projector",
)
NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana")
ITEM_COUNT: dict[Difficulty, tuple[int, int]] = {"easy": (3, 4), "medium": (4, 5), "hard": (5, 7)}
CONFLICT: dict[Difficulty, float] = {"easy": 0.1, "medium": 0.5, "hard": 0.85}
RESERVATION: dict[Difficulty, tuple[float, float]] = {
    "easy": (0.4, 0.6),
    "medium": (0.6, 0.8),
    "hard": (0.8, 0.95),
}
TARGET: dict[Difficulty, tuple[float, float]] = {
    "easy": (0.8, 0.95),
    "medium": (0.95, 1.05),
    "hard": (1.05, 1.2),
}


def _to_hundred(weights: list[float]) -> list[int]:
    """Integers summing to 100 proportional to ``weights`` (largest remainder)."""
    total = sum(weights)
    raw = [100 * w / total for w in weights]
    out = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: (out[i] - raw[i], i))[: 100 - sum(out)]:
        out[i] += 1
    return out


def values_of(scenario: Scenario, seat: int) -> dict[str, int]:
    return as_int_map(scenario.private_value(seat, "values"), "values")


def maximin_allocation(scenario: Scenario) -> dict[str, int]:
    """Brute force: the allocation maximising the lowest utility relative to reservations (ties: lexicographic)."""
    items = scenario.param_strs("items")
    seats = range(scenario.num_players)
    vals = [values_of(scenario, s) for s in seats]
    res = [scenario.private_int(s, "reservation") for s in seats]
    best: tuple[float, tuple[int, ...]] | None = None
    for owners in itertools.product(seats, repeat=len(items)):
        util = [0] * scenario.num_players
        for item, owner in zip(items, owners, strict=True):
            util[owner] += vals[owner][item]
        score = min(u - r for u, r in zip(util, res, strict=True))
        if best is None or score > best[0]:
            best = (score, owners)
    assert best is not None
    return dict(zip(items, best[1], strict=True))


def _maximin_utilities(vals: list[dict[str, int]], items: list[str]) -> list[int]:
    n = len(vals)
    best: tuple[int, list[int]] | None = None
    for owners in itertools.product(range(n), repeat=len(items)):
        util = [0] * n
        for item, owner in zip(items, owners, strict=True):
            util[owner] += vals[owner][item]
        if best is None or min(util) > best[0]:
            best = (min(util), util)
    assert best is not None
    return best[1]


def format_allocation(scenario: Scenario, owners: dict[str, int]) -> str:
    body = ", ".join(f"{item}: {scenario.name(seat)}" for item, seat in owners.items())
    return "ALLOCATION: {" + body + "}"


class AllocationTracker(Tracker):
    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.standing: dict[str, int] | None = None
        self.proposer = -1
        self.confirmed: set[int] = set()
        self.agreement: dict[str, int] | None = None

    def utility(self, seat: int, owners: dict[str, int]) -> int:
        vals = values_of(self.scenario, seat)
        return sum(vals[item] for item, owner in owners.items() if owner == seat)

    def check(self, seat: int, msg: ParsedMessage) -> str:
        if msg.keyword in ("ACCEPT", "REJECT"):
            if self.standing is None:
                return f"{msg.keyword} needs a standing ALLOCATION proposal; there is none"
            if seat == self.proposer:
                return f"{msg.keyword}: you proposed the standing allocation yourself"
        return ""

    def apply(self, seat: int, msg: ParsedMessage) -> list[str]:
        name = self.scenario.name(seat)
        if msg.keyword == "ALLOCATION":
            self.standing = dict(msg.value)
            self.proposer = seat
            self.confirmed = {seat}
        elif msg.keyword == "REJECT":
            self.standing, self.proposer, self.confirmed = None, -1, set()
            return [f"{name} rejected the proposal; no proposal is standing."]
        elif msg.keyword == "ACCEPT" and self.standing is not None:
            self.confirmed.add(seat)
            if len(self.confirmed) == self.n:
                self.agreement = self.standing
                self.ended = "agreement"
                return ["Everyone confirmed: the allocation is agreed."]
        return []

    def status(self) -> str:
        if self.standing is None:
            return "No allocation proposal is standing."
        waiting = [self.scenario.name(s) for s in range(self.n) if s not in self.confirmed]
        return (
            f"Standing proposal by {self.scenario.name(self.proposer)}: {format_allocation(self.scenario, self.standing)}"
            f"; waiting for ACCEPT from {', '.join(waiting)}."
        )

    def verdict(self) -> VerificationResult:
        sc = self.scenario
        if self.agreement is None:
            return VerificationResult(
                outcomes={s: 0 for s in range(self.n)},
                reason="no agreed allocation before the turn limit: everyone keeps their BATNA, a draw",
                details={"allocation": None, "turns": self.turns},
            )
        utils = {s: self.utility(s, self.agreement) for s in range(self.n)}
        outcomes = {
            s: threshold_outcome(utils[s], sc.private_int(s, "target"), sc.private_int(s, "reservation"))
            for s in range(self.n)
        }
        return VerificationResult(
            outcomes=outcomes,
            reason="agreed allocation; utilities "
            + ", ".join(f"{sc.name(s)} {utils[s]}" for s in range(self.n)),
            details={"allocation": {k: sc.name(v) for k, v in self.agreement.items()}, "utilities": utils},
        )


class Allocation(Family):
    name = "allocation"
    game_id = "allocation_v1"
    title = "Resource allocation (fair division)"
    theory = "integrative bargaining and fair division (Raiffa 1982; Brams & Taylor 1996)"
    specs = (StatementSpec.value("ALLOCATION"), StatementSpec.flag("ACCEPT"), StatementSpec.flag("REJECT"))
    seats: ClassVar[dict[str, int]] = {"easy": 2, "medium": 3, "hard": 3}

    def generate(self, rng: random.Random, difficulty: Difficulty) -> Scenario:
        n = self.seats[difficulty]
        items = sorted(rng.sample(ITEMS, rng.randint(*ITEM_COUNT[difficulty])))
        names = rng.sample(NAMES, n)
        base = [rng.random() + 0.05 for _ in items]
        c = CONFLICT[difficulty]
        vals = []
        for _ in range(n):
            own = [rng.random() + 0.05 for _ in items]
            vals.append(
                dict(
                    zip(
                        items,
                        _to_hundred([c * b + (1 - c) * o for b, o in zip(base, own, strict=True)]),
                        strict=True,
                    )
                )
            )
        best = _maximin_utilities(vals, items)
        players = []
        for s in range(n):
            res = max(1, round(best[s] * rng.uniform(*RESERVATION[difficulty])))
            res = min(res, best[s])
            target = min(100, max(res + 1, round(best[s] * rng.uniform(*TARGET[difficulty]))))
            listing = ", ".join(f"{item} {v}" for item, v in vals[s].items())
            players.append(
                PlayerInfo(
                    seat=s,
                    name=names[s],
                    role=f"partner {s + 1}",
                    private={"values": vals[s], "reservation": res, "target": target},
                    brief=(
                        f"Your values (they sum to 100): {listing}. You win with a total of at least {target}; "
                        f"at least {res} is a draw (your BATNA); less is a loss. No agreement is a draw."
                    ),
                )
            )
        max_turns = 4 * n + 2
        public = (
            f"{', '.join(names)} are dissolving a shared office and must divide these items: {', '.join(items)}. "
            f"Every item goes to exactly one person. Each person values the items differently and privately. "
            f"{names[0]} speaks first; at most {max_turns} messages."
        )
        return Scenario(
            family=self.name,
            difficulty=difficulty,
            template="multi-issue-fair-division",
            tags=["allocation", "negotiation", "integrative", f"{n}p", f"items-{len(items)}"],
            public=public,
            params={"items": items, "first": 0},
            players=players,
            max_turns=max_turns,
        )

    def check(self, scenario: Scenario) -> None:
        items = scenario.param_strs("items")
        if len(set(items)) != len(items) or not items:
            raise ValueError("items must be distinct and non-empty")
        for s in range(scenario.num_players):
            vals = values_of(scenario, s)
            if set(vals) != set(items) or any(v < 0 for v in vals.values()):
                raise ValueError(f"seat {s} must value every item with a non-negative int")
            if not 0 <= scenario.private_int(s, "reservation") <= scenario.private_int(s, "target"):
                raise ValueError("0 <= reservation <= target")

    def parse_value(self, scenario: Scenario, keyword: str, rest: str) -> Any:
        items = {i.lower(): i for i in scenario.param_strs("items")}
        owners: dict[str, int] = {}
        for key, value in parse_mapping(rest):
            item = items.get(key.lower())
            if item is None:
                raise StatementError(f"unknown item {key!r}")
            seat = scenario.seat_of(value)
            if seat is None:
                raise StatementError(f"unknown player {value!r} for {item}")
            if item in owners and owners[item] != seat:
                raise StatementError(f"contradictory allocation: {item} given to two players")
            owners[item] = seat
        missing = [i for i in scenario.param_strs("items") if i not in owners]
        if missing:
            raise StatementError(f"incomplete allocation: missing {', '.join(missing)}")
        return {i: owners[i] for i in scenario.param_strs("items")}

    def tracker(self, scenario: Scenario) -> AllocationTracker:
        return AllocationTracker(scenario)

    def instructions(self, scenario: Scenario, seat: int) -> str:
        return (
            "Talk freely. Propose with a line `ALLOCATION: {item: name, ...}` naming an owner for every item. "
            "Write `ACCEPT` to confirm the standing proposal or `REJECT` to withdraw it. The allocation binds "
            "once everyone has confirmed it (the proposer counts as confirming). One kind of statement per message."
        )

    def solution(self, scenario: Scenario) -> list[tuple[int, str]]:
        owners = maximin_allocation(scenario)
        return [(0, format_allocation(scenario, owners))] + [
            (s, "ACCEPT") for s in range(1, scenario.num_players)
        ]

    def heuristic(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        assert isinstance(tracker, AllocationTracker)
        sc = tracker.scenario
        vals = values_of(sc, seat)
        target, res = sc.private_int(seat, "target"), sc.private_int(seat, "reservation")
        progress = tracker.turns / sc.max_turns
        demand = round(target - (target - res) * min(1.0, 1.5 * progress))
        standing = tracker.standing
        if (
            standing is not None
            and seat not in tracker.confirmed
            and tracker.utility(seat, standing) >= demand
        ):
            return "I can live with that.\nACCEPT"
        if tracker.standing is not None and seat in tracker.confirmed:
            return "Please confirm the proposal on the table."
        # Take my most valued items until my demand is met; spread the rest over the others.
        owners: dict[str, int] = {}
        got = 0
        others = [s for s in range(sc.num_players) if s != seat]
        k = 0
        for item in sorted(vals, key=lambda i: (-vals[i], i)):
            if got < demand:
                owners[item] = seat
                got += vals[item]
            else:
                owners[item] = others[k % len(others)]
                k += 1
        ordered = {i: owners[i] for i in sc.param_strs("items")}
        return "How about this?\n" + format_allocation(sc, ordered)

    def random_move(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        assert isinstance(tracker, AllocationTracker)
        sc = tracker.scenario
        options = ["say", "propose"]
        if tracker.standing is not None and seat != tracker.proposer:
            options += ["accept", "reject"]
        pick = rng.choice(options)
        if pick == "say":
            return rng.choice(["I really want the lamp.", PASS_TEXT, "Let's be fair.", "我们公平分配吧。"])
        if pick == "accept":
            return "ACCEPT"
        if pick == "reject":
            return "REJECT"
        owners = {i: rng.randrange(sc.num_players) for i in sc.param_strs("items")}
        return format_allocation(sc, owners)


FAMILY = Allocation()
