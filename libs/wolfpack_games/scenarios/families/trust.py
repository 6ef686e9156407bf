"""The trust (investment) game (Berg, Dickhaut & McCabe 1995).

Seat 0 (investor) holds an endowment and may ``SEND: <amount>`` (once, 0..endowment); the amount is
multiplied (×3 by default) for seat 1 (trustee), who then ``RETURN: <amount>`` (once, 0..received).
Sending 0 ends the game. Private info: each side's target payoff. Difficulty knob: the slack
``multiplier × endowment − investor target − trustee target`` (positive: full trust and a fair return
can make both win).

Verdict on payoffs (investor ``E − s + r``, trustee ``k·s − r``): the investor wins at its target, draws
if it at least broke even (payoff ≥ endowment), else loses; the trustee wins at its target, else draws.
Turn limit: no SEND counts as sending 0; a SEND without a RETURN makes the trustee lose (it failed to
decide) and counts as returning 0 for the investor.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from wolfpack_games.scenarios.families.base import PASS_TEXT, Family, Tracker, threshold_outcome
from wolfpack_games.scenarios.models import Difficulty, PlayerInfo, Scenario, VerificationResult
from wolfpack_games.scenarios.parsing import ParsedMessage, StatementSpec, parse_amount

INVESTOR, TRUSTEE = 0, 1
NAMES = ("Yara", "Zed", "Amir", "Bea", "Cole", "Dina", "Emil", "Fen")
SLACK: dict[Difficulty, tuple[float, float]] = {
    "easy": (0.3, 0.6),
    "medium": (0.05, 0.25),
    "hard": (-0.4, -0.1),
}


class TrustTracker(Tracker):
    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.sent: int | None = None
        self.returned: int | None = None

    def check(self, seat: int, msg: ParsedMessage) -> str:
        if msg.keyword == "SEND":
            if seat != INVESTOR:
                return "only the investor may SEND"
            if self.sent is not None:
                return "the investor has already sent"
        if msg.keyword == "RETURN":
            if seat != TRUSTEE:
                return "only the trustee may RETURN"
            if self.sent is None:
                return "RETURN needs a SEND first"
            if int(msg.value) > self.scenario.param_int("multiplier") * self.sent:
                return f"cannot return more than the {self.scenario.param_int('multiplier') * self.sent} received"
        return ""

    def apply(self, seat: int, msg: ParsedMessage) -> list[str]:
        k = self.scenario.param_int("multiplier")
        if msg.keyword == "SEND":
            self.sent = int(msg.value)
            if self.sent == 0:
                self.ended = "nothing sent"
                return ["The investor sent nothing; the game ends."]
            return [f"The investor sent {self.sent}; the trustee receives {k * self.sent}."]
        if msg.keyword == "RETURN":
            self.returned = int(msg.value)
            self.ended = "returned"
            return [f"The trustee returned {self.returned}."]
        return []

    def status(self) -> str:
        if self.sent is None:
            return "Nothing sent yet."
        return f"Sent {self.sent}; the trustee holds {self.scenario.param_int('multiplier') * self.sent}."

    def verdict(self) -> VerificationResult:
        sc = self.scenario
        e, k = sc.param_int("endowment"), sc.param_int("multiplier")
        sent = self.sent or 0
        returned = self.returned or 0
        inv = e - sent + returned
        tru = k * sent - returned
        outcomes = {
            INVESTOR: threshold_outcome(inv, sc.private_int(INVESTOR, "target"), e),
            TRUSTEE: 1 if tru >= sc.private_int(TRUSTEE, "target") else 0,
        }
        reason = f"investor payoff {inv}, trustee payoff {tru}"
        if sent > 0 and self.returned is None:
            outcomes[TRUSTEE] = -1
            reason += " (the trustee never decided what to return)"
        return VerificationResult(
            outcomes=outcomes, reason=reason, details={"sent": sent, "returned": returned}
        )


class Trust(Family):
    name = "trust"
    game_id = "trust_v1"
    title = "Trust game"
    theory = "the trust/investment game (Berg, Dickhaut & McCabe 1995)"
    specs = (StatementSpec.value("SEND"), StatementSpec.value("RETURN"))
    seats: ClassVar[dict[str, int]] = {"easy": 2, "medium": 2, "hard": 2}

    def generate(self, rng: random.Random, difficulty: Difficulty) -> Scenario:
        e = rng.choice((10, 20, 50, 100)) * rng.randint(1, 4)
        k = 3
        slack = round(k * e * rng.uniform(*SLACK[difficulty]) / 2)
        inv_target = e + max(1, round(e * rng.uniform(0.1, 0.6)))
        tru_target = max(1, k * e - inv_target - slack)
        a, b = rng.sample(NAMES, 2)
        max_turns = rng.choice((4, 6))
        public = (
            f"{a} (investor) has {e}. Whatever {a} sends to {b} (trustee) is multiplied by {k}; {b} then decides "
            f"how much to return. {a} speaks first; at most {max_turns} messages."
        )
        return Scenario(
            family=self.name,
            difficulty=difficulty,
            template="trust-investment",
            tags=["trust", "classic", "reciprocity", "2p"],
            public=public,
            params={"endowment": e, "multiplier": k, "first": 0},
            players=[
                PlayerInfo(
                    seat=INVESTOR,
                    name=a,
                    role="investor",
                    private={"target": inv_target},
                    brief=f"You win if you end with at least {inv_target}; ending with at least your {e} is a draw; "
                    "less is a loss.",
                ),
                PlayerInfo(
                    seat=TRUSTEE,
                    name=b,
                    role="trustee",
                    private={"target": tru_target},
                    brief=f"You win if you end with at least {tru_target}; less is a draw. Failing to RETURN after "
                    "receiving money loses.",
                ),
            ],
            max_turns=max_turns,
        )

    def check(self, scenario: Scenario) -> None:
        e, k = scenario.param_int("endowment"), scenario.param_int("multiplier")
        if e < 1 or k < 1:
            raise ValueError("endowment and multiplier must be positive")
        if not e <= scenario.private_int(INVESTOR, "target") <= k * e:
            raise ValueError("investor target must lie in [endowment, multiplier*endowment]")
        if not 0 <= scenario.private_int(TRUSTEE, "target") <= k * e:  # read by the verdict and the bots
            raise ValueError("trustee target must lie in [0, multiplier*endowment]")

    def parse_value(self, scenario: Scenario, keyword: str, rest: str) -> Any:
        e, k = scenario.param_int("endowment"), scenario.param_int("multiplier")
        high = e if keyword == "SEND" else k * e
        return int(parse_amount(rest, 0, high, integer=True, what=keyword.lower()))

    def tracker(self, scenario: Scenario) -> TrustTracker:
        return TrustTracker(scenario)

    def instructions(self, scenario: Scenario, seat: int) -> str:
        if seat == INVESTOR:
            return "Talk freely. Invest once with a line `SEND: <amount>` (0 ends the game)."
        return "Talk freely. After the investor sends, answer once with a line `RETURN: <amount>`."

    def solution(self, scenario: Scenario) -> list[tuple[int, str]]:
        e, k = scenario.param_int("endowment"), scenario.param_int("multiplier")
        inv_t, tru_t = scenario.private_int(INVESTOR, "target"), scenario.private_int(TRUSTEE, "target")
        r = inv_t if k * e - inv_t >= tru_t else e
        return [(INVESTOR, f"SEND: {e}"), (TRUSTEE, f"RETURN: {r}")]

    def heuristic(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        assert isinstance(tracker, TrustTracker)
        sc = tracker.scenario
        e, k = sc.param_int("endowment"), sc.param_int("multiplier")
        if seat == INVESTOR:
            if tracker.sent is None:
                return f"I trust you with everything.\nSEND: {e}"
            return "Your move."
        if tracker.sent is None:
            return "I promise to return a fair share."
        pool = k * tracker.sent
        keep = min(
            sc.private_int(TRUSTEE, "target"), pool - tracker.sent
        )  # always at least repay the investment
        return f"Thank you for trusting me.\nRETURN: {max(tracker.sent, pool - keep)}"

    def random_move(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        assert isinstance(tracker, TrustTracker)
        sc = tracker.scenario
        if seat == INVESTOR and tracker.sent is None and rng.random() < 0.6:
            return f"SEND: {rng.randint(0, sc.param_int('endowment'))}"
        if seat == TRUSTEE and tracker.sent is not None and rng.random() < 0.6:
            return f"RETURN: {rng.randint(0, sc.param_int('multiplier') * tracker.sent)}"
        return rng.choice((PASS_TEXT, "Trust me.", "我会公平的。"))


FAMILY = Trust()
