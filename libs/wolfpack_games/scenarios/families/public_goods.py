"""The linear public goods game (Isaac & Walker 1988; Ledyard 1995).

``n`` players each hold an endowment and make one sealed ``CONTRIBUTE: <amount>`` to a common pool;
the pool is multiplied and shared equally. Payoff ``E − c_i + m·Σc / n`` with ``1 < m < n``, so
free-riding is individually tempting but full contribution is best for the group. Players may talk
(cheap talk) before contributing; contributions are hidden from the others until everyone has
contributed. Private info: each player's target payoff. Difficulty knobs: group size, marginal per-capita
return ``m/n``, and how close the targets are to the full-cooperation payoff.

Verdict: a player wins at its target, draws if its payoff is at least its endowment, else loses. At the
turn limit missing contributions count as 0.
"""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any, ClassVar

from wolfpack_games.scenarios.families.base import PASS_TEXT, Family, Tracker, threshold_outcome
from wolfpack_games.scenarios.models import Difficulty, PlayerInfo, Scenario, VerificationResult
from wolfpack_games.scenarios.parsing import ParsedMessage, StatementSpec, parse_amount

NAMES = ("Gil", "Hao", "Ines", "Jae", "Kofi", "Lina", "Mo", "Nell")
MULTIPLIER_X10: dict[Difficulty, tuple[int, int]] = {"easy": (22, 26), "medium": (18, 24), "hard": (16, 22)}
TARGET: dict[Difficulty, tuple[float, float]] = {
    "easy": (0.2, 0.5),
    "medium": (0.5, 0.8),
    "hard": (0.85, 1.0),
}


class PublicGoodsTracker(Tracker):
    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.contrib: dict[int, int] = {}

    def check(self, seat: int, msg: ParsedMessage) -> str:
        if msg.keyword == "CONTRIBUTE" and seat in self.contrib:
            return "you have already contributed (one sealed contribution each)"
        return ""

    def apply(self, seat: int, msg: ParsedMessage) -> list[str]:
        if msg.keyword == "CONTRIBUTE":
            self.contrib[seat] = int(msg.value)
            if len(self.contrib) == self.n:
                self.ended = "all contributed"
                sc = self.scenario
                listing = ", ".join(f"{sc.name(s)} {self.contrib[s]}" for s in range(self.n))
                return [f"All contributions revealed: {listing}."]
        return []

    def status(self) -> str:
        done = [self.scenario.name(s) for s in sorted(self.contrib)]
        return f"Sealed contributions received from: {', '.join(done) or 'nobody yet'}."

    def payoffs(self) -> dict[int, Fraction]:
        """Exact payoffs (fractions), so a threshold equal to the payoff is never missed by rounding."""
        sc = self.scenario
        e, m = sc.param_int("endowment"), Fraction(sc.param_int("multiplier_x10"), 10)
        total = sum(self.contrib.get(s, 0) for s in range(self.n))
        return {s: e - self.contrib.get(s, 0) + m * total / self.n for s in range(self.n)}

    def verdict(self) -> VerificationResult:
        sc = self.scenario
        e = sc.param_int("endowment")
        pay = self.payoffs()
        outcomes = {s: threshold_outcome(pay[s], sc.private_int(s, "target"), e) for s in range(self.n)}
        return VerificationResult(
            outcomes=outcomes,
            reason="payoffs " + ", ".join(f"{sc.name(s)} {float(pay[s]):g}" for s in range(self.n)),
            details={
                "contributions": {sc.name(s): self.contrib.get(s, 0) for s in range(self.n)},
                "payoffs": {s: float(v) for s, v in pay.items()},
            },
        )


class PublicGoods(Family):
    name = "public_goods"
    game_id = "public_goods_v1"
    title = "Public goods game"
    theory = "the linear public goods game (Isaac & Walker 1988; Ledyard 1995)"
    specs = (StatementSpec.value("CONTRIBUTE"),)
    sealed = frozenset({"CONTRIBUTE"})
    seats: ClassVar[dict[str, int]] = {"easy": 3, "medium": 4, "hard": 5}

    def generate(self, rng: random.Random, difficulty: Difficulty) -> Scenario:
        n = self.seats[difficulty]
        e = rng.choice((10, 20, 50, 100))
        m10 = rng.randint(*MULTIPLIER_X10[difficulty])
        full = Fraction(e * m10, 10)  # everyone's payoff when all contribute everything
        names = rng.sample(NAMES, n)
        players = []
        for s in range(n):
            target = min(int(full), max(e + 1, round(e + float(full - e) * rng.uniform(*TARGET[difficulty]))))
            players.append(
                PlayerInfo(
                    seat=s,
                    name=names[s],
                    role="citizen",
                    private={"target": target},
                    brief=f"You win if your payoff reaches {target}; at least {e} (your endowment) is a draw; "
                    "less is a loss.",
                )
            )
        max_turns = 3 * n
        public = (
            f"{', '.join(names)} each hold {e}. Each makes one sealed contribution to a common pool; the pool is "
            f"multiplied by {m10 / 10:g} and shared equally among all {n}. Your payoff is what you kept plus your "
            f"share. Contributions are revealed once everyone has contributed; at most {max_turns} messages "
            "(missing contributions count as 0)."
        )
        return Scenario(
            family=self.name,
            difficulty=difficulty,
            template="linear-public-goods",
            tags=["public_goods", "classic", "social-dilemma", f"{n}p"],
            public=public,
            params={"endowment": e, "multiplier_x10": m10, "first": 0},
            players=players,
            max_turns=max_turns,
        )

    def check(self, scenario: Scenario) -> None:
        n, e, m10 = (
            scenario.num_players,
            scenario.param_int("endowment"),
            scenario.param_int("multiplier_x10"),
        )
        if not 10 < m10 < 10 * n:
            raise ValueError("the multiplier must lie strictly between 1 and n")
        for s in range(n):
            if not e <= scenario.private_int(s, "target") <= Fraction(e * m10, 10):
                raise ValueError("targets must lie between the endowment and the full-cooperation payoff")

    def parse_value(self, scenario: Scenario, keyword: str, rest: str) -> Any:
        return int(parse_amount(rest, 0, scenario.param_int("endowment"), integer=True, what="contribution"))

    def tracker(self, scenario: Scenario) -> PublicGoodsTracker:
        return PublicGoodsTracker(scenario)

    def instructions(self, scenario: Scenario, seat: int) -> str:
        return (
            f"Talk freely. Contribute once with a line `CONTRIBUTE: <0..{scenario.param_int('endowment')}>`; "
            "others see only that you contributed until everyone has."
        )

    def solution(self, scenario: Scenario) -> list[tuple[int, str]]:
        return [(s, f"CONTRIBUTE: {scenario.param_int('endowment')}") for s in range(scenario.num_players)]

    def heuristic(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        assert isinstance(tracker, PublicGoodsTracker)
        e = tracker.scenario.param_int("endowment")
        if seat in tracker.contrib:
            return "I have contributed; please do the same."
        if tracker.turns < tracker.n:
            return f"Let's all contribute everything: we each end with more than {e}."
        return f"As promised.\nCONTRIBUTE: {e}"

    def random_move(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        assert isinstance(tracker, PublicGoodsTracker)
        if seat not in tracker.contrib and rng.random() < 0.5:
            return f"CONTRIBUTE: {rng.randint(0, tracker.scenario.param_int('endowment'))}"
        return rng.choice((PASS_TEXT, "I will contribute a lot.", "大家一起出钱吧。"))


FAMILY = PublicGoods()
