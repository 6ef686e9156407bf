"""``ScenarioGame``: any scenario family behind the shared ``GameEnv`` API.

Actions are messages. ``parse(seat, text)`` turns free text into ``Action("final", text=...)`` when it
makes a formal statement and ``Action("say", text=...)`` otherwise; structured actions must use the
matching kind. Invalid messages (empty text, malformed or contradictory statements, statements not
allowed now) re-prompt the seat up to ``max_reprompts`` times with the reason as feedback; then the
family's default message is applied (``(pass)``, or the family's safe move in simultaneous rounds) and
``infos[seat]`` carries ``invalid_reason``/``defaulted``/``penalty``.

The transcript of raw texts is the single source of truth: the final outcome is
``verify(scenario, transcript)``, the same pure function the reward service runs.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

from wolfpack_games.base import (
    Action,
    Event,
    GameEnv,
    LegalAction,
    Observation,
    ParseResult,
    StepResult,
)
from wolfpack_games.scenarios.families import Family, Tracker, get_family
from wolfpack_games.scenarios.models import Difficulty, Scenario, VerificationResult
from wolfpack_games.scenarios.parsing import ParsedMessage
from wolfpack_games.scenarios.verifiers import verify

DEFAULT_MAX_REPROMPTS = 2


class ScenarioGame(GameEnv):
    """One family's games. ``reset(options={"scenario": ...})`` plays a given scenario; otherwise the
    scenario is generated from ``(family, seed, difficulty)``."""

    game_id: ClassVar[str] = "scenario"
    family_name: ClassVar[str] = ""

    def __init__(
        self,
        variant: str = "medium",
        *,
        scenario: Scenario | Mapping[str, Any] | None = None,
        max_reprompts: int = DEFAULT_MAX_REPROMPTS,
    ) -> None:
        self.family: Family = get_family(self.family_name)
        if variant not in self.family.seats:
            raise KeyError(f"unknown variant {variant!r}; variants: {', '.join(self.family.seats)}")
        self.difficulty: Difficulty = variant  # type: ignore[assignment]
        self.max_reprompts = max_reprompts
        self._given = scenario
        self.possible_agents = list(range(self.family.seats[self.difficulty]))
        self.events = []
        self.scenario: Scenario | None = None
        self.transcript: list[tuple[int, str]] = []
        self.result: VerificationResult | None = None
        self._tracker: Tracker | None = None
        self._reprompts: dict[int, int] = {}
        self._feedback: dict[int, str] = {}
        self.rng = random.Random(0)

    # ------------------------------------------------------------------ setup
    @property
    def tracker(self) -> Tracker:
        if self._tracker is None:
            raise RuntimeError("call reset() first")
        return self._tracker

    @property
    def active_scenario(self) -> Scenario:
        """The scenario being played (``scenario`` once ``reset`` chose it)."""
        if self.scenario is None:
            raise RuntimeError("call reset() first")
        return self.scenario

    def reset(
        self, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[int, Observation], dict[int, dict[str, Any]]]:
        from wolfpack_games.scenarios.generator import generate_scenario

        opts = dict(options or {})
        given = opts.get("scenario", self._given)
        difficulty = opts.get("difficulty", self.difficulty)
        if given is None:
            scenario = generate_scenario(self.family_name, seed or 0, difficulty)
        elif isinstance(given, Scenario):
            scenario = given
        else:
            scenario = Scenario.model_validate(dict(given))
        if scenario.family != self.family_name:
            raise ValueError(f"scenario family {scenario.family!r} does not match game {self.game_id}")
        reprompts = opts.get("max_reprompts", self.max_reprompts)
        if isinstance(reprompts, bool) or not isinstance(reprompts, int) or not 0 <= reprompts <= 5:
            raise ValueError(f"max_reprompts={reprompts!r} is out of range; it must be an integer in [0, 5]")
        self.max_reprompts = reprompts
        self.scenario = scenario
        self.rng = random.Random(seed)
        self.possible_agents = list(range(scenario.num_players))
        self._tracker = self.family.tracker(scenario)
        self.transcript = []
        self.result = None
        self._reprompts = {s: 0 for s in self.possible_agents}
        self._feedback = {}
        self.events = []
        self._event("start", "public", text=f"{scenario.id}: {scenario.public}")
        for p in scenario.players:
            self._event("private", f"seat:{p.seat}", actor=p.seat, text=p.brief)
        obs = {s: self.observe(s) for s in self.possible_agents}
        infos: dict[int, dict[str, Any]] = {
            s: {"scenario_id": scenario.id, "role": scenario.players[s].role} for s in self.possible_agents
        }
        return obs, infos

    def _event(
        self, kind: str, channel: str, actor: int = -1, text: str = "", turns: int | None = None
    ) -> None:
        """``turns``: messages recorded before the one this event reports (default: all recorded so far)."""
        if turns is None:
            turns = self._tracker.turns if self._tracker is not None else 0
        n = max(1, len(self.possible_agents))
        self.events.append(
            Event(
                index=len(self.events),
                kind=kind,
                channel=channel,
                actor=actor,
                text=text,
                phase=self.family_name,
                round=turns // n + 1,
            )
        )

    # ------------------------------------------------------------------ rules
    def acting_seats(self) -> list[int]:
        return self.tracker.acting()

    def legal_actions(self, seat: int) -> tuple[LegalAction, ...]:
        if seat not in self.tracker.acting():
            return ()
        return tuple(LegalAction(kind, needs_text=True) for kind in self.tracker.legal_kinds(seat))

    def _validate(self, seat: int, action: Action) -> tuple[ParsedMessage | None, str]:
        tracker = self.tracker
        if seat not in tracker.acting():
            return None, "it is not your turn"
        msg = self.family.parse(self.active_scenario, action.text)
        error = msg.error or tracker.check(seat, msg)
        if error:
            return None, error
        kind = "final" if msg.keyword else "say"
        if action.kind not in ("say", "final"):
            return None, f"unknown action kind {action.kind!r}; use 'say' or 'final'"
        if action.kind != kind:
            return None, (
                "a 'final' action must contain a formal statement"
                if action.kind == "final"
                else "a 'say' action must not contain a formal statement; use 'final'"
            )
        if kind not in tracker.legal_kinds(seat):
            return None, "a formal statement is required now (" + self.family.instructions(
                self.active_scenario, seat
            ) + ")"
        return msg, ""

    def parse(self, seat: int, text: str) -> ParseResult:
        msg = self.family.parse(self.active_scenario, text)
        error = msg.error
        if not error and seat in self.tracker.acting():
            error = self.tracker.check(seat, msg)
        if error:
            return ParseResult(None, error)
        return ParseResult(Action("final" if msg.keyword else "say", text=text))

    def default_action(self, seat: int) -> Action:
        text = self.tracker.default_text(seat)
        msg = self.family.parse(self.active_scenario, text)
        return Action("final" if msg.keyword else "say", text=text)

    def step(self, actions: Mapping[int, Action | str]) -> StepResult:
        infos: dict[int, dict[str, Any]] = {}
        if self.done:
            return self._result(infos)
        acting = self.tracker.acting()
        for seat in sorted(actions):
            if seat not in acting:
                infos[seat] = {"invalid_reason": "it is not your turn", "ignored": True}
        for seat in acting:
            if seat not in actions:
                continue
            raw = actions[seat]
            action = raw if isinstance(raw, Action) else Action("say", text=raw)
            if isinstance(raw, str):
                parsed = self.parse(seat, raw)
                if parsed.action is not None:
                    action = parsed.action
            msg, error = self._validate(seat, action)
            if msg is None:
                self._reprompts[seat] += 1
                self._event("invalid", f"seat:{seat}", actor=seat, text=error)
                if self._reprompts[seat] <= self.max_reprompts:
                    self._feedback[seat] = f"Invalid: {error}. Try again."
                    infos[seat] = {"invalid_reason": error, "reprompt": self._reprompts[seat]}
                    continue
                action = self.default_action(seat)
                msg, default_error = self._validate(seat, action)
                if msg is None:  # a family bug, not a player error
                    raise RuntimeError(f"default action of {self.game_id} is invalid: {default_error}")
                infos[seat] = {
                    "invalid_reason": error,
                    "defaulted": True,
                    "penalty": True,
                    "default_action": action,
                }
            self._apply(seat, action.text, msg)
        if self.tracker.done and self.result is None:
            self.result = verify(self.active_scenario, self.transcript)
            self._event("outcome", "public", text=self.result.reason)
        return self._result(infos)

    def _apply(self, seat: int, text: str, msg: ParsedMessage) -> None:
        self._reprompts[seat] = 0
        self._feedback.pop(seat, None)
        self.transcript.append((seat, text))
        # the round a message belongs to is the one in which it was played, before record() counts it
        before = self.tracker.turns
        notes = self.tracker.record(seat, msg)
        kind = "final" if msg.keyword else "say"
        if msg.keyword in self.family.sealed:
            self._event(kind, "public", actor=seat, text=redact(msg.visible, msg.keyword), turns=before)
            self._event(kind, f"seat:{seat}", actor=seat, text=msg.visible, turns=before)
        else:
            self._event(kind, "public", actor=seat, text=msg.visible, turns=before)
        for note in notes:
            self._event("note", "public", text=note, turns=before)

    def _result(self, infos: dict[int, dict[str, Any]]) -> StepResult:
        done = self.done
        out = self.outcome() if done else {}
        seats = self.possible_agents
        for s in seats:
            infos.setdefault(s, {})
        if done and self.result is not None:
            for s in seats:
                infos[s]["outcome"] = out[s]
                infos[s]["reason"] = self.result.reason
        return StepResult(
            observations={s: self.observe(s) for s in seats},
            rewards={s: float(out.get(s, 0)) for s in seats},
            terminations={s: done for s in seats},
            truncations={s: False for s in seats},
            infos=infos,
        )

    # ------------------------------------------------------------------ results
    @property
    def done(self) -> bool:
        return self._tracker is not None and self._tracker.done

    def outcome(self) -> dict[int, int]:
        if self.result is None:
            if not self.done:
                return {s: 0 for s in self.possible_agents}
            self.result = verify(self.active_scenario, self.transcript)
        return dict(self.result.outcomes)

    def winner(self) -> str:
        if not self.done:
            return ""
        winners = [s for s, v in self.outcome().items() if v > 0]
        return ",".join(self.active_scenario.players[s].role for s in winners)

    def role(self, seat: int) -> str:
        return self.active_scenario.players[seat].role

    def team(self, seat: int) -> str:
        return self.active_scenario.players[seat].role

    # ------------------------------------------------------------------ observations
    def observe(self, seat: int) -> Observation:
        tracker = self.tracker
        acting = tracker.acting()
        return Observation(
            seat=seat,
            phase=self.family_name,
            round=tracker.turns // max(1, tracker.n) + 1,
            your_turn=seat in acting,
            done=self.done,
            role=self.active_scenario.players[seat].role,
            legal_actions=self.legal_actions(seat),
            turn_id=tracker.turns,
            feedback=self._feedback.get(seat, ""),
            _render=lambda: render_observation(self, seat),
        )


def redact(visible: str, keyword: str) -> str:
    """Hide a sealed statement from other seats, keeping the rest of the message."""
    kept = [
        line
        for line in visible.splitlines()
        if keyword.replace("_", "").lower() not in line.replace("_", "").replace(" ", "").lower()
    ]
    return "\n".join([*kept, "[sealed decision submitted]"]).strip()


def _message_for(game: ScenarioGame, viewer: int | None, seat: int, msg: ParsedMessage) -> str:
    if viewer is not None and viewer != seat and msg.keyword in game.family.sealed:
        return redact(msg.visible, msg.keyword)
    return msg.visible


def render_observation(game: ScenarioGame, seat: int) -> str:
    """English observation for ``seat``: public facts, only this seat's private brief, the dialogue."""
    sc, tracker = game.active_scenario, game.tracker
    me = sc.players[seat]
    lines = [
        f"{game.family.title} — you are {me.name} ({me.role}).",
        sc.public,
        f"Your private information (others do not see it): {me.brief}",
        f"How to act: {game.family.instructions(sc, seat)}",
        "",
        "Conversation so far:" if tracker.history else "Nobody has spoken yet.",
    ]
    notes = _notes_by_turn(game)
    for i, (s, msg) in enumerate(tracker.history):
        text = _message_for(game, seat, s, msg).replace("\n", "\n    ")
        lines.append(f"  [{i + 1}] {sc.name(s)} ({sc.players[s].role}): {text}")
        lines.extend(f"  * {note}" for note in notes.get(i + 1, []))
    status = tracker.status()
    if status:
        lines.append(status)
    if game.done and game.result is not None:
        lines.append(f"Game over: {game.result.reason}. Your outcome: {game.result.outcomes[seat]:+d}.")
    elif seat in tracker.acting():
        lines.append(f"It is your turn ({tracker.turns_left} messages left in the game).")
    else:
        waiting = ", ".join(sc.name(s) for s in tracker.acting())
        lines.append(f"Waiting for {waiting}.")
    feedback = game._feedback.get(seat)
    if feedback:
        lines.append(feedback)
    return "\n".join(lines)


def _notes_by_turn(game: ScenarioGame) -> dict[int, list[str]]:
    """Public notes keyed by the number of messages recorded when they were emitted."""
    out: dict[int, list[str]] = {}
    count = 0
    for ev in game.events:
        if ev.kind in ("say", "final") and ev.channel == "public":
            count += 1
        elif ev.kind == "note":
            out.setdefault(count, []).append(ev.text)
    return out


def render_transcript(game: ScenarioGame) -> str:
    """A readable record of a finished (or running) game for the CLI, ending with the verified outcome.

    Deterministic: the same seed and bots give byte-identical text.
    """
    sc, tracker = game.active_scenario, game.tracker
    lines = [
        f"{game.game_id} · scenario {sc.id} · {sc.difficulty} · split {sc.split}",
        f"Theory: {game.family.theory}",
        sc.public,
        "",
        "Private information:",
    ]
    lines.extend(f"  {p.name} ({p.role}): {p.brief}" for p in sc.players)
    lines.append("")
    notes = _notes_by_turn(game)
    for i, (s, msg) in enumerate(tracker.history):
        text = msg.visible.replace("\n", "\n      ")
        lines.append(f"[{i + 1:>2}] {sc.name(s)} ({sc.players[s].role}): {text}")
        lines.extend(f"     * {note}" for note in notes.get(i + 1, []))
    lines.append("")
    if game.done:
        result = verify(sc, game.transcript)
        lines.append(f"Verified outcome: {result.reason}")
        for p in sc.players:
            lines.append(f"  {p.name} ({p.role}): {result.outcomes[p.seat]:+d}")
    else:
        lines.append("Game not finished.")
    return "\n".join(lines) + "\n"


def game_class(family: str) -> type[ScenarioGame]:
    """A ``ScenarioGame`` subclass bound to one family (``game_id`` is a class attribute in the API)."""
    fam = get_family(family)

    class _Game(ScenarioGame):
        game_id = fam.game_id
        family_name = fam.name

    _Game.__name__ = _Game.__qualname__ = "".join(w.title() for w in fam.name.split("_")) + "Game"
    return _Game


def render_scenario(scenario: Scenario, *, reveal_private: bool = True) -> str:
    """Human-readable scenario card for ``wolfpack scenarios show`` (private briefs only when asked)."""
    family = get_family(scenario.family)
    lines = [
        f"{scenario.id}  [{scenario.family} · {scenario.difficulty} · {scenario.split}]",
        f"Game: {family.game_id}   Theory: {family.theory}   Template: {scenario.template}",
        f"Tags: {', '.join(scenario.tags)}   Max turns: {scenario.max_turns}",
        scenario.public,
    ]
    for p in scenario.players:
        brief = p.brief if reveal_private else "(hidden)"
        lines.append(f"  seat {p.seat} {p.name} ({p.role}): {brief}")
    return "\n".join(lines) + "\n"
