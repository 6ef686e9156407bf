"""The verifier: a pure function of (scenario, transcript) so any service can re-check a finished game.

A transcript is the list of ``(seat, text)`` messages in the order they were made (raw model output,
``<think>`` blocks included — they are stripped here). Rules shared by all families:

* A message from a seat that is not acting at that point (out of turn) is a violation.
* A malformed or contradictory message, or a statement not allowed at that point (``ACCEPT`` with
  nothing to accept, a second ``OFFER``...), is a violation.
* A violation ends the verification: its author gets -1, every other seat 0.
* Messages after the game ended (a closing statement or the turn limit) are ignored and counted in
  ``details["ignored_messages"]``.
* A transcript that stops before the game ended is judged as if the turn limit had been reached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from wolfpack_games.scenarios.families import get_family
from wolfpack_games.scenarios.families.base import violation
from wolfpack_games.scenarios.models import Scenario, VerificationResult

Transcript = Sequence[tuple[int, str]]


def verify(scenario: Scenario, transcript: Transcript) -> VerificationResult:
    """Map a transcript to per-seat outcomes (+1 win, -1 loss, 0 draw) with a reason and details."""
    family = get_family(scenario.family)
    tracker = family.tracker(scenario)
    for index, (seat, text) in enumerate(transcript):
        if not 0 <= seat < scenario.num_players:
            raise ValueError(f"message {index} has seat {seat}, but the scenario has {scenario.num_players}")
        if tracker.done:
            result = tracker.verdict()
            details = {**result.details, "ignored_messages": len(transcript) - index}
            return result.model_copy(update={"details": details})
        if seat not in tracker.acting():
            return violation(scenario, seat, index, "spoke out of turn")
        msg = family.parse(scenario, text)
        error = msg.error or tracker.check(seat, msg)
        if error:
            return violation(scenario, seat, index, error)
        tracker.record(seat, msg)
    return tracker.verdict()


def verify_transcript(
    scenario: Scenario | Mapping[str, Any],
    transcript: Sequence[tuple[int, str]] | Sequence[Mapping[str, Any]],
) -> VerificationResult:
    """CLI/service entry point: accepts a scenario dict and ``[(seat, text)]`` or ``[{"seat", "text"}]``."""
    sc = scenario if isinstance(scenario, Scenario) else Scenario.model_validate(dict(scenario))
    pairs: list[tuple[int, str]] = []
    for item in transcript:
        if isinstance(item, Mapping):
            pairs.append((int(item["seat"]), str(item["text"])))
        else:
            seat, text = item
            pairs.append((int(seat), str(text)))
    return verify(sc, pairs)
