"""The iterated prisoner's dilemma (Rapoport & Chammah 1965; Axelrod, *The Evolution of Cooperation*, 1984).

Two players play a known number of rounds. In each round both act simultaneously: every message must
contain a ``MOVE: C`` (cooperate) or ``MOVE: D`` (defect) line (``COOPERATE``/``DEFECT`` and 合作/背叛
also work) and may contain chat. A player's k-th move is its move in round k; moves are sealed until
both have moved, then revealed. Payoffs follow a public matrix with T > R > P > S and 2R > T + S.
Private info: each player's target total. Difficulty knobs: number of rounds and how close the targets
are to mutual cooperation (R per round).

Verdict on total payoffs over the completed rounds: a player wins at its target, draws at or above the
mutual-defection total (P per round), else loses. The silent default move is ``D``.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from wolfpack_games.scenarios.families.base import Family, Tracker, threshold_outcome
from wolfpack_games.scenarios.models import Difficulty, PlayerInfo, Scenario, VerificationResult
from wolfpack_games.scenarios.parsing import ParsedMessage, StatementSpec, parse_choice

MOVES = {"c": "C", "cooperate": "C", "d": "D", "defect": "D", "合作": "C", "背叛": "D"}
NAMES = ("Ari", "Bo", "Cyd", "Dov", "Eva", "Finn", "Gia", "Hugo")
ROUNDS: dict[Difficulty, tuple[int, int]] = {"easy": (2, 3), "medium": (4, 5), "hard": (6, 8)}
TARGET: dict[Difficulty, tuple[float, float]] = {
    "easy": (0.2, 0.5),
    "medium": (0.5, 0.8),
    "hard": (0.85, 1.0),
}
MATRICES = ((5, 3, 1, 0), (6, 4, 1, 0), (7, 5, 2, 0), (4, 3, 1, 0), (10, 6, 2, 1))


class PDTracker(Tracker):
    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.moves: dict[int, list[str]] = {0: [], 1: []}

    @property
    def done(self) -> bool:
        return bool(self.ended) or self.turns >= self.scenario.max_turns or self.rounds_done >= self.rounds

    @property
    def rounds(self) -> int:
        return self.scenario.param_int("rounds")

    @property
    def rounds_done(self) -> int:
        return min(len(self.moves[0]), len(self.moves[1]))

    def _acting(self) -> list[int]:
        return [s for s in (0, 1) if len(self.moves[s]) == self.rounds_done]

    def legal_kinds(self, seat: int) -> tuple[str, ...]:
        return ("final",)

    def default_text(self, seat: int) -> str:
        return "MOVE: D"

    def check(self, seat: int, msg: ParsedMessage) -> str:
        return "" if msg.keyword == "MOVE" else "every message must contain your move: `MOVE: C` or `MOVE: D`"

    def payoff(self, mine: str, theirs: str) -> int:
        t, r, p, s = (self.scenario.param_int(k) for k in ("T", "R", "P", "S"))
        return {("C", "C"): r, ("C", "D"): s, ("D", "C"): t, ("D", "D"): p}[(mine, theirs)]

    def apply(self, seat: int, msg: ParsedMessage) -> list[str]:
        self.moves[seat].append(str(msg.value))
        k = len(self.moves[seat])
        if len(self.moves[1 - seat]) >= k:
            a, b = self.moves[0][k - 1], self.moves[1][k - 1]
            sc = self.scenario
            word = {"C": "cooperated", "D": "defected"}
            return [
                f"Round {k}: {sc.name(0)} {word[a]} (+{self.payoff(a, b)}), {sc.name(1)} {word[b]} (+{self.payoff(b, a)})."
            ]
        return []

    def status(self) -> str:
        return f"Round {min(self.rounds_done + 1, self.rounds)} of {self.rounds}."

    def totals(self) -> dict[int, int]:
        k = self.rounds_done
        return {s: sum(self.payoff(self.moves[s][i], self.moves[1 - s][i]) for i in range(k)) for s in (0, 1)}

    def verdict(self) -> VerificationResult:
        sc = self.scenario
        tot = self.totals()
        floor = sc.param_int("P") * self.rounds
        outcomes = {s: threshold_outcome(tot[s], sc.private_int(s, "target"), floor) for s in (0, 1)}
        return VerificationResult(
            outcomes=outcomes,
            reason=f"totals after {self.rounds_done} rounds: {sc.name(0)} {tot[0]}, {sc.name(1)} {tot[1]}",
            details={"moves": {sc.name(s): "".join(self.moves[s]) for s in (0, 1)}, "totals": tot},
        )


class PrisonersDilemma(Family):
    name = "prisoners_dilemma"
    game_id = "prisoners_dilemma_v1"
    title = "Iterated prisoner's dilemma"
    theory = "the iterated prisoner's dilemma (Rapoport & Chammah 1965; Axelrod 1984)"
    specs = (StatementSpec.value("MOVE"),)
    sealed = frozenset({"MOVE"})
    seats: ClassVar[dict[str, int]] = {"easy": 2, "medium": 2, "hard": 2}

    def generate(self, rng: random.Random, difficulty: Difficulty) -> Scenario:
        rounds = rng.randint(*ROUNDS[difficulty])
        t, r, p, s = rng.choice(MATRICES)
        names = rng.sample(NAMES, 2)
        players = []
        for seat in (0, 1):
            target = max(p * rounds + 1, round(rounds * (p + (r - p) * rng.uniform(*TARGET[difficulty]))))
            players.append(
                PlayerInfo(
                    seat=seat,
                    name=names[seat],
                    role="player",
                    private={"target": min(target, r * rounds)},
                    brief=f"You win with a total of at least {min(target, r * rounds)}; at least {p * rounds} is a "
                    "draw; less is a loss.",
                )
            )
        public = (
            f"{names[0]} and {names[1]} play {rounds} rounds of the prisoner's dilemma. Each round both choose "
            f"simultaneously to cooperate (C) or defect (D). Points per round: both C {r} each; both D {p} each; "
            f"a defector against a cooperator gets {t}, the cooperator {s}. Moves are revealed after each round."
        )
        return Scenario(
            family=self.name,
            difficulty=difficulty,
            template="iterated-prisoners-dilemma",
            tags=["prisoners_dilemma", "classic", "social-dilemma", "2p", f"rounds-{rounds}"],
            public=public,
            params={"rounds": rounds, "T": t, "R": r, "P": p, "S": s},
            players=players,
            max_turns=2 * rounds,
        )

    def check(self, scenario: Scenario) -> None:
        t, r, p, s = (scenario.param_int(k) for k in ("T", "R", "P", "S"))
        if not (t > r > p > s and 2 * r > t + s):
            raise ValueError("a prisoner's dilemma needs T > R > P > S and 2R > T + S")
        if scenario.max_turns != 2 * scenario.param_int("rounds"):
            raise ValueError("max_turns must be 2 x rounds")
        for seat in (0, 1):
            if not scenario.private_int(seat, "target") <= r * scenario.param_int("rounds"):
                raise ValueError("targets must be reachable by mutual cooperation")

    def parse_value(self, scenario: Scenario, keyword: str, rest: str) -> Any:
        return parse_choice(rest, MOVES, what="move")

    def tracker(self, scenario: Scenario) -> PDTracker:
        return PDTracker(scenario)

    def instructions(self, scenario: Scenario, seat: int) -> str:
        return "Every message must contain your move for this round: a line `MOVE: C` or `MOVE: D`. You may add chat."

    def solution(self, scenario: Scenario) -> list[tuple[int, str]]:
        return [(s, "MOVE: C") for _ in range(scenario.param_int("rounds")) for s in (0, 1)]

    def heuristic(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        assert isinstance(tracker, PDTracker)
        k = len(tracker.moves[seat])
        theirs = tracker.moves[1 - seat]
        move = "C" if k == 0 or theirs[k - 1] == "C" else "D"  # tit for tat
        return f"{'Cooperating' if move == 'C' else 'You defected'}.\nMOVE: {move}"

    def random_move(self, tracker: Tracker, seat: int, rng: random.Random) -> str:
        return f"MOVE: {rng.choice('CD')}"


FAMILY = PrisonersDilemma()
