"""Coalition formation in a characteristic-function game (von Neumann & Morgenstern 1944; Shapley 1953;
Gamson 1961).

A public table says how much every coalition can earn (``v(S)``; a player alone earns ``v({i})``).
A player proposes ``COALITION: {name: share, ...}`` — the members (the proposer must be one) and integer
shares summing exactly to the coalition's value. Every other member must ``ACCEPT``; a member's
``REJECT`` withdraws the proposal; a new proposal replaces it. Once all members accepted, the coalition
forms and the game ends; players outside it earn their solo value. Private info: each player's target.
Difficulty knobs: how superadditive the game is and how far targets sit above the Shapley value.

Verdict: a player wins at its target, draws at or above its solo value (its BATNA), else loses. No
coalition by the turn limit: everyone earns its solo value (a draw).
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
    number_of,
    parse_mapping,
)

NAMES = ("Ada", "Bram", "Cleo", "Dev", "Esme", "Femi", "Goro", "Hild")
TARGET: dict[Difficulty, tuple[float, float]] = {
    "easy": (0.7, 0.9),
    "medium": (0.95, 1.05),
    "hard": (1.1, 1.3),
}


def key_of(scenario: Scenario, members: frozenset[int] | set[int]) -> str:
    return "+".join(scenario.name(s) for s in sorted(members))


def value(scenario: Scenario, members: frozenset[int] | set[int]) -> int:
    return as_int_map(scenario.params["values"], "values")[key_of(scenario, members)]


def shapley(scenario: Scenario) -> list[float]:
    n = scenario.num_players
    phi = [0.0] * n
    perms = list(itertools.permutations(range(n)))
    for order in perms:
        before: set[int] = set()
        prev = 0
        for s in order:
            before.add(s)
            cur = value(scenario, before)
            phi[s] += cur - prev
            prev = cur
    return [x / len(perms) for x in phi]


def grand_split(scenario: Scenario) -> dict[int, int]:
    """Grand-coalition shares near the Shapley value that never fall below a solo value (an imputation).

    Each player gets its solo value plus a slice of the surplus weighted by how far its Shapley value
    exceeds its solo value; integer slices by largest remainder.
    """
    n = scenario.num_players
    solo = [value(scenario, {s}) for s in range(n)]
    surplus = value(scenario, set(range(n))) - sum(solo)
    phi = shapley(scenario)
    weights = [max(phi[s] - solo[s], 0.0) + 1e-6 for s in range(n)]
    raw = [surplus * w / sum(weights) for w in weights]
    extra = [int(x) for x in raw]
    for i in sorted(range(n), key=lambda i: (extra[i] - raw[i], i))[: surplus - sum(extra)]:
        extra[i] += 1
    return {s: solo[s] + extra[s] for s in range(n)}


def format_coalition(scenario: Scenario, shares: dict[int, int]) -> str:
    return "COALITION: {" + ", ".join(f"{scenario.name(s)}: {v}" for s, v in sorted(shares.items())) + "}"


class CoalitionTracker(Tracker):
    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.standing: dict[int, int] | None = None
        self.proposer = -1
        self.accepted: set[int] = set()
        self.formed: dict[int, int] | None = None

    def check(self, seat: int, msg: ParsedMessage) -> str:
        if msg.keyword == "COALITION" and seat not in msg.value:
            return "the proposer must be a member of the proposed coalition"
        if msg.keyword in ("ACCEPT", "REJECT"):
            if self.standing is None:
                return f"{msg.keyword} needs a standing COALITION proposal"
            if seat not in self.standing:
                return f"{msg.keyword}: you are not a member of the proposed coalition"
            if seat == self.proposer:
                return f"{msg.keyword}: you proposed it yourself"
        return ""

    def apply(self, seat: int, msg: ParsedMessage) -> list[str]:
        if msg.keyword == "COALITION":
            self.standing, self.proposer, self.accepted = dict(msg.value), seat, {seat}
            if len(self.standing) == 1:
                self.formed = self.standing
                self.ended = "formed"
                return [f"{self.scenario.name(seat)} goes alone."]
        elif msg.keyword == "REJECT":
            self.standing, self.proposer, self.accepted = None, -1, set()
            return [f"{self.scenario.name(seat)} rejected; no proposal is standing."]
        elif msg.keyword == "ACCEPT" and self.standing is not None:
            self.accepted.add(seat)
            if self.accepted >= set(self.standing):
                self.formed = self.standing
                self.ended = "formed"
                return [f"Coalition formed: {format_coalition(self.scenario, self.formed)}."]
        return []

    def status(self) -> str:
        if self.standing is None:
            return "No coalition proposal is standing."
        waiting = [self.scenario.name(s) for s in sorted(set(self.standing) - self.accepted)]
        return (
            f"Standing: {format_coalition(self.scenario, self.standing)}; waiting for {', '.join(waiting)}."
        )

    def verdict(self) -> VerificationResult:
        sc = self.scenario
        pay = {s: value(sc, {s}) for s in range(self.n)}
        if self.formed is not None:
            pay.update(self.formed)
        outcomes = {
            s: threshold_outcome(pay[s], sc.private_int(s, "target"), value(sc, {s})) for s in range(self.n)
        }
        what = format_coalition(sc, self.formed) if self.formed else "no coalition formed (turn limit)"
        return VerificationResult(
            outcomes=outcomes,
            reason=f"{what}; payoffs " + ", ".join(f"{sc.name(s)} {pay[s]}" for s in range(self.n)),
            details={"coalition": {sc.name(s): v for s, v in (self.formed or {}).items()}, "payoffs": pay},
        )


class Coalition(Family):
    name = "coalition"
    game_id = "coalition_v1"
    title = "Coalition formation"
    theory = (
        "characteristic-function games and the Shapley value (von Neumann & Morgenstern 1944; Shapley 1953)"
    )
    specs = (StatementSpec.value("COALITION"), StatementSpec.flag("ACCEPT"), StatementSpec.flag("REJECT"))
    seats: ClassVar[dict[str, int]] = {"easy": 3, "medium": 3, "hard": 4}

    def generate(self, rng: random.Random, difficulty: Difficulty) -> Scenario:
        n = self.seats[difficulty]
        names = sorted(rng.sample(NAMES, n), key=NAMES.index)
        solo = [rng.randint(0, 10) for _ in range(n)]
        values: dict[str, int] = {}
        for size in range(1, n + 1):
            for members in itertools.combinations(range(n), size):
                key = "+".join(names[s] for s in members)
                base = sum(solo[s] for s in members)
                if size == 1:
                    values[key] = base
                elif size == n:
                    values[key] = 100
                else:
                    values[key] = min(
                        99, base + rng.randint(10, 25) * (size - 1) + (10 if difficulty == "hard" else 0)
                    )
        # Keep the grand coalition at least as valuable as any partition into a sub-coalition plus singletons.
        best_part = max(
            values[k] + sum(solo[s] for s in range(n) if names[s] not in k.split("+")) for k in values
        )
        values["+".join(names)] = max(100, best_part)
        max_turns = 4 * n
        draft = Scenario(
            family=self.name,
            difficulty=difficulty,
            template="characteristic-function-coalitions",
            tags=[],
            public="draft",
            params={"values": values, "first": 0},
            players=[
                PlayerInfo(seat=s, name=names[s], role="party", private={"target": 0}) for s in range(n)
            ],
            max_turns=max_turns,
        )
        phi = grand_split(draft)
        players = []
        for s in range(n):
            target = max(solo[s] + 1, round(phi[s] * rng.uniform(*TARGET[difficulty])))
            players.append(
                PlayerInfo(
                    seat=s,
                    name=names[s],
                    role="party",
                    private={"target": target},
                    brief=f"You win with a share of at least {target}; at least your solo value {solo[s]} is a draw; "
                    "less is a loss.",
                )
            )
        table = "; ".join(f"{k}: {v}" for k, v in values.items())
        public = (
            f"{', '.join(names)} can form one coalition. What each group can earn together: {table}. "
            f"Players outside the coalition earn their solo value. {names[0]} speaks first; at most {max_turns} messages."
        )
        return Scenario(
            family=self.name,
            difficulty=difficulty,
            template="characteristic-function-coalitions",
            tags=["coalition", "classic", "negotiation", f"{n}p"],
            public=public,
            params={"values": values, "first": 0},
            players=players,
            max_turns=max_turns,
        )

    def check(self, scenario: Scenario) -> None:
        n = scenario.num_players
        vals = as_int_map(scenario.params["values"], "values")
        expected = {
            key_of(scenario, set(c))
            for size in range(1, n + 1)
            for c in itertools.combinations(range(n), size)
        }
        if set(vals) != expected:
            raise ValueError("values must list every non-empty coalition exactly once")
        if value(scenario, set(range(n))) < sum(value(scenario, {s}) for s in range(n)):
            raise ValueError("the grand coalition must be worth at least the sum of solo values")
        for s in range(n):  # read by the verdict and the bots: a bad one used to fail mid-episode (INTERNAL)
            if scenario.private_int(s, "target") < 0:
                raise ValueError(f"{scenario.name(s)}'s target must not be negative")

    def parse_value(self, scenario: Scenario, keyword: str, rest: str) -> Any:
        shares: dict[int, int] = {}
        for key, raw in parse_mapping(rest):
            seat = scenario.seat_of(key)
            if seat is None:
                raise StatementError(f"unknown player {key!r}")
            share = int(number_of(raw, f"share of {key}", 0, 10_000))
            if seat in shares and shares[seat] != share:
                raise StatementError(f"contradictory shares for {key}")
            shares[seat] = share
        total = value(scenario, set(shares))
        if sum(shares.values()) != total:
            raise StatementError(
                f"shares sum to {sum(shares.values())}, but this coalition is worth exactly {total}"
            )
        return shares

    def tracker(self, scenario: Scenario) -> CoalitionTracker:
        return CoalitionTracker(scenario)

    def instructions(self, scenario: Scenario, seat: int) -> str:
        return (
            "Talk freely. Propose with a line `COALITION: {name: share, ...}` listing the members (including you) "
            "and shares summing exactly to that coalition's value. Members answer `ACCEPT` or `REJECT`; the "
            "coalition forms once every member accepted."
        )

    def solution(self, scenario: Scenario) -> list[tuple[int, str]]:
        split = grand_split(scenario)
        return [(0, format_coalition(scenario, split))] + [
            (s, "ACCEPT") for s in range(1, scenario.num_players)
        ]

    def heuristic(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        assert isinstance(tracker, CoalitionTracker)
        sc = tracker.scenario
        target, solo = sc.private_int(seat, "target"), value(sc, {seat})
        progress = tracker.turns / sc.max_turns
        demand = round(target - (target - solo) * min(1.0, 1.5 * progress))
        st = tracker.standing
        if st is not None and seat in st and seat not in tracker.accepted and st[seat] >= demand:
            return "Agreed.\nACCEPT"
        if tracker.standing is not None and seat == tracker.proposer:
            return "Please accept my proposal."
        split = grand_split(sc)
        total = value(sc, set(range(sc.num_players)))
        mine = min(max(demand, solo), total - sum(value(sc, {s}) for s in range(sc.num_players) if s != seat))
        others = [s for s in range(sc.num_players) if s != seat]
        rest = total - mine
        base = sum(split[s] for s in others) or 1
        shares = {s: split[s] * rest // base for s in others}
        shares[others[0]] += rest - sum(shares.values())
        shares[seat] = mine
        return "Let's all work together.\n" + format_coalition(sc, shares)

    def random_move(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        assert isinstance(tracker, CoalitionTracker)
        sc = tracker.scenario
        roll = rng.random()
        if (
            tracker.standing is not None
            and seat in tracker.standing
            and seat != tracker.proposer
            and roll < 0.5
        ):
            return rng.choice(("ACCEPT", "REJECT"))
        if roll < 0.75:
            others = [s for s in range(sc.num_players) if s != seat]
            members = {seat, *rng.sample(others, rng.randint(1, len(others)))}
            total = value(sc, members)
            cuts = sorted(rng.randint(0, total) for _ in range(len(members) - 1))
            parts = [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]
            return format_coalition(sc, dict(zip(sorted(members), parts, strict=True)))
        return rng.choice((PASS_TEXT, "Who wants to team up?", "我们合作吧。"))


FAMILY = Coalition()
