"""Configuration of a reward spec: one pydantic model per concern, all ``extra="forbid"``.

Why strict models: a spec is loaded from YAML written by people, and a typo such as ``gama: 0.9``
silently falling back to a default would change training rewards without anyone noticing. Every spec
shares the same ``SpecConfig`` shape, so a spec is "a score function plus a config" and variants are
config overrides of a registered spec (see ``specs.load_specs``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CreditMode = Literal["terminal", "uniform", "discounted"]
SimilarityMetric = Literal["char_ratio", "token_f1"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OutcomeConfig(_Strict):
    """Magnitudes of a seat's result. Lookup order for a win (loss likewise): ``role_win[role]``, then
    ``team_win[team]``, then ``win``; so "wolves' win is worth 1.5" is ``team_win: {wolves: 1.5}``."""

    win: float = 1.0
    loss: float = -1.0
    draw: float = 0.0
    aborted: float = 0.0
    team_win: dict[str, float] = Field(default_factory=dict)
    team_loss: dict[str, float] = Field(default_factory=dict)
    role_win: dict[str, float] = Field(default_factory=dict)
    role_loss: dict[str, float] = Field(default_factory=dict)
    #: Terminal-only bonus for seats whose ``SeatOutcome.alive`` is true; skipped, with a note, when no
    #: outcome records survival (games without elimination).
    survival_bonus: float = 0.0
    #: Added to every seat of a scenario whose negotiation ended without a deal (bargaining: REJECT or the
    #: turn limit, which the verifier calls a draw: both keep their BATNA), as a ``no_deal`` component
    #: credited like the outcome; 0 adds nothing. Why: in self-play a no-deal draw (0) beats most deals a
    #: weak policy strikes (one side's -1), so both seats of one policy learned never to deal
    #: (``bargaining_selfplay@1``). Only families whose verifier records a deal have it (``outcome.NO_DEAL_KEYS``).
    no_deal: float = 0.0


class CreditConfig(_Strict):
    """How a seat's outcome is spread over its turns (see ``credit.assign``)."""

    mode: CreditMode = "terminal"
    gamma: float = Field(default=0.95, gt=0.0, le=1.0)


class PenaltyConfig(_Strict):
    """Per-turn penalties; magnitudes are positive and the components they produce are negative."""

    #: For a turn with ``valid`` false or ``defaulted`` true.
    invalid: float = Field(default=0.0, ge=0.0)
    #: Tags every response must contain, e.g. ``["think", "predict_next"]`` (checked as ``</tag>``).
    required_tags: list[str] = Field(default_factory=list)
    #: Per missing tag, per turn.
    missing_tag: float = Field(default=0.0, ge=0.0)
    #: A response is over-length when it has more response tokens than ``max_tokens`` or more
    #: characters than ``max_chars`` (either limit may be None).
    max_tokens: int | None = Field(default=None, ge=1)
    max_chars: int | None = Field(default=None, ge=1)
    over_length: float = Field(default=0.0, ge=0.0)


class PredictionConfig(_Strict):
    """Bonus ``weight * similarity(prediction, next observation of the same seat)``; 0 disables it."""

    weight: float = 0.0
    metric: SimilarityMetric = "char_ratio"
    #: Compare at most this many characters: the prediction's head and the observation's tail (where a
    #: growing observation puts what is new). Why a cap: difflib is quadratic-ish, ~0.4 s for 1k x 10k chars.
    max_chars: int | None = Field(default=2000, ge=1)


class RoleConfig(_Strict):
    """Werewolf per-turn decision rewards (see ``roles.role_components``): each weight ``w`` is paid as
    +w or -w on the turn where the seat made the decision, judged by the target's team from
    ``trajectory.outcomes``; 0 disables a rule. Why small weights: the team outcome (+-1) must stay what
    the policy optimises; these only give a signal before the first win (a village at 0 wins has none)."""

    #: Day vote (``vote``): village seat voting a wolf +w, a village seat -w; a wolf the mirror.
    vote: float = Field(default=0.0, ge=0.0)
    #: Seer inspection (``inspect``) of a wolf +w (nothing for a village target: the seer cannot know).
    inspect: float = Field(default=0.0, ge=0.0)
    #: Witch poison (``poison``) on a wolf +w, on a village seat -w.
    poison: float = Field(default=0.0, ge=0.0)
    #: Witch save (``save``; the engine offers it only on the wolves' victim) of a village seat +w, of a
    #: wolf -w.
    save: float = Field(default=0.0, ge=0.0)
    #: Hunter / wolf king shot (``shoot``): at the other team +w, at the own team -w.
    shoot: float = Field(default=0.0, ge=0.0)


class SpecConfig(_Strict):
    outcome: OutcomeConfig = Field(default_factory=OutcomeConfig)
    credit: CreditConfig = Field(default_factory=CreditConfig)
    penalties: PenaltyConfig = Field(default_factory=PenaltyConfig)
    prediction: PredictionConfig = Field(default_factory=PredictionConfig)
    roles: RoleConfig = Field(default_factory=RoleConfig)

    def merged(self, overrides: dict[str, Any]) -> SpecConfig:
        """A new config with ``overrides`` deep-merged over this one (validated again)."""
        return SpecConfig.model_validate(_deep_merge(self.model_dump(), overrides))


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key in SpecConfig.model_fields:
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out
