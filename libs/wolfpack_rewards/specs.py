"""Named, versioned reward specs: a registry of ``score(trajectory, config) -> ScoreResult`` functions.

Every spec has the same signature and the same ``SpecConfig`` shape; a spec is a score function plus its
default config, registered as ``name@version``. Changing what a spec rewards means a new version, never an
edit of an existing one, so ``trajectory.reward_spec`` always says exactly how its rewards were made.

Per turn the components are ``outcome`` (credit-assigned), ``invalid_penalty``, ``format_penalty``,
``length_penalty``, ``prediction``, the Werewolf decision rewards ``role_<kind>`` (roles.py) and a
scenario's ``no_deal`` (credit-assigned like the outcome); per seat the terminal-only components are
``outcome`` and ``no_deal`` (a seat with no turns) and ``survival``. See result.py for the invariant that ties them together.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from wolfpack.registry import Registry
from wolfpack.v1 import trajectory_pb2
from wolfpack_games.scenarios import available_families, get_family
from wolfpack_games.werewolf import GAME_ID as WEREWOLF_GAME_ID
from wolfpack_rewards import credit, outcome, roles, shaping
from wolfpack_rewards.config import (
    OutcomeConfig,
    PenaltyConfig,
    PredictionConfig,
    RoleConfig,
    SpecConfig,
)
from wolfpack_rewards.result import ScoreError, ScoreResult, SeatScore, TurnScore

ScoreFn = Callable[[trajectory_pb2.Trajectory, SpecConfig], ScoreResult]

WEREWOLF_GAMES: tuple[str, ...] = (WEREWOLF_GAME_ID,)
SCENARIO_GAMES: tuple[str, ...] = tuple(get_family(name).game_id for name in available_families())


@dataclass(frozen=True)
class RewardSpec:
    name: str
    version: int
    description: str
    game_ids: tuple[str, ...]
    config: SpecConfig
    fn: ScoreFn = field(repr=False)

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    def score(self, trajectory: trajectory_pb2.Trajectory, config: SpecConfig | None = None) -> ScoreResult:
        """Check the trajectory fits this spec, score it, and stamp the result with ``name@version``."""
        if not trajectory.turns:
            raise ScoreError("trajectory has no turns; nothing to score")
        game = trajectory.game.game_id
        if game not in self.game_ids:
            raise ScoreError(f"spec {self.key} scores {', '.join(self.game_ids)}, not game {game!r}")
        result = self.fn(trajectory, config or self.config)
        return ScoreResult(result.turns, result.seats, result.notes, self.key)


SPECS: Registry[RewardSpec] = Registry("reward spec", error=ScoreError)
"""``name@version`` -> spec; the shared ``wolfpack.registry`` shape (a miss is INVALID_ARGUMENT)."""


def register_spec(
    name: str,
    version: int,
    description: str,
    game_ids: Iterable[str],
    config: SpecConfig | None = None,
) -> Callable[[ScoreFn], ScoreFn]:
    """Decorator registering ``fn`` as ``name@version``; stack it to register one function under
    several configs (``werewolf_outcome@1`` and ``werewolf_shaped@1`` share one function)."""

    def deco(fn: ScoreFn) -> ScoreFn:
        add_spec(RewardSpec(name, version, description, tuple(game_ids), config or SpecConfig(), fn))
        return fn

    return deco


def add_spec(spec: RewardSpec) -> RewardSpec:
    if "@" in spec.name or not spec.name or spec.version < 1:
        raise ValueError(f"bad spec name/version {spec.name!r}@{spec.version}")
    if spec.key in SPECS:
        raise ValueError(f"reward spec {spec.key} is already registered")
    return SPECS.add(spec.key, spec)


def get_spec(name: str) -> RewardSpec:
    """``name@version``, or ``name`` for its latest version; a miss lists the valid names."""
    return SPECS.get(name)


DEFAULT_SPECS: dict[str, str] = {
    **dict.fromkeys(WEREWOLF_GAMES, "werewolf_shaped@1"),
    **dict.fromkeys(SCENARIO_GAMES, "scenario_shaped@1"),
}


def resolve_spec(name: str, game_id: str) -> RewardSpec:
    """The named spec, or the game's default when ``name`` is empty."""
    if name:
        return get_spec(name)
    if game_id not in DEFAULT_SPECS:
        raise ScoreError(
            f"no default reward spec for game {game_id!r}; games: {', '.join(sorted(DEFAULT_SPECS))}"
        )
    return get_spec(DEFAULT_SPECS[game_id])


def load_specs(source: str | Path | Mapping[str, Any]) -> list[RewardSpec]:
    """Register variants from YAML (a path or a parsed dict) of the form::

        specs:
          - {name: werewolf_wolfbonus, version: 1, base: werewolf_outcome@1,
             description: "...", config: {outcome: {team_win: {wolves: 1.5}}}}

    A variant reuses its base's score function and game ids, with ``config`` deep-merged over the base's.
    """
    data = source if isinstance(source, Mapping) else yaml.safe_load(Path(source).read_text())
    added = []
    for entry in (data or {}).get("specs", []):
        extra = set(entry) - {"name", "version", "base", "description", "config"}
        if extra:
            raise ValueError(f"unknown keys in spec entry: {', '.join(sorted(extra))}")
        base = get_spec(entry["base"])
        try:
            config = base.config.merged(entry.get("config") or {})
        except ValidationError as exc:
            raise ValueError(f"spec {entry['name']}: {exc}") from None
        description = entry.get("description") or f"{base.description} (variant of {base.key})"
        added.append(
            add_spec(
                RewardSpec(entry["name"], int(entry["version"]), description, base.game_ids, config, base.fn)
            )
        )
    return added


# --- shared scoring ------------------------------------------------------------------------------------


def _check_seats(trajectory: trajectory_pb2.Trajectory, known: set[int], where: str) -> None:
    bound = {b.seat for b in trajectory.seats}
    for position, turn in enumerate(trajectory.turns):
        if turn.seat not in known:
            raise ScoreError(f"turn {position} is by seat {turn.seat}, which is not in {where}")
        if bound and turn.seat not in bound:
            raise ScoreError(f"turn {position} is by seat {turn.seat}, which is not in trajectory.seats")


def seat_credit(
    turns: Sequence[trajectory_pb2.Turn], seat: int, value: float, config: SpecConfig
) -> dict[int, float]:
    """A seat-level ``value`` spread over ``seat``'s turns (positions in ``turns``) as ``config.credit``
    says; empty when the seat has no turns, where the caller keeps it as a terminal-only component."""
    positions = [p for p, t in enumerate(turns) if t.seat == seat]
    return credit.assign(positions, value, config.credit.mode, config.credit.gamma)


def compose(
    trajectory: trajectory_pb2.Trajectory,
    results: Mapping[int, outcome.SeatResult],
    config: SpecConfig,
    terminal: Mapping[int, dict[str, float]] | None = None,
    notes: Mapping[str, str] | None = None,
    extra: Mapping[int, Mapping[str, float]] | None = None,
) -> ScoreResult:
    """Outcome credit + penalties + prediction per turn; ``terminal`` adds seat-level components and
    ``extra`` (position in ``trajectory.turns`` -> components) a spec's own per-turn components.

    A seat without turns gets its outcome as a terminal-only ``outcome`` component, so no seat's result
    is lost whatever the credit mode.
    """
    turns = list(trajectory.turns)
    components: list[dict[str, float]] = [{} for _ in turns]
    seat_terminal: dict[int, dict[str, float]] = {s: dict((terminal or {}).get(s, {})) for s in results}
    for seat, res in results.items():
        value = outcome.outcome_value(res, config.outcome)
        spread = seat_credit(turns, seat, value, config)
        if not spread:
            seat_terminal[seat]["outcome"] = seat_terminal[seat].get("outcome", 0.0) + value
        for p, amount in spread.items():
            components[p]["outcome"] = amount
    for p, turn in enumerate(turns):
        components[p].update(shaping.penalty_components(turn, config.penalties))
    for p, bonus in shaping.prediction_components(turns, config.prediction).items():
        components[p]["prediction"] = bonus
    for p, more in (extra or {}).items():
        components[p].update(more)
    scored = [TurnScore(p, t.seat, components[p]) for p, t in enumerate(turns)]
    seats = {
        s: SeatScore(s, r.role, r.team, r.outcome, {k: v for k, v in seat_terminal[s].items() if v})
        for s, r in results.items()
    }
    return ScoreResult(scored, seats, dict(notes or {}))


# --- Werewolf ---------------------------------------------------------------------------------------------

_SHAPED_PENALTIES = PenaltyConfig(invalid=0.1, max_tokens=1024, max_chars=6000, over_length=0.1)
_SHAPED_PREDICTION = PredictionConfig(weight=0.2, metric="char_ratio")
_ROLE_WEIGHT = 0.2
_ROLES = RoleConfig(
    vote=_ROLE_WEIGHT, inspect=_ROLE_WEIGHT, poison=_ROLE_WEIGHT, save=_ROLE_WEIGHT, shoot=_ROLE_WEIGHT
)


@register_spec(
    "werewolf_role",
    1,
    "werewolf_shaped@1 (team win/loss +1/-1 on each seat's last turn, -0.1 per invalid or defaulted turn "
    "and per over-length response, 0.2 x <predict_next> char-similarity) plus per-turn role rewards of "
    "0.2 on the turn of the seat's own applied decision, judged by the target's team in "
    "trajectory.outcomes: a day vote or a hunter/wolf-king shot at the other team +0.2, at the own team "
    "-0.2; a seer inspecting a wolf +0.2; a witch poison on a wolf +0.2, on a village seat -0.2; a witch "
    "save (only ever of the wolves' victim) of a village seat +0.2, of a wolf -0.2. Nothing for guard "
    "protections, wolf kills, speeches or defaulted turns",
    WEREWOLF_GAMES,
    SpecConfig(penalties=_SHAPED_PENALTIES, prediction=_SHAPED_PREDICTION, roles=_ROLES),
)
@register_spec(
    "werewolf_shaped",
    1,
    "Werewolf team win/loss (+1/-1) on each seat's last turn, minus 0.1 per invalid or defaulted turn and "
    "0.1 per over-length response (>1024 tokens or >6000 chars), plus 0.2 x char-similarity of "
    "<predict_next> to the seat's next observation",
    WEREWOLF_GAMES,
    SpecConfig(penalties=_SHAPED_PENALTIES, prediction=_SHAPED_PREDICTION),
)
@register_spec(
    "werewolf_outcome",
    1,
    "Werewolf team win/loss (+1/-1, draw/aborted 0) on each seat's last turn",
    WEREWOLF_GAMES,
    SpecConfig(outcome=OutcomeConfig()),
)
def score_werewolf(trajectory: trajectory_pb2.Trajectory, config: SpecConfig) -> ScoreResult:
    """Outcomes from ``trajectory.outcomes`` (every acting seat must have one); role rewards (``roles``
    config, zero in every spec but ``werewolf_role``) from the applied actions and those outcomes' teams."""
    if config.outcome.no_deal:
        raise ScoreError("outcome.no_deal prices a scenario negotiation without a deal; Werewolf has none")
    results, notes = outcome.werewolf_results(trajectory)
    _check_seats(trajectory, set(results), "trajectory.outcomes")
    terminal: dict[int, dict[str, float]] = {}
    if config.outcome.survival_bonus:
        alive = outcome.alive_seats(trajectory)
        if alive is None:
            notes["survival"] = "skipped: no SeatOutcome.alive recorded"
        else:
            terminal = {s: {"survival": config.outcome.survival_bonus} for s in results if s in alive}
    teams = {s: r.team for s, r in results.items()}
    extra = roles.role_components(trajectory.turns, teams, config.roles)
    return compose(trajectory, results, config, terminal, notes, extra)


# --- scenarios --------------------------------------------------------------------------------------------


_NO_DEAL = -0.5


@register_spec(
    "bargaining_selfplay",
    1,
    "scenario_shaped@1 (verifier +1/-1/0 on each seat's last turn, -0.1 per invalid or defaulted turn and "
    "per over-length response, 0.2 x <predict_next> char-similarity) plus no_deal -0.5 for both seats when "
    "the negotiation ends without a deal (REJECT or the turn limit): a deal inside the seat's target +1 > "
    "a deal between target and reservation 0 > no deal -0.5 > a deal beyond the reservation -1. For "
    "self-play, where a no-deal draw (0) beat most deals and one policy in both seats learned never to deal",
    (get_family("bargaining").game_id,),
    SpecConfig(
        outcome=OutcomeConfig(no_deal=_NO_DEAL), penalties=_SHAPED_PENALTIES, prediction=_SHAPED_PREDICTION
    ),
)
@register_spec(
    "scenario_shaped",
    1,
    "Scenario verifier result (+1/-1/0) on each seat's last turn, minus 0.1 per invalid or defaulted turn "
    "and 0.1 per over-length response, plus 0.2 x char-similarity of <predict_next> to the next observation",
    SCENARIO_GAMES,
    SpecConfig(penalties=_SHAPED_PENALTIES, prediction=_SHAPED_PREDICTION),
)
@register_spec(
    "scenario_verified",
    1,
    "Scenario verifier result (+1 win, -1 loss, 0 draw) re-computed from the transcript, on each seat's "
    "last turn",
    SCENARIO_GAMES,
)
def score_scenario(trajectory: trajectory_pb2.Trajectory, config: SpecConfig) -> ScoreResult:
    """Outcomes re-verified from ``Trajectory.scenario`` and the applied turns (``outcome.transcript_of``)."""
    scenario = outcome.scenario_of(trajectory)
    seats = set(range(scenario.num_players))
    _check_seats(trajectory, seats, f"the scenario's seats 0..{scenario.num_players - 1}")
    for o in trajectory.outcomes:
        if o.seat not in seats:
            raise ScoreError(f"trajectory.outcomes has seat {o.seat}, which is not in the scenario")
    results, verdict, notes = outcome.scenario_results(trajectory, scenario)
    notes["verifier_details"] = json.dumps(verdict.details, sort_keys=True, default=str)
    terminal: dict[int, dict[str, float]] = {}
    extra: dict[int, dict[str, float]] = {}
    value = config.outcome.no_deal
    if value and outcome.ended_without_deal(scenario, verdict):
        # Credited as the outcome is (the verifier's draw stays the seat's outcome; this is on top of it).
        for seat in results:
            spread = seat_credit(trajectory.turns, seat, value, config)
            if not spread:
                terminal[seat] = {"no_deal": value}
            for p, amount in spread.items():
                extra[p] = {"no_deal": amount}
    return compose(trajectory, results, config, terminal, notes, extra)
