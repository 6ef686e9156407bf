"""The pure Werewolf engine: a seeded state machine over night, dawn and day phases.

Why it looks the way it does: the trainer needs >= 100k scripted actions/s per core, so the hot path
(``step`` -> validate -> apply -> next phase) uses plain lists/ints, legal-action tuples computed once
per phase, and never renders text; observation text is produced lazily from the event log (only the
events that existed when the observation was made, filtered by channel), so hidden information can
only reach a seat through an event on a channel that seat may read.

Phase order: night (wolf chat -> wolf kill vote -> guard -> seer -> witch) -> dawn (deaths announced,
win check, last words / badge / hunter shot) -> [day 1: sheriff election] -> discussion -> vote ->
exile (win check, last words, badge, hunter or wolf-king shot) -> next night.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
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
from wolfpack_games.werewolf import render as _render
from wolfpack_games.werewolf.models import (
    GUARD,
    HUNTER,
    K_BADGE,
    K_ELECT,
    K_INSPECT,
    K_KILL,
    K_PASS,
    K_POISON,
    K_PROTECT,
    K_SAVE,
    K_SHOOT,
    K_SPEAK,
    K_VOTE,
    PH_BADGE,
    PH_DISCUSSION,
    PH_GAME_OVER,
    PH_GUARD,
    PH_LAST_WORDS,
    PH_SEER,
    PH_SHERIFF,
    PH_SHOOT,
    PH_VOTE,
    PH_WITCH,
    PH_WOLF_CHAT,
    PH_WOLF_VOTE,
    SEER,
    SPECIAL_ROLES,
    TEAM_VILLAGE,
    TEAM_WOLVES,
    VILLAGER,
    WITCH,
    WOLF_KING,
    WOLF_ROLES,
    WerewolfConfig,
    apply_overrides,
    make_config,
    shared_preset,
    team_of,
)
from wolfpack_games.werewolf.parser import parse_action

PUBLIC = "public"
WOLVES_CHANNEL = "team:wolves"
SYSTEM = "system"

_SPEAK_LEGAL: tuple[LegalAction, ...] = (LegalAction(K_SPEAK, (), True),)
_PASS_LEGAL = LegalAction(K_PASS)

_NIGHT_SUBPHASES = frozenset({PH_WOLF_CHAT, PH_WOLF_VOTE, PH_GUARD, PH_SEER, PH_WITCH})
_WOLF_PHASES = frozenset({PH_WOLF_CHAT, PH_WOLF_VOTE})

# Death causes (engine-internal; the public only ever sees "night", "exile" or "shot").
CAUSE_WOLF = "wolf"
CAUSE_POISON = "poison"
CAUSE_EXILE = "exile"
CAUSE_SHOT = "shot"

# Follow-up kinds queued after deaths.
_F_LAST_WORDS = 0
_F_BADGE = 1
_F_SHOT = 2


@dataclass(slots=True)
class Knowledge:
    """Everything one seat may know, as structures (what heuristic bots use instead of hidden state).

    Public: ``alive``, ``sheriff``, ``revealed`` (roles the rules revealed), ``seer_claims`` (public
    "I am the seer, player X is a werewolf/good" claims), ``votes`` (day, voter, target; -1 abstain).
    Private, empty/-1 unless the seat's role grants it: ``wolf_teammates``/``wolf_target`` (wolves),
    ``seer_results`` (seer), ``night_victim``/``save_left``/``poison_left`` (witch),
    ``last_protected`` (guard). ``known_roles`` = own role + teammates + revealed (+ all at the end).
    ``revealed``, ``seer_claims`` and ``votes`` are shared immutable snapshots: do not mutate them.
    """

    seat: int
    role: str
    team: str
    phase: str
    day: int
    alive: tuple[bool, ...]
    sheriff: int
    known_roles: dict[int, str]
    revealed: Mapping[int, str]
    wolf_teammates: tuple[int, ...] = ()
    wolf_target: int = -1
    seer_results: dict[int, str] = field(default_factory=dict)
    night_victim: int = -1
    save_left: bool = False
    poison_left: bool = False
    last_protected: int = -1
    seer_claims: Mapping[int, Mapping[int, str]] = field(default_factory=dict)
    votes: tuple[tuple[int, int, int], ...] = ()


def _claim_scan(text: str) -> dict[int, str] | None:
    """Parse a public seer claim ("I am the seer ... Player 3 is a werewolf" / "我是预言家…3号是狼人").

    Returns {0-based seat: "werewolf"|"good"} or None when the text makes no seer claim.
    """
    import re

    low = text.lower()
    if "i am the seer" in low or "i'm the seer" in low:
        pairs = re.findall(r"player\s*(\d{1,2})\s*is\s*(?:a\s+)?(werewolf|good)", low)
    elif "我是预言家" in text:
        pairs = [
            (n, "werewolf" if r == "狼人" else "good")
            for n, r in re.findall(r"(\d{1,2})号是(狼人|好人)", text)
        ]
    else:
        return None
    return {int(n) - 1: r for n, r in pairs}


class WerewolfEnv(GameEnv):
    """Werewolf for 3..20 seats. Build with ``WerewolfEnv(variant="6p", **options)`` or ``make_game``.

    ``reset(seed, options)`` re-applies option overrides on top of the constructor's config.
    ``step`` returns observations for the seats that must act next (every seat once the game is over);
    ``observe(seat)`` gives any seat's view at any time.
    """

    game_id: ClassVar[str] = "werewolf_v1"

    def __init__(self, variant: str = "6p", config: WerewolfConfig | None = None, **options: Any) -> None:
        if config is None and not options:
            self.base_config = shared_preset(variant)
        else:
            base = config if config is not None else make_config(variant)
            self.base_config = apply_overrides(base, options) if options else base.validate()
        self.config = self.base_config
        self.variant = variant
        n = self.config.n_players
        self.possible_agents = list(range(n))
        self._ev: list[tuple[int, str, str, int, int, str, str, int]] = []
        self._events: list[Event] = []
        self.action_log: list[dict[int, Action | str]] = []
        self._done = True
        self._setup_for: WerewolfConfig | None = None
        self._base_roles: list[str] = []
        self._counts_text = ""
        self.start(seed=0)

    # --- setup ---------------------------------------------------------------------------------------

    def reset(
        self, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[int, Observation], dict[int, dict[str, Any]]]:
        self.start(seed, options)
        obs = {seat: self.observe(seat) for seat in self.possible_agents}
        return obs, {seat: {} for seat in self.possible_agents}

    def start(self, seed: int | None = None, options: Mapping[str, Any] | None = None) -> None:
        cfg = apply_overrides(self.base_config, options) if options else self.base_config
        self.config = cfg
        self.seed = seed
        self.rng = random.Random(seed)
        n = cfg.n_players
        self.n = n
        self.possible_agents = list(range(n))
        if self._setup_for is not cfg:  # per-config constants, computed once per config object
            self._setup_for = cfg
            base_roles = cfg.role_list()
            self._base_roles = base_roles
            self._counts_text = ",".join(f"{r}:{c}" for r, c in _role_counts(base_roles))
        roles = list(self._base_roles)
        if not cfg.seat_roles:
            self.rng.shuffle(roles)
        self.roles: list[str] = roles
        self.is_wolf: list[bool] = [r in WOLF_ROLES for r in roles]
        self.wolves: tuple[int, ...] = tuple(i for i in range(n) if self.is_wolf[i])
        self.alive: list[bool] = [True] * n
        self._ev = []
        self._events = []
        # The per-seat prompt state of this game (``render._GameText``), built on the first prompt.
        self._prompts: Any = None
        self.action_log = []
        self.day = 0
        self.phase = ""
        self._done = False
        self._winner = ""
        self._truncated = False
        self._turn = 0
        self._acting: list[int] = []
        self._legal: dict[int, tuple[LegalAction, ...]] = {}
        self._queue: list[int] = []
        self._after: Callable[[], None] = self._noop
        self._ballots: dict[int, int] = {}
        self._voters: tuple[int, ...] = ()
        self._revote = False
        self._attempts: list[int] = [0] * n
        self._feedback: list[str] = [""] * n
        self._revealed: dict[int, str] = {}
        self._seer_results: dict[int, str] = {}
        self._seer_claims: dict[int, dict[int, str]] = {}  # replaced, never mutated, on change
        self._votes: tuple[tuple[int, int, int], ...] = ()
        self.sheriff = -1
        self._sheriff_done = not cfg.sheriff
        self._save_left = True
        self._poison_left = True
        self._last_protected = -1
        self._wolf_target = -1
        self._guard_target = -1
        self._saved = False
        self._poison_target = -1
        self._followups: list[tuple[int, int, str]] = []
        self._cont: Callable[[], None] = self._noop
        self._sheriff_weight = int(cfg.sheriff_vote_weight * 2)
        self._seat_of = {r: i for i, r in enumerate(roles) if r in SPECIAL_ROLES}
        self._has_villagers = VILLAGER in roles
        self._has_specials = bool(self._seat_of)

        self._emit("setup", SYSTEM, text=",".join(roles))
        self._emit("game_start", PUBLIC, text=self._counts_text)
        for seat in range(n):
            self._emit("role", f"seat:{seat}", actor=seat, text=roles[seat])
        if self.wolves:
            self._emit("wolf_team", WOLVES_CHANNEL, text=",".join(map(str, self.wolves)))
        self._start_night()

    @staticmethod
    def _noop() -> None:
        return None

    def close(self) -> None:
        # ``_after``/``_cont`` hold bound methods (the engine referring to itself): drop the cycle.
        self._after = self._cont = WerewolfEnv._noop

    def _emit(self, kind: str, channel: str, actor: int = -1, target: int = -1, text: str = "") -> None:
        # Plain tuples in the hot path; ``events`` turns them into ``Event`` objects on access.
        ev = self._ev
        ev.append((len(ev), kind, channel, actor, target, text, self.phase, self.day))

    @property  # type: ignore[override]
    def events(self) -> list[Event]:
        """The full event log as :class:`Event` objects (materialised lazily, then cached)."""
        cache = self._events
        ev = self._ev
        if len(cache) < len(ev):
            cache.extend(Event(*t) for t in ev[len(cache) :])
        return cache

    @events.setter
    def events(self, value: list[Event]) -> None:
        self._events = list(value)
        self._prompts = None
        self._ev = [
            (e.index, e.kind, e.channel, e.actor, e.target, e.text, e.phase, e.round) for e in self._events
        ]

    @property
    def n_events(self) -> int:
        return len(self._ev)

    # --- public API ----------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self._done

    @property
    def truncated(self) -> bool:
        return self._truncated

    def acting_seats(self) -> list[int]:
        return list(self._acting)

    def legal_actions(self, seat: int) -> tuple[LegalAction, ...]:
        return self._legal.get(seat, ())

    def role(self, seat: int) -> str:
        return self.roles[seat]

    def team(self, seat: int) -> str:
        return TEAM_WOLVES if self.is_wolf[seat] else TEAM_VILLAGE

    def winner(self) -> str:
        return self._winner

    def outcome(self) -> dict[int, int]:
        if not self._winner:
            return {seat: 0 for seat in self.possible_agents}
        w = self._winner == TEAM_WOLVES
        return {seat: 1 if self.is_wolf[seat] == w else -1 for seat in self.possible_agents}

    def parse(self, seat: int, text: str) -> ParseResult:
        legal = self._legal.get(seat, ())
        if not legal:
            return ParseResult(None, "it is not your turn")
        return parse_action(text, legal, self.n, self.config.max_speech_chars)

    def default_action(self, seat: int) -> Action:
        """Deterministic and legal: silence, pass/abstain, or the lowest-numbered legal target."""
        legal = self._legal.get(seat, ())
        for la in legal:
            if la.kind == K_PASS:
                return Action(K_PASS)
        for la in legal:
            if la.kind == K_SPEAK:
                return Action(K_SPEAK, None, "")
        for la in legal:
            if la.targets:
                targets = la.targets
                if la.kind == K_KILL:  # wolves default to the lowest non-wolf
                    targets = tuple(t for t in targets if not self.is_wolf[t]) or targets
                elif la.kind == K_INSPECT:
                    targets = tuple(t for t in targets if t not in self._seer_results) or targets
                return Action(la.kind, targets[0])
        return Action(K_PASS)

    def observe(self, seat: int) -> Observation:
        legal = self._legal.get(seat, ())
        fb = self._feedback[seat]
        phase = self.phase
        if not legal and phase in _NIGHT_SUBPHASES:
            phase = self._phase_for(seat, legal)
        day = self.day
        done = self._done
        return Observation(
            seat,
            phase,
            day,
            bool(legal),
            done,
            self.roles[seat],
            legal,
            self._turn,
            fb,
            # The renderer looked up now (tests swap it), bound straight to its arguments: no engine
            # frame between ``Observation.text`` and the render.
            partial(_render.render_observation, self, seat, len(self._ev), phase, day, legal, fb, done),
        )

    def _phase_for(self, seat: int, legal: tuple[LegalAction, ...]) -> str:
        """The phase as ``seat`` may see it.

        Like a moderator calling every role every night, whose night turn it is (and so which power
        roles are still alive) is hidden: non-acting seats see ``night`` (wolves see their own phases).
        """
        phase = self.phase
        if not legal and phase in _NIGHT_SUBPHASES and not (self.is_wolf[seat] and phase in _WOLF_PHASES):
            return "night"
        return phase

    def visible_channels(self, seat: int) -> frozenset[str]:
        """Channels ``seat`` may read. Never widened at the end: the final role reveal is public."""
        chans = {PUBLIC, f"seat:{seat}"}
        if self.is_wolf[seat]:
            chans.add(WOLVES_CHANNEL)
        return frozenset(chans)

    def knowledge(self, seat: int) -> Knowledge:
        """The structured view of what ``seat`` may know now (see :class:`Knowledge`)."""
        role = self.roles[seat]
        revealed = self._revealed
        if self._done:
            known = dict(enumerate(self.roles))
        else:
            known = dict(revealed)
            known[seat] = role
        k = Knowledge(
            seat,
            role,
            team_of(role),
            self._phase_for(seat, self._legal.get(seat, ())),
            self.day,
            tuple(self.alive),
            self.sheriff,
            known,
            revealed,
            seer_claims=self._seer_claims,
            votes=self._votes,
        )
        if self.is_wolf[seat]:
            k.wolf_teammates = tuple(w for w in self.wolves if w != seat)
            for w in self.wolves:
                known[w] = self.roles[w]
            k.wolf_target = self._wolf_target
        elif role == SEER:
            k.seer_results = dict(self._seer_results)
        elif role == WITCH:
            k.save_left = self._save_left
            k.poison_left = self._poison_left
            if self.phase == PH_WITCH:
                k.night_victim = self._wolf_target
        elif role == GUARD:
            k.last_protected = self._last_protected
        return k

    # --- step ----------------------------------------------------------------------------------------

    def step(self, actions: Mapping[int, Action | str]) -> StepResult:
        rewards: dict[int, float] = {}
        return self._result(rewards, self._step(actions, rewards))

    def step_seat(self, seat: int, move: Action | str) -> dict[str, Any]:
        return self._step({seat: move}, {}).get(seat, {})

    def _step(
        self, actions: Mapping[int, Action | str], rewards: dict[int, float]
    ) -> dict[int, dict[str, Any]]:
        infos: dict[int, dict[str, Any]] = {}
        if self._done:
            for seat in actions:
                infos[seat] = {"invalid_reason": "the game is over"}
            return infos
        self._turn += 1
        self.action_log.append(dict(actions))
        acting = self._acting
        matched = 0
        for seat in acting[0:1] if len(acting) == 1 else tuple(acting):
            if seat not in actions:
                continue
            matched += 1
            if self._done or seat not in self._acting:
                continue
            act = actions[seat]
            info: dict[str, Any] = {}
            infos[seat] = info
            rewards[seat] = 0.0
            parsed: Action | None
            if type(act) is Action:
                parsed = act
                reason = self._check(seat, act)
            elif type(act) is str:
                pr = self.parse(seat, act)
                if pr.action is None:
                    reason = pr.error
                    parsed = None
                else:
                    parsed = pr.action
                    reason = self._check(seat, parsed)
            elif isinstance(act, Action):
                parsed = act
                reason = self._check(seat, act)
            else:
                parsed = None
                reason = f"expected an Action or text, got {type(act).__name__}"
            if reason:
                info["invalid_reason"] = reason
                n_att = self._attempts[seat] + 1
                self._emit("invalid", f"seat:{seat}", actor=seat, text=reason)
                if n_att <= self.config.max_reprompts:
                    self._attempts[seat] = n_att
                    self._feedback[seat] = reason
                    continue
                parsed = self.default_action(seat)
                info["defaulted"] = True
                info["penalty"] = True
                info["default_action"] = parsed
            if self._attempts[seat]:
                self._attempts[seat] = 0
                self._feedback[seat] = ""
            assert parsed is not None
            self._apply(seat, parsed)
        if matched < len(actions):
            for seat in actions:
                if seat not in infos:
                    infos[seat] = {"invalid_reason": "it is not your turn"}
        return infos

    def _result(self, rewards: dict[int, float], infos: dict[int, dict[str, Any]]) -> StepResult:
        if self._done:
            out = self.outcome()
            agents = self.possible_agents
            return StepResult(
                {s: self.observe(s) for s in agents},
                {s: float(out[s]) for s in agents},
                {s: not self._truncated for s in agents},
                {s: self._truncated for s in agents},
                {s: infos.get(s, {}) for s in agents},
            )
        obs = {s: self.observe(s) for s in self._acting}
        return StepResult(obs, rewards, {}, {}, infos)

    def _check(self, seat: int, action: Action) -> str:
        """Empty string when legal, else the reason (what the re-prompt shows)."""
        kind = action.kind
        for la in self._legal.get(seat, ()):
            if la.kind == kind:
                if not la.targets:
                    return ""
                t = action.target
                if t is not None and t in la.targets:
                    return ""
                return self._target_reason(seat, kind, t)
        return self._kind_reason(kind)

    def _target_reason(self, seat: int, kind: str, t: int | None) -> str:
        if t is None:
            return f"'{kind}' needs a target player"
        if not isinstance(t, int) or not 0 <= t < self.n:
            return f"there is no such player (players are numbered 1..{self.n})"
        if not self.alive[t]:
            return f"player {t + 1} is dead"
        if t == seat:
            return f"you cannot {kind} yourself"
        if kind == K_PROTECT and t == self._last_protected:
            return f"you protected player {t + 1} last night; choose someone else"
        if kind == K_SAVE:
            return "you can only save tonight's victim"
        if kind == K_VOTE and self._revote:
            return "in the revote you may only vote for the tied players"
        return f"you cannot {kind} player {t + 1} now"

    def _kind_reason(self, kind: str) -> str:
        if kind == K_SAVE and self.phase == PH_WITCH:
            if not self._save_left:
                return "your antidote is already used"
            if self._wolf_target < 0:
                return "nobody was attacked tonight"
            return "you may not save yourself tonight"
        if kind == K_POISON and self.phase == PH_WITCH and not self._poison_left:
            return "your poison is already used"
        return f"'{kind}' is not a legal action in phase {self.phase}"

    # --- phase plumbing ------------------------------------------------------------------------------

    def _set_sequential(self, phase: str, queue: list[int], after: Callable[[], None]) -> None:
        """A speech-like phase: seats in ``queue`` speak one per step, then ``after`` runs."""
        self.phase = phase
        self._queue = queue
        self._after = after
        seat = queue[0]
        self._acting = [seat]
        self._legal = {seat: _SPEAK_LEGAL}

    def _apply(self, seat: int, action: Action) -> None:
        phase = self.phase
        if phase in (PH_DISCUSSION, PH_LAST_WORDS, PH_WOLF_CHAT):
            text = action.text
            if phase == PH_WOLF_CHAT:
                self._emit("wolf_speech", WOLVES_CHANNEL, actor=seat, text=text)
            else:
                self._emit(
                    "speech" if phase == PH_DISCUSSION else "last_words", PUBLIC, actor=seat, text=text
                )
                if text and ("seer" in text or "预言家" in text):
                    claim = _claim_scan(text)
                    if claim is not None:
                        claims = dict(self._seer_claims)
                        claims[seat] = {**claims.get(seat, {}), **claim}
                        self._seer_claims = claims
            q = self._queue
            q.pop(0)
            if phase != PH_LAST_WORDS:
                alive = self.alive
                while q and not alive[q[0]]:
                    q.pop(0)
            if q:
                nxt = q[0]
                self._acting = [nxt]
                self._legal = {nxt: _SPEAK_LEGAL}
            else:
                self._after()
            return
        if phase in (PH_VOTE, PH_WOLF_VOTE, PH_SHERIFF):
            target = action.target if action.kind != K_PASS and action.target is not None else -1
            self._ballots[seat] = target
            self._acting.remove(seat)
            del self._legal[seat]
            if not self._acting:
                if phase == PH_VOTE:
                    self._resolve_vote()
                elif phase == PH_WOLF_VOTE:
                    self._resolve_wolf_vote()
                else:
                    self._resolve_sheriff()
            return
        if phase == PH_GUARD:
            self._act_guard(seat, action)
        elif phase == PH_SEER:
            self._act_seer(seat, action)
        elif phase == PH_WITCH:
            self._act_witch(seat, action)
        elif phase == PH_SHOOT:
            self._act_shoot(seat, action)
        elif phase == PH_BADGE:
            self._act_badge(seat, action)

    def _alive_seats(self) -> list[int]:
        alive = self.alive
        return [i for i in range(self.n) if alive[i]]

    # --- night ---------------------------------------------------------------------------------------

    def _start_night(self) -> None:
        if self.day >= self.config.max_days:
            self._end("", truncated=True)
            return
        self.day += 1
        self.phase = "night"
        self._emit("night", PUBLIC)
        self._wolf_target = -1
        self._guard_target = -1
        self._saved = False
        self._poison_target = -1
        alive_wolves = [w for w in self.wolves if self.alive[w]]
        rounds = self.config.wolf_chat_rounds
        if rounds and alive_wolves:
            self._set_sequential(PH_WOLF_CHAT, alive_wolves * rounds, self._start_wolf_vote)
        else:
            self._start_wolf_vote()

    def _start_wolf_vote(self) -> None:
        self.phase = PH_WOLF_VOTE
        alive = self._alive_seats()
        legal = (LegalAction(K_KILL, tuple(alive)),)
        self._ballots = {}
        self._acting = [w for w in self.wolves if self.alive[w]]
        self._legal = {w: legal for w in self._acting}
        if not self._acting:  # pragma: no cover - the game ends when no wolf is alive
            self._after_wolves()

    def _resolve_wolf_vote(self) -> None:
        tally: dict[int, int] = {}
        for seat in sorted(self._ballots):
            t = self._ballots[seat]
            self._emit("wolf_vote", WOLVES_CHANNEL, actor=seat, target=t)
            if t >= 0:
                tally[t] = tally.get(t, 0) + 1
        if tally:
            best = max(tally.values())
            top = sorted(t for t, c in tally.items() if c == best)
            self._wolf_target = top[0] if len(top) == 1 else self.rng.choice(top)
        self._emit("wolf_kill", WOLVES_CHANNEL, target=self._wolf_target)
        self._after_wolves()

    def _after_wolves(self) -> None:
        g = self._seat_of.get(GUARD, -1)
        if g >= 0 and self.alive[g]:
            self.phase = PH_GUARD
            targets = tuple(s for s in self._alive_seats() if s != self._last_protected)
            self._acting = [g]
            self._legal = {g: (LegalAction(K_PROTECT, targets), _PASS_LEGAL)}
            return
        self._start_seer()

    def _act_guard(self, seat: int, action: Action) -> None:
        if action.kind == K_PROTECT and action.target is not None:
            self._guard_target = action.target
            self._emit("protect", f"seat:{seat}", actor=seat, target=action.target)
        else:
            self._emit("protect", f"seat:{seat}", actor=seat, target=-1)
        self._last_protected = self._guard_target
        self._start_seer()

    def _start_seer(self) -> None:
        s = self._seat_of.get(SEER, -1)
        if s >= 0 and self.alive[s]:
            self.phase = PH_SEER
            targets = tuple(t for t in self._alive_seats() if t != s)
            self._acting = [s]
            self._legal = {s: (LegalAction(K_INSPECT, targets),)}
            return
        self._start_witch()

    def _act_seer(self, seat: int, action: Action) -> None:
        t = action.target if action.target is not None else -1
        result = "werewolf" if self.is_wolf[t] else "good"
        self._seer_results[t] = result
        self._emit("inspect", f"seat:{seat}", actor=seat, target=t, text=result)
        self._start_witch()

    def _start_witch(self) -> None:
        w = self._seat_of.get(WITCH, -1)
        if w < 0 or not self.alive[w] or not (self._save_left or self._poison_left):
            self._dawn()
            return
        self.phase = PH_WITCH
        victim = self._wolf_target
        self._emit("night_victim", f"seat:{w}", actor=w, target=victim)
        legal: list[LegalAction] = []
        if self._save_left and victim >= 0:
            rule = self.config.witch_self_save
            if victim != w or rule == "always" or (rule == "first_night" and self.day == 1):
                legal.append(LegalAction(K_SAVE, (victim,)))
        if self._poison_left:
            legal.append(LegalAction(K_POISON, tuple(t for t in self._alive_seats() if t != w)))
        legal.append(_PASS_LEGAL)
        self._acting = [w]
        self._legal = {w: tuple(legal)}

    def _act_witch(self, seat: int, action: Action) -> None:
        ch = f"seat:{seat}"
        if action.kind == K_SAVE:
            self._saved = True
            self._save_left = False
            self._emit("witch_save", ch, actor=seat, target=self._wolf_target)
        elif action.kind == K_POISON and action.target is not None:
            self._poison_target = action.target
            self._poison_left = False
            self._emit("witch_poison", ch, actor=seat, target=action.target)
        else:
            self._emit("witch_pass", ch, actor=seat)
        self._dawn()

    # --- dawn and deaths -----------------------------------------------------------------------------

    def _dawn(self) -> None:
        self.phase = "dawn"
        self._emit("day", PUBLIC)
        deaths: dict[int, str] = {}
        v = self._wolf_target
        if v >= 0:
            guarded = self._guard_target == v
            if self._saved and guarded:
                lives = self.config.guard_save_rule == "lives"
            else:
                lives = self._saved or guarded
            if not lives:
                deaths[v] = CAUSE_WOLF
        if self._poison_target >= 0:
            deaths[self._poison_target] = CAUSE_POISON
        if not deaths:
            self._emit("peaceful_night", PUBLIC)
        for seat in sorted(deaths):
            self._die(seat, "night")
        if self._check_win():
            return
        lw = self.config.last_words
        give_words = lw == "always" or (lw == "first_night" and self.day == 1)
        self._followups = []
        for seat in sorted(deaths):
            self._queue_followups(seat, deaths[seat], give_words)
        self._cont = self._start_day
        self._run_followups()

    def _die(self, seat: int, public_cause: str) -> None:
        """Mark a death; the public cause never tells a wolf kill from a poisoning."""
        self.alive[seat] = False
        self._emit("death", PUBLIC, target=seat, text=public_cause)

    def _queue_followups(self, seat: int, cause: str, last_words: bool) -> None:
        f = self._followups
        if last_words:
            f.append((_F_LAST_WORDS, seat, cause))
        if self.sheriff == seat:
            f.append((_F_BADGE, seat, cause))
        role = self.roles[seat]
        if (role == HUNTER and cause != CAUSE_POISON) or (role == WOLF_KING and cause == CAUSE_EXILE):
            f.append((_F_SHOT, seat, cause))

    def _run_followups(self) -> None:
        while self._followups:
            kind, seat, _cause = self._followups.pop(0)
            if kind == _F_LAST_WORDS:
                self._set_sequential(PH_LAST_WORDS, [seat], self._run_followups)
                return
            if kind == _F_BADGE:
                if self.sheriff != seat:
                    continue
                targets = tuple(self._alive_seats())
                if not targets:  # pragma: no cover - the game would be over
                    continue
                self.phase = PH_BADGE
                self._acting = [seat]
                self._legal = {seat: (LegalAction(K_BADGE, targets), _PASS_LEGAL)}
                return
            targets = tuple(t for t in self._alive_seats() if t != seat)
            if targets:
                self.phase = PH_SHOOT
                self._acting = [seat]
                self._legal = {seat: (LegalAction(K_SHOOT, targets), _PASS_LEGAL)}
                return
        self._cont()

    def _act_shoot(self, seat: int, action: Action) -> None:
        role = self.roles[seat]
        if action.kind == K_SHOOT and action.target is not None:
            t = action.target
            self._revealed = {**self._revealed, seat: role}
            self._emit("shoot", PUBLIC, actor=seat, target=t, text=role)
            self._die(t, "shot")
            if self._check_win():
                return
            if self.sheriff == t:
                self._followups.insert(0, (_F_BADGE, t, CAUSE_SHOT))
        else:  # declining stays private: a public "does not shoot" would reveal the role
            self._emit("shoot", f"seat:{seat}", actor=seat, target=-1)
        self._run_followups()

    def _act_badge(self, seat: int, action: Action) -> None:
        if action.kind == K_BADGE and action.target is not None:
            self.sheriff = action.target
            self._emit("badge", PUBLIC, actor=seat, target=action.target)
        else:
            self.sheriff = -1
            self._emit("badge", PUBLIC, actor=seat, target=-1)
        self._run_followups()

    def _check_win(self) -> bool:
        alive = self.alive
        roles = self.roles
        wolves = good = villagers = specials = 0
        for i in range(self.n):
            if alive[i]:
                r = roles[i]
                if r in WOLF_ROLES:
                    wolves += 1
                else:
                    good += 1
                    if r == VILLAGER:
                        villagers += 1
                    elif r in SPECIAL_ROLES:
                        specials += 1
        if wolves == 0:
            self._end(TEAM_VILLAGE)
            return True
        if self.config.win_rule == "parity":
            if wolves >= good:
                self._end(TEAM_WOLVES)
                return True
        elif (self._has_villagers and villagers == 0) or (self._has_specials and specials == 0) or good == 0:
            self._end(TEAM_WOLVES)
            return True
        return False

    def _end(self, winner: str, truncated: bool = False) -> None:
        self._winner = winner
        self._truncated = truncated
        self._done = True
        self.phase = PH_GAME_OVER
        self._acting = []
        self._legal = {}
        self._emit("game_over", PUBLIC, text=winner or "draw")
        for seat in range(self.n):
            self._emit("reveal", PUBLIC, actor=seat, text=self.roles[seat])

    # --- day -----------------------------------------------------------------------------------------

    def _start_day(self) -> None:
        if not self._sheriff_done:
            self._sheriff_done = True
            self._revote = False
            self._start_ballot(PH_SHERIFF, self._alive_seats(), tuple(self._alive_seats()))
            return
        self._start_discussion()

    def _start_ballot(self, phase: str, voters: list[int], targets: tuple[int, ...]) -> None:
        self.phase = phase
        self._ballots = {}
        self._voters = tuple(voters)
        self._acting = list(voters)
        if phase == PH_SHERIFF:
            legal = (LegalAction(K_ELECT, targets), _PASS_LEGAL)
            self._legal = dict.fromkeys(voters, legal)
        else:
            self._legal = {
                v: (LegalAction(K_VOTE, tuple(t for t in targets if t != v)), _PASS_LEGAL) for v in voters
            }
        if not voters:
            if phase == PH_SHERIFF:
                self._resolve_sheriff()
            else:
                self._resolve_vote()

    def _tally(self, event_kind: str) -> list[int]:
        """Emit the public ballots (revealed together) and return the top-voted seats."""
        tally: dict[int, int] = {}
        sw = self._sheriff_weight
        if event_kind == "vote":
            self._votes = self._votes + tuple((self.day, s, self._ballots[s]) for s in sorted(self._ballots))
        for seat in sorted(self._ballots):
            t = self._ballots[seat]
            self._emit(event_kind, PUBLIC, actor=seat, target=t)
            if t >= 0:
                w = sw if (event_kind == "vote" and seat == self.sheriff) else 2
                tally[t] = tally.get(t, 0) + w
        if not tally:
            return []
        best = max(tally.values())
        return sorted(t for t, c in tally.items() if c == best)

    def _resolve_sheriff(self) -> None:
        top = self._tally("sheriff_vote")
        if len(top) == 1:
            self.sheriff = top[0]
            self._emit("sheriff", PUBLIC, target=top[0])
        elif len(top) > 1 and self.config.tie_rule == "revote" and not self._revote:
            self._revote = True
            self._emit("revote", PUBLIC, text=",".join(map(str, top)))
            voters = [s for s in self._alive_seats() if s not in top]
            self._start_ballot(PH_SHERIFF, voters, tuple(top))
            return
        else:
            self._emit("sheriff", PUBLIC, target=-1, text="tie" if top else "no_votes")
        self._revote = False
        self._start_discussion()

    def _start_discussion(self) -> None:
        alive = self._alive_seats()
        rounds = self.config.discussion_rounds
        order_rule = self.config.speaking_order
        if order_rule == "seat_order":
            order = alive
        else:
            n = self.n
            if self.sheriff >= 0 and self.alive[self.sheriff]:
                start = self.sheriff + (1 if order_rule == "clockwise" else -1)
            else:
                start = self.rng.randrange(n)
            step = 1 if order_rule == "clockwise" else -1
            order = [(start + step * i) % n for i in range(n)]
            order = [s for s in order if self.alive[s]]
        self._emit("speaking_order", PUBLIC, text=",".join(map(str, order)))
        queue = order * rounds
        if queue:
            self._set_sequential(PH_DISCUSSION, queue, self._start_vote)
        else:
            self._start_vote()

    def _start_vote(self) -> None:
        self._revote = False
        alive = self._alive_seats()
        self._start_ballot(PH_VOTE, alive, tuple(alive))

    def _resolve_vote(self) -> None:
        top = self._tally("vote")
        if len(top) == 1:
            seat = top[0]
            self._revote = False
            self._emit("vote_result", PUBLIC, target=seat)
            self._die(seat, "exile")
            if self._check_win():
                return
            self._followups = []
            self._queue_followups(seat, CAUSE_EXILE, self.config.exile_last_words)
            self._cont = self._start_night
            self._run_followups()
            return
        if len(top) > 1 and self.config.tie_rule == "revote" and not self._revote:
            self._revote = True
            self._emit("revote", PUBLIC, text=",".join(map(str, top)))
            voters = [s for s in self._alive_seats() if s not in top]
            self._start_ballot(PH_VOTE, voters, tuple(top))
            return
        self._revote = False
        self._emit("vote_result", PUBLIC, target=-1, text="tie" if top else "no_votes")
        self._start_night()


def _role_counts(roles: list[str]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for r in roles:
        counts[r] = counts.get(r, 0) + 1
    from wolfpack_games.werewolf.models import ALL_ROLES

    return [(r, counts[r]) for r in ALL_ROLES if r in counts]


def replay(
    config: WerewolfConfig | str, seed: int | None, actions_log: list[dict[int, Action | str]]
) -> WerewolfEnv:
    """Rebuild a game from its config (or preset name), seed and ``env.action_log``.

    Because the engine is deterministic given the seed and the actions, the result's events and state
    equal the original's.
    """
    env = WerewolfEnv(config=config) if isinstance(config, WerewolfConfig) else WerewolfEnv(variant=config)
    env.reset(seed=seed)
    for actions in actions_log:
        env.step(actions)
    return env


__all__ = [
    "CAUSE_EXILE",
    "CAUSE_POISON",
    "CAUSE_SHOT",
    "CAUSE_WOLF",
    "Knowledge",
    "WerewolfEnv",
    "replay",
]
