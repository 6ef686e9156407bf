"""Seat outcomes: read from the trajectory (Werewolf) or re-verified from the transcript (scenarios).

Why re-verify scenarios: the verifier is a pure function of (scenario, transcript), so the reward does
not have to trust whoever wrote ``trajectory.outcomes``; when the two disagree the verifier wins and the
disagreement is reported as a note.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_games.scenarios import Scenario, VerificationResult, get_family, verify
from wolfpack_games.scenarios.wire import scenario_from_pb
from wolfpack_games.werewolf.models import TEAM_VILLAGE, TEAM_WOLVES, WOLF_ROLES
from wolfpack_rewards.config import OutcomeConfig
from wolfpack_rewards.result import ScoreError

WIN, LOSS, DRAW, ABORTED = (
    common_pb2.OUTCOME_KIND_WIN,
    common_pb2.OUTCOME_KIND_LOSS,
    common_pb2.OUTCOME_KIND_DRAW,
    common_pb2.OUTCOME_KIND_ABORTED,
)
_FROM_VERDICT = {1: WIN, -1: LOSS, 0: DRAW}


@dataclass(frozen=True)
class SeatResult:
    seat: int
    role: str
    team: str
    outcome: int  # common_pb2.OutcomeKind


def outcome_value(result: SeatResult, cfg: OutcomeConfig) -> float:
    """The configured magnitude of a seat's outcome (role overrides team overrides the default)."""
    if result.outcome == WIN:
        return cfg.role_win.get(result.role, cfg.team_win.get(result.team, cfg.win))
    if result.outcome == LOSS:
        return cfg.role_loss.get(result.role, cfg.team_loss.get(result.team, cfg.loss))
    if result.outcome == DRAW:
        return cfg.draw
    return cfg.aborted  # ABORTED, or UNSPECIFIED that could not be derived


# --- Werewolf --------------------------------------------------------------------------------------------


def werewolf_results(trajectory: trajectory_pb2.Trajectory) -> tuple[dict[int, SeatResult], dict[str, str]]:
    """Seat results from ``trajectory.outcomes``; the team defaults from the role, and an UNSPECIFIED
    outcome is derived from ``trajectory.winner`` (empty winner: aborted). Returns results and notes."""
    if not trajectory.outcomes:
        raise ScoreError("werewolf trajectory has no outcomes; the episode must be finished")
    results: dict[int, SeatResult] = {}
    notes: dict[str, str] = {}
    winner = trajectory.winner
    for o in trajectory.outcomes:
        if o.seat in results:
            raise ScoreError(f"seat {o.seat} appears twice in trajectory.outcomes")
        team = o.team or (TEAM_WOLVES if o.role in WOLF_ROLES else TEAM_VILLAGE if o.role else "")
        kind = int(o.outcome)
        if winner and team and kind in (WIN, LOSS):
            expected = WIN if team == winner else LOSS
            if kind != expected:
                notes[f"outcome_mismatch.seat{o.seat}"] = (
                    f"outcome {common_pb2.OutcomeKind.Name(o.outcome)} but team {team!r} vs winner {winner!r}"
                )
        if kind == common_pb2.OUTCOME_KIND_UNSPECIFIED:
            kind = (WIN if team == winner else LOSS) if winner and team else ABORTED
        results[o.seat] = SeatResult(o.seat, o.role, team, kind)
    return results, notes


def alive_seats(trajectory: trajectory_pb2.Trajectory) -> set[int] | None:
    """Seats whose ``SeatOutcome.alive`` is set and true, or None when no outcome records survival (games
    without elimination)."""
    recorded = [o for o in trajectory.outcomes if o.HasField("alive")]
    if not recorded:
        return None
    return {o.seat for o in recorded if o.alive}


# --- scenarios ---------------------------------------------------------------------------------------------


def scenario_of(trajectory: trajectory_pb2.Trajectory) -> Scenario:
    """The scenario in ``trajectory.scenario``, validated (family rules, content-hash id) and checked
    against the trajectory's game id."""
    if not trajectory.HasField("scenario"):
        raise ScoreError("scenario trajectory needs its scenario (Trajectory.scenario)")
    try:
        scenario = scenario_from_pb(trajectory.scenario)
    except (ValidationError, ValueError, KeyError) as exc:
        first = str(exc).splitlines()[0:3]
        raise ScoreError(f"Trajectory.scenario is not a valid scenario: {' '.join(first)}") from None
    game_id = get_family(scenario.family).game_id
    if trajectory.game.game_id != game_id:
        raise ScoreError(
            f"scenario family {scenario.family!r} is game {game_id}, but the trajectory is "
            f"{trajectory.game.game_id!r}"
        )
    return scenario


def transcript_of(trajectory: trajectory_pb2.Trajectory) -> list[tuple[int, str]]:
    """The verifier's transcript: the messages the environment applied, in order.

    * a valid turn contributes ``(seat, response_text)`` (``action.text`` if the response text is empty,
      e.g. a structured action from an external seat);
    * a defaulted turn contributes ``(seat, action.text)``: the default message the engine applied
      instead of the invalid response;
    * an invalid turn that was not defaulted (the seat was re-prompted) contributes nothing.
    """
    out: list[tuple[int, str]] = []
    for turn in trajectory.turns:
        if turn.defaulted:
            out.append((turn.seat, turn.action.text))
        elif turn.valid:
            out.append((turn.seat, turn.response_text or turn.action.text))
    return out


def scenario_results(
    trajectory: trajectory_pb2.Trajectory, scenario: Scenario
) -> tuple[dict[int, SeatResult], VerificationResult, dict[str, str]]:
    """Verifier outcomes for every scenario seat, plus notes where ``trajectory.outcomes`` disagrees."""
    verdict = verify(scenario, transcript_of(trajectory))
    results = {
        p.seat: SeatResult(p.seat, p.role, p.role, _FROM_VERDICT[verdict.outcomes.get(p.seat, 0)])
        for p in scenario.players
    }
    notes = {"verifier": verdict.reason}
    claimed = {o.seat: int(o.outcome) for o in trajectory.outcomes}
    diffs = [
        f"seat {seat}: trajectory {common_pb2.OutcomeKind.Name(kind)}, "  # type: ignore[arg-type]
        f"verifier {common_pb2.OutcomeKind.Name(results[seat].outcome)}"  # type: ignore[arg-type]
        for seat, kind in sorted(claimed.items())
        if kind != common_pb2.OUTCOME_KIND_UNSPECIFIED and kind != results[seat].outcome
    ]
    if diffs:
        notes["verifier_mismatch"] = "; ".join(diffs)
    return results, verdict, notes


NO_DEAL_KEYS: dict[str, str] = {"bargaining": "deal"}
"""Scenario family -> the verdict ``details`` key that holds the deal, ``None`` when the negotiation ended
without one (walked away or turn limit). A family not listed has no notion of a deal the reward can read."""


def ended_without_deal(scenario: Scenario, verdict: VerificationResult) -> bool:
    """Whether the verifier says the negotiation ended without a deal (not a rule violation, whose verdict
    records no deal key at all: that seat's loss is its own outcome). ``ScoreError`` for a family without
    deals, so a spec that prices a no-deal is never silently a no-op there."""
    key = NO_DEAL_KEYS.get(scenario.family)
    if key is None:
        raise ScoreError(
            f"outcome.no_deal needs a scenario family whose verifier records a deal "
            f"({', '.join(sorted(NO_DEAL_KEYS))}), not {scenario.family!r}"
        )
    return key in verdict.details and verdict.details[key] is None
