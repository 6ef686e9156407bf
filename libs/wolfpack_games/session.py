"""The session rules of one episode: who plays each seat, whose turn it is, and what an answer does.

Every place that hosts an episode plays it by these rules: the environment service's ``EpisodeManager``
(``wolfpack_environment.sessions``, which adds tokens, deadlines, limits and spans around them) and the
trainer's in-process environment (``wolfpack_trainer.local_rollout``). Kept here, once, because a seed
must be the same game in both: if either seeded the bots, ordered seats or judged an answer differently,
local training would learn a game the service never plays (``services/trainer/tests/test_same_game.py``
checks it end to end).

The rules:

* Seats not listed are scripted with the default bot; scripted seats play from one
  ``random.Random(seed)`` per episode, in acting-seat order, until a played seat must decide.
* A played seat that must decide gets a turn id, counted per seat (one shared counter would let a seat
  count other seats' private decisions from the gaps); turns of seats no longer acting are dropped.
* An answer is parsed once, before the step (afterwards the phase may have moved on and the same text
  would parse differently); an unparseable text goes to the engine as is, which records the reason. An
  invalid answer keeps the turn id (re-prompt, feedback in the observation) until the engine defaults it.

Pure: no I/O, no clock, no asyncio. A host that must not run a long all-bot stretch in one go (an event
loop) passes ``play_scripted`` a ``stop`` predicate and continues later.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from wolfpack_games.base import Action, GameEnv, get_game, make_game

Bot = Callable[[GameEnv, int, random.Random], Action]
"""A scripted seat: (engine, seat, the episode's bot RNG) -> its action."""

CONTROLLER_NAMES = ("policy", "external", "scripted")
"""How a seat may be played: by a served policy, by an outside agent, or by a scripted bot."""


class SessionSetupError(ValueError):
    """A create request this library cannot start (unknown game, variant or bot, bad options, a seat out
    of range); the message says which. Hosts map it to their own error (the service: INVALID_ARGUMENT)."""


@dataclass
class SeatPlan:
    """How a seat is played: ``"scripted"`` (with ``bot``, "" for the game's default), ``"external"`` or
    ``"policy"``."""

    controller: str
    bot: str = ""
    policy_id: str = ""
    display_name: str = ""


@dataclass(slots=True)
class Applied:
    """What one answer did: ``accepted`` (valid), else ``reason``; ``defaulted`` when the engine applied
    the default action instead; ``action`` the action applied (None after a re-prompt). ``duplicate``:
    a host that makes answers idempotent sets it on the result it repeats for a retry (the service's
    ``ActResult`` is this class: one object per act on its hot path)."""

    accepted: bool
    reason: str
    action: Action | None
    defaulted: bool
    duplicate: bool = False


@dataclass(kw_only=True)
class Session:
    """One started episode under the session rules. Hosts subclass it to add what they need (tokens,
    deadlines, spans); everything the rules read and change is here."""

    episode_id: str
    game_id: str
    variant: str  # resolved: never "" (the game's default variant when the request named none)
    seed: int
    env: GameEnv
    seats: dict[int, SeatPlan]  # every seat of the started game
    bots: dict[int, Bot]  # scripted seats only
    # Seeded with the episode's seed when a scripted seat first moves (None before): a game whose seats are all
    # played never draws from it, and seeding one costs a service ~5 µs per episode created.
    bot_rng: random.Random | None
    open_turns: dict[int, int] = field(default_factory=dict)  # seat -> id of its pending decision
    seat_turns: dict[int, int] = field(default_factory=dict)  # seat -> its own last turn id
    closed: bool = False  # ended by its host before the game was over (aborted) or released

    @property
    def done(self) -> bool:
        return self.closed or self.env.done

    def played_seats(self) -> list[int]:
        """Seats not scripted (each needs a token), in plan order."""
        return [seat for seat, plan in self.seats.items() if plan.controller != "scripted"]

    def play_scripted(self, stop: Callable[[], bool] | None = None) -> bool:
        """Play every due scripted seat until a played seat must decide or the game ends. ``stop`` is asked
        after each move; when it says so the run pauses (returns False) and the host calls again later."""
        env = self.env
        bots = self.bots
        if not bots:
            return True
        rng = self.bot_rng
        if rng is None:  # the first scripted move: no draw happened before, so this is the same stream
            rng = self.bot_rng = random.Random(self.seed)
        moved = True
        while moved and not env.done:
            moved = False
            for seat in env.acting_seats():
                bot = bots.get(seat)
                if bot is not None:
                    env.step_seat(seat, bot(env, seat, rng))
                    moved = True
                    if stop is not None and not env.done and stop():
                        return False
        return True

    def open_due_turns(self) -> list[int]:
        """Give every newly due played seat its next turn id and drop turns that vanished (a seat that died
        or whose phase ended before it acted; all of them once the game is over). Returns the seats whose
        turn was opened now, in seat order (the host starts their deadlines)."""
        acting = self.env.acting_seats()
        open_turns = self.open_turns
        bots = self.bots
        # One pass over the acting seats, no comprehension (each is a call of its own): this runs once
        # per applied answer, and after most answers nothing vanished (the rest of a vote still acts) or
        # one seat is new (the next speaker).
        new: list[int] = []
        kept = 0
        for s in acting:
            if s in open_turns:
                kept += 1
            elif s not in bots:
                new.append(s)
        if kept != len(open_turns):  # some open seat no longer acts (seats are distinct in ``acting``)
            for seat in [s for s in open_turns if s not in acting]:
                del open_turns[seat]
        if len(new) > 1:
            new.sort()
        seat_turns = self.seat_turns
        for seat in new:
            open_turns[seat] = seat_turns[seat] = seat_turns.get(seat, 0) + 1
        return new

    def advance(self) -> None:
        """``play_scripted`` to the end, then ``open_due_turns``: the whole step for a host with no loop to
        keep responsive."""
        self.play_scripted()
        self.open_due_turns()

    def apply(self, seat: int, move: Action | str) -> Applied:
        """Apply ``seat``'s answer to its open turn (the host checked the turn id): parse free text once,
        step, and close the turn when the decision is made (accepted, or defaulted by the engine); an
        invalid answer leaves the turn open under the same id. Does not advance: the host does."""
        env = self.env
        parsed = env.parse(seat, move).action if isinstance(move, str) else move
        info = env.step_seat(seat, parsed if parsed is not None else move)
        if not info:  # the common case, accepted as given (an empty info has no reason, no default)
            del self.open_turns[seat]
            return Applied(True, "", parsed, False)
        reason = str(info.get("invalid_reason", ""))
        defaulted = bool(info.get("defaulted", False))
        accepted = not reason
        applied = info.get("default_action") if defaulted else parsed if accepted else None
        if accepted or defaulted:
            del self.open_turns[seat]
        return Applied(accepted, reason, applied, defaulted)


S = TypeVar("S", bound=Session)


def start_session(
    factory: Callable[..., S],
    *,
    episode_id: str,
    game_id: str,
    variant: str = "",
    seed: int = 0,
    seats: Mapping[int, SeatPlan] | None = None,
    default_bot: str = "",
    language: str = "en",
    options: Mapping[str, Any] | None = None,
    env: GameEnv | None = None,
    **fields: Any,
) -> S:
    """Build and start the engine, plan every seat (unlisted: scripted with ``default_bot`` or the game's)
    and bind the bots; returns ``factory(...)`` (``Session`` or a host's subclass, given its own
    ``fields``). No move is played yet: the host calls ``advance`` (or its own sliced version) once the
    episode is registered. Raises ``SessionSetupError`` naming what is wrong.

    ``env``: an engine of ``game_id``/``variant`` (as ``make_game`` builds it) to start instead of a new
    one, e.g. a host's spare from an episode it released: ``reset``'s contract (same seed and options,
    same game) makes a used engine start the same game as a fresh one."""
    try:
        spec = get_game(game_id)
        if env is None:
            env = make_game(game_id, variant)
    except KeyError as exc:
        raise SessionSetupError(str(exc.args[0])) from None
    variant = variant or spec.default_variant
    bot_name = default_bot or spec.default_bot
    reset_options: dict[str, Any] = dict(options or {})
    if language and language != "en":  # "en" is every game's default: skip the config rebuild
        reset_options["language"] = language
    try:
        env.start(seed=seed, options=reset_options)
    except Exception as exc:  # bad option values surface as any of Key/Value/Type/Attribute errors
        raise SessionSetupError(f"cannot start {game_id}/{variant}: {exc}") from None
    # Seats come from the started game (options such as ``roles`` may change the count).
    n = len(env.possible_agents)
    plans = dict(seats or {})
    for seat, plan in plans.items():
        if not 0 <= seat < n:
            raise SessionSetupError(f"seat {seat} out of range for {game_id}/{variant} with {n} seats")
        if plan.controller not in CONTROLLER_NAMES:
            raise SessionSetupError(f"seat {seat}: controller must be one of {', '.join(CONTROLLER_NAMES)}")
    for seat in range(n):
        plans.setdefault(seat, SeatPlan("scripted", bot=bot_name))
    bots: dict[int, Bot] = {}
    for seat, plan in plans.items():
        if plan.controller == "scripted":
            name = plan.bot or bot_name
            if name not in spec.bots:
                raise SessionSetupError(f"unknown bot {name!r} for {game_id}; bots: {', '.join(spec.bots)}")
            bots[seat] = spec.bots[name]
    return factory(
        episode_id=episode_id, game_id=game_id, variant=variant, seed=seed, env=env, seats=plans, bots=bots,
        bot_rng=None, **fields,
    )  # fmt: skip
