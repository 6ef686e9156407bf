"""Episode sessions: the environment service's business logic, independent of gRPC.

An ``Episode`` is a ``wolfpack_games.session.Session`` (the session rules, shared with the trainer's
in-process environment: seat plans, scripted seats that play themselves, turn ids, parse-then-step,
re-prompts and defaults) plus what a networked game needs: secret per-seat tokens, idempotent acts, a
deadline per decision after which a silent seat gets its default action, limits, change notifications for
observation streams, and one trace per episode with a span per applied turn.

Why acts are applied one seat at a time: engines accept actions of any subset of the acting seats (a
simultaneous vote resolves once every voter has acted), so an external agent never waits for another
seat inside ``act`` — its result (accepted / re-prompted / defaulted) is known immediately.

Errors a client can cause raise ``SessionError`` subclasses that the server maps to gRPC status codes;
none of them changes the game, so a bad request never breaks an episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import itertools
import logging
import math
import os
import secrets
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from opentelemetry import trace

from wolfpack.errors import ServiceError
from wolfpack_games import Action, Observation
from wolfpack_games.base import get_game
from wolfpack_games.session import Applied, Session, SessionSetupError, start_session
from wolfpack_games.session import SeatPlan as SeatPlan  # re-exported: callers build plans from here

tracer = trace.get_tracer("wolfpack.environment")
log = logging.getLogger(__name__)

ADVANCE_SLICE_S = 0.005
"""Longest stretch of scripted play on the event loop before the rest is continued on its next turn."""

SPARE_ENGINES = 64
"""Engines of released episodes kept per (game, variant) for the next creates: a PlaySeats stream that
plays episode after episode releases one and creates one per game, and starting a spare (``reset``'s
contract: the same game as a fresh engine) skips building a new one, which for Werewolf also starts a
throwaway game in its constructor (~40 % of a create's CPU)."""


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _after(deadline: float) -> Callable[[], bool]:
    """``Session.play_scripted``'s ``stop``: true once ``deadline`` (``time.perf_counter``) has passed."""
    return lambda: time.perf_counter() > deadline


MAX_OPTIONS = 64
MAX_OPTION_CHARS = 16_384
MAX_OPTIONS_TOTAL_CHARS = 65_536
"""Bounds of ``CreateEpisodeRequest.options``: at most 64 entries of at most 16 KiB of YAML each and 64 KiB
in all (a scenario or a role table fits; the games bound every value themselves). The total bounds the
parse work of one create (~60 ms of YAML at worst with libyaml) that runs on the event loop: without it,
64 options of 16 KiB cost 8 s in pure-Python YAML per create."""

MAX_PAGE_SIZE = 200
DEFAULT_PAGE_SIZE = 50
"""Bounds of ``EpisodeManager.page`` (``ListEpisodes``): one answer holds at most 200 summaries."""

STATUSES = ("", "running", "finished")
"""``EpisodeManager.page``'s status filters: any, playing, over (kept until released)."""


_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it (about 10x faster), else the pure-Python one."""


def _new_tokens(n: int) -> list[str]:
    """``n`` secret tokens of 144 random bits each (36 hex characters), from one ``os.urandom`` call:
    an episode needs up to 13 of them, and one system call costs a tenth of thirteen ``secrets`` calls."""
    raw = os.urandom(18 * n).hex()
    return [raw[36 * i : 36 * (i + 1)] for i in range(n)]


class SessionError(ServiceError):
    """A client error; ``code`` names the gRPC status the server returns."""

    code = "INVALID_ARGUMENT"


class NotFoundError(SessionError):
    code = "NOT_FOUND"


class PermissionDeniedError(SessionError):
    code = "PERMISSION_DENIED"


class UnauthenticatedError(SessionError):
    code = "UNAUTHENTICATED"


class FailedPreconditionError(SessionError):
    code = "FAILED_PRECONDITION"


class ResourceExhaustedError(SessionError):
    code = "RESOURCE_EXHAUSTED"


class AlreadyExistsError(SessionError):
    code = "ALREADY_EXISTS"


class InternalError(SessionError):
    """A bug on our side (a scripted bot or an engine raised); the message names no internals."""

    code = "INTERNAL"


@dataclass(frozen=True)
class Limits:
    """Per-process protections; defaults suit thousands of concurrent episodes on one process.

    Collection rules (documented in the service README): a finished episode is kept ``finished_ttl_s``
    (its final state stays readable), then released; a running episode whose seats nobody has touched
    (no act, observation or join by a seat token) for ``abandoned_ttl_s`` is aborted and released, even
    while turn timeouts keep playing default actions for it. ``turn_timeout_s`` is at most
    ``max_turn_timeout_s`` (half the abandonment time). Checked at most every ``collect_every_s``.

    Episodes with external seats that no seat token has touched yet (*unclaimed*) cost nothing to create and
    would otherwise hold their slot for the whole abandonment time: at most ``max_unclaimed`` of them exist at
    once (more creates are RESOURCE_EXHAUSTED, while episodes that are played or all-bot still get the rest of
    the table), and one still unclaimed after ``unclaimed_ttl_s`` is aborted and released."""

    max_episodes: int = 20_000
    max_text_chars: int = 8_000
    acts_per_second: float = 200.0  # per seat token (token bucket): stops runaway loops, not agents
    burst: int = 400
    default_turn_timeout_s: float = 120.0
    max_turn_timeout_s: float = 900.0
    finished_ttl_s: float = 600.0
    abandoned_ttl_s: float = 1_800.0
    max_unclaimed: int = 5_000
    unclaimed_ttl_s: float = 300.0
    collect_every_s: float = 5.0
    max_request_id_chars: int = 128


ActResult = Applied
"""What ``act`` answers: the library's result of one answer, ``duplicate`` set for a retry."""


@dataclass(slots=True)
class _Bucket:
    tokens: float
    last: float


@dataclass(kw_only=True)
class Episode(Session):
    """A session (the game and its rules' state: ``env``, ``seats``, ``bots``, ``open_turns``, ``closed``,
    ``done``) hosted by this process."""

    turn_timeout_s: float
    tokens: dict[str, int] = field(default_factory=dict)  # token -> seat
    admin_token: str = ""
    request_id: str = ""
    last_active: float = field(default_factory=time.monotonic)
    turn_deadlines: dict[int, float] = field(default_factory=dict)  # seat -> deadline of its open turn
    scheduled: bool = False  # has an entry in the manager's deadline heap
    traced: bool = False  # the episode span records (an SDK exports spans): turns get spans too
    version: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    acted: dict[tuple[int, int], ActResult] = field(default_factory=dict)
    finished_at: float | None = None
    span: trace.Span | None = None
    timeouts: int = 0
    listeners: set[Callable[[Episode], None]] = field(default_factory=set)  # PlaySeats streams watching
    watchers: int = 0  # Observe streams waiting on ``changed``
    advancing: bool = False  # a sliced scripted run is still in progress (see ``_advance``)
    created_ns: int = field(default_factory=time.time_ns)  # wall clock, for listings
    seq: int = 0  # creation order in this process (``EpisodeManager.page``'s cursor)


class EpisodeManager:
    """All episodes of one process. Methods are called from one asyncio loop (no locks needed)."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.episodes: dict[str, Episode] = {}
        self._buckets: dict[str, _Bucket] = {}
        # (finish time, episode id) in finish order; ids, not episodes, so released ones are freed at once
        self._finished: deque[tuple[float, str]] = deque()
        self._deadlines: list[tuple[float, str]] = []  # (earliest open-turn deadline, episode id)
        self._sweeper: asyncio.Task[None] | None = None
        # request id -> (fingerprint of the create request, episode id): idempotent creation. Keyed by
        # the caller's request id, never by episode id: episode ids are public (every observation shows
        # them), so looking a create up by one would hand its tokens to anyone who saw it.
        self._requests: dict[str, tuple[bytes, str]] = {}
        self._advancing: deque[Episode] = deque()  # episodes whose scripted run continues (see _advance)
        self._unclaimed: dict[str, float] = {}  # running episodes with external seats no token touched yet
        self._slicing = False
        self._last_collect = time.monotonic()
        self._seq = itertools.count(1)
        self._spare: dict[tuple[str, str], list[Any]] = {}  # (game id, variant) -> released engines

    # ------------------------------------------------------------------ lifecycle
    def create(
        self,
        game_id: str,
        variant: str = "",
        seed: int = 0,
        seats: Mapping[int, SeatPlan] | None = None,
        default_bot: str = "",
        language: str = "en",
        turn_timeout_s: float = 0.0,
        options: Mapping[str, Any] | None = None,
        request_id: str = "",
        fingerprint: bytes = b"",
    ) -> Episode:
        """Start an episode. A non-empty ``request_id`` makes creation idempotent: the same id with the
        same request (``fingerprint``: the request's bytes; computed from the arguments when empty)
        returns the episode created first, tokens included; the same id with another request is
        ALREADY_EXISTS. A request id is a secret of its caller (use a random one): whoever
        knows it and the request can read the tokens back. Episode ids never come from request ids."""
        self._collect_garbage()
        limits = self.limits
        if len(request_id) > limits.max_request_id_chars:
            raise SessionError(f"request_id is longer than {limits.max_request_id_chars} characters")
        if request_id and not fingerprint:
            fingerprint = hashlib.sha256(
                repr(
                    (game_id, variant, seed, sorted((k, repr(v)) for k, v in (seats or {}).items()),
                     default_bot, language, turn_timeout_s, sorted((k, repr(v)) for k, v in (options or {}).items()))
                ).encode()
            ).digest()  # fmt: skip
        known = self._requests.get(request_id) if request_id else None
        if known is not None:
            if not secrets.compare_digest(known[0], fingerprint):
                raise AlreadyExistsError(
                    "request_id was already used for a different create request; choose a new one"
                )
            return self.episodes[known[1]]
        if not (math.isfinite(turn_timeout_s) and 0 <= turn_timeout_s <= limits.max_turn_timeout_s):
            raise SessionError(
                f"turn_timeout_s must be a number in [0, {limits.max_turn_timeout_s:g}] "
                f"(0: the default {limits.default_turn_timeout_s:g}), got {turn_timeout_s!r}"
            )
        if len(self.episodes) >= self.limits.max_episodes:
            raise ResourceExhaustedError(
                f"episode limit reached ({self.limits.max_episodes}); close some first"
            )
        spare = self._spare.get((game_id, variant or _default_variant(game_id)))
        try:
            ep = start_session(
                Episode, episode_id=uuid.uuid4().hex, game_id=game_id, variant=variant, seed=seed, seats=seats,
                default_bot=default_bot, language=language, options=options,
                turn_timeout_s=turn_timeout_s or limits.default_turn_timeout_s, request_id=request_id,
                env=spare.pop() if spare else None,
            )  # fmt: skip
        except SessionSetupError as exc:
            raise SessionError(str(exc)) from None
        ep_id, variant = ep.episode_id, ep.variant
        played = ep.played_seats()
        if played and len(self._unclaimed) >= limits.max_unclaimed:
            ep.env.close()
            raise ResourceExhaustedError(
                f"{len(self._unclaimed)} episodes have seats nobody has joined yet (the limit is "
                f"{limits.max_unclaimed}; each is released {limits.unclaimed_ttl_s:g}s after its creation if "
                "still unjoined): join or close some first"
            )
        secret = _new_tokens(len(played) + 1)  # one per played seat, then the admin token
        ep.tokens = dict(zip(secret, played, strict=False))
        ep.admin_token = secret[-1]
        ep.span = span = tracer.start_span(
            "episode",
            attributes={"wolfpack.episode.id": ep_id, "wolfpack.game.id": game_id, "wolfpack.game.variant": variant,
                        "wolfpack.seed": seed},
        )  # fmt: skip
        ep.traced = span.is_recording()
        ep.seq = next(self._seq)
        # Registered only once its first scripted moves ran: a bot that raises leaves nothing behind.
        self.episodes[ep_id] = ep
        ep.last_active = time.monotonic()  # the manager's clock (the field's default bound the real one)
        if played:
            self._unclaimed[ep_id] = ep.last_active
        try:
            self._advance(ep)
        except Exception as exc:
            log.exception("a scripted seat failed while starting an episode", extra={"game": game_id})
            self.release(ep)
            raise InternalError(
                f"{game_id}/{variant}: a scripted seat failed; the episode was not created"
            ) from exc
        if request_id:
            self._requests[request_id] = (fingerprint, ep_id)
        return ep

    def get(self, episode_id: str) -> Episode:
        ep = self.episodes.get(episode_id)
        if ep is None:
            raise NotFoundError(
                f"no episode {episode_id!r} (finished episodes are kept {self.limits.finished_ttl_s:.0f}s)"
            )
        return ep

    def page(self, page_size: int = 0, page_token: str = "", status: str = "") -> tuple[list[Episode], str]:
        """One page of the episodes held here, newest first, and the token of the next page ("" when this
        one is the last). ``status`` filters (``STATUSES``). The token is the creation number of the last
        episode returned: ``episodes`` is in creation order (ids are never reused), so a page resumes
        exactly after it even while episodes come and go, and nothing needs to be kept per caller. The
        walk is O(episodes held), bounded by ``Limits.max_episodes``."""
        if page_size == 0:
            page_size = DEFAULT_PAGE_SIZE
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise SessionError(
                f"page_size must be in [1, {MAX_PAGE_SIZE}] (0: {DEFAULT_PAGE_SIZE}), got {page_size}"
            )
        if status not in STATUSES:
            raise SessionError(f"unknown status filter {status!r}")
        before = None
        if page_token:
            if not (page_token.isascii() and page_token.isdigit() and len(page_token) <= 20):
                raise SessionError("page_token is not one this server gave: pass next_page_token back as is")
            before = int(page_token)
        out: list[Episode] = []
        for ep in reversed(self.episodes.values()):
            if before is not None and ep.seq >= before:
                continue
            if status and (status == "finished") != ep.done:
                continue
            if len(out) == page_size:
                return out, str(out[-1].seq)
            out.append(ep)
        return out, ""

    def seat_of(self, ep: Episode, token: str) -> int:
        seat = ep.tokens.get(token)
        if seat is None:
            raise PermissionDeniedError("this token does not hold a seat in this episode")
        ep.last_active = time.monotonic()  # a seat in use: the episode is not abandoned
        if self._unclaimed:
            self._unclaimed.pop(ep.episode_id, None)
        return seat

    def is_admin(self, ep: Episode, token: str) -> bool:
        # bytes: ``compare_digest`` raises TypeError on non-ASCII str
        return secrets.compare_digest(token.encode(), ep.admin_token.encode())

    def close(self, episode_id: str, token: str, privileged: bool = True) -> bool:
        """Close (abort and forget) an episode: needs its admin token and, for a running episode, a
        ``privileged`` caller (the service credential when one is configured)."""
        ep = self.get(episode_id)
        if not self.is_admin(ep, token):
            raise PermissionDeniedError("closing an episode needs its admin token")
        if not privileged and not ep.done:
            raise PermissionDeniedError("closing a running episode needs the service credential")
        self.release(ep)
        return True

    def check_full_view(self, ep: Episode, privileged: bool) -> None:
        """Spectating (the admin token's full view of a running episode) needs the service credential."""
        if not privileged and not ep.done:
            raise PermissionDeniedError("the full view of a running episode needs the service credential")

    def release(self, ep: Episode) -> None:
        """Forget an episode now (ending it first if it is still running): its seats' tokens stop
        working and its memory is freed without waiting for ``finished_ttl_s``."""
        if not ep.closed:
            ep.closed = True
            self._finish(ep, aborted=not ep.env.done)
        if self.episodes.get(ep.episode_id) is ep:
            del self.episodes[ep.episode_id]
            self._unclaimed.pop(ep.episode_id, None)
        if ep.request_id and self._requests.get(ep.request_id, (b"", ""))[1] == ep.episode_id:
            del self._requests[ep.request_id]
        for token in ep.tokens:
            self._buckets.pop(token, None)
        self._retire(ep)

    def _retire(self, ep: Episode) -> None:
        """``close()`` a released episode's engine, or keep it for the next create of its game and variant
        (``SPARE_ENGINES``) when nothing can read it any more: no PlaySeats stream still watches the episode,
        no Observe stream waits on it, and no scripted run is pending. Its id is out of ``episodes``, so no
        new caller can reach it either. Only engines whose game ended are kept (never one aborted mid-game
        or one whose bot raised). Kept engines are not closed: ``start`` replaces their continuations."""
        env = ep.env
        if env.done and not (ep.listeners or ep.watchers or ep.advancing):
            spare = self._spare.setdefault((ep.game_id, ep.variant), [])
            if len(spare) < SPARE_ENGINES:
                spare.append(env)
                return
        env.close()

    def close_all(self) -> None:
        for ep in list(self.episodes.values()):
            if not ep.closed:
                ep.closed = True
                self._finish(ep, aborted=not ep.env.done)

    # ------------------------------------------------------------------ playing
    def current_turn_id(self, ep: Episode, seat: int) -> int:
        """Id of the seat's pending decision (0 when it has none); ``act`` must echo it."""
        return 0 if ep.done else ep.open_turns.get(seat, 0)

    def act(self, ep: Episode, token: str, turn_id: int, action: Action | None, raw_text: str) -> ActResult:
        # ``seat_of`` inlined, its clock reading shared with the rate limit: one call per action less
        seat = ep.tokens.get(token)
        if seat is None:
            raise PermissionDeniedError("this token does not hold a seat in this episode")
        ep.last_active = now = time.monotonic()
        if self._unclaimed:
            self._unclaimed.pop(ep.episode_id, None)
        key = (seat, turn_id)
        prev = ep.acted.get(key)
        if prev is not None:  # a retry of an act that was applied: same answer, no second move
            return ActResult(prev.accepted, prev.reason, prev.action, prev.defaulted, True)
        # the seat token's bucket (``Limits.acts_per_second``, ``burst``), here rather than in a method of its own:
        # this runs once per act
        limits = self.limits
        b = self._buckets.get(token)
        if b is None:
            b = self._buckets[token] = _Bucket(float(limits.burst), now)
        tokens = b.tokens + (now - b.last) * limits.acts_per_second
        if tokens >= limits.burst:
            tokens = float(limits.burst)
        b.last = now
        if tokens < 1.0:
            b.tokens = tokens
            raise ResourceExhaustedError(f"too many acts; the limit is {limits.acts_per_second:g}/s per seat")
        b.tokens = tokens - 1.0
        if ep.advancing:
            self._advance(ep, sliced=False)
        limit = limits.max_text_chars
        if action is not None and len(action.text) > limit:
            raise SessionError(f"action.text is {len(action.text)} characters; the limit is {limit}")
        if ep.closed or ep.env.done:  # ``ep.done`` without the property call
            raise FailedPreconditionError("the episode is over")
        # ``open_turns`` holds exactly the non-scripted acting seats (kept in step by ``_advance``).
        current = ep.open_turns.get(seat, 0)
        if not current:
            raise FailedPreconditionError(
                f"seat {seat} is not to act now (phase {ep.env.observe(seat).phase})"
            )
        if turn_id != current:
            raise FailedPreconditionError(
                f"stale turn id {turn_id}; seat {seat}'s current turn id is {current}"
            )
        # Free text is a model's answer, and whatever a model answers is a move the game judges by its
        # rules (an empty or unreadable answer is an invalid move: re-prompt, then the default), never a
        # request error that would cost the episode. Only its first ``max_text_chars`` characters are
        # read (bounded parse work and memory); a structured action over the limit is the caller's bug.
        move = action if action is not None else raw_text[:limit]
        # The rules (parse once, step, close the turn unless re-prompted), then the advance: the same two
        # steps as a timeout's (``_timeout``), called from here, with a span around the first when exported.
        result = self._apply_traced(ep, seat, move, False) if ep.traced else ep.apply(seat, move)
        self._advance(ep)
        if result.accepted or result.defaulted:
            ep.acted[key] = result
        return result

    def _apply_traced(self, ep: Episode, seat: int, move: Action | str, timed_out: bool) -> ActResult:
        """``ep.apply`` with a span per turn, child of the episode span (only for an episode whose span
        records: ``Episode.traced``; the others call ``ep.apply`` directly)."""
        phase = ep.env.observe(seat).phase
        started = time.time_ns()
        a = ep.apply(seat, move)
        tracer.start_span(
            "turn",
            context=trace.set_span_in_context(ep.span),  # type: ignore[arg-type]
            start_time=started,
            attributes={
                "wolfpack.episode.id": ep.episode_id,
                "wolfpack.seat": seat,
                "wolfpack.phase": phase,
                "wolfpack.action.kind": a.action.kind if a.action else "",
                "wolfpack.action.valid": a.accepted,
                "wolfpack.action.defaulted": a.defaulted,
                "wolfpack.turn.timed_out": timed_out,
            },
        ).end()
        return a

    def _advance(self, ep: Episode, sliced: bool = True) -> None:
        """Play every due scripted seat, then open the turns of the seats that must decide. On an event
        loop the scripted run is cut into slices of at most ``ADVANCE_SLICE_S`` (the rest continues on
        the loop's next turn), so a long all-bot stretch never stalls other callers; an external act on
        an episode between slices completes the run first (``sliced=False``), so nobody ever acts on a
        half-advanced game."""
        if ep.bots:
            stop = _after(time.perf_counter() + ADVANCE_SLICE_S) if sliced and _on_loop() else None
            if not ep.play_scripted(stop):
                self._continue_later(ep)
                return
        ep.advancing = False
        ep.version += 1
        if ep.env.done:
            self._finish(ep, aborted=False)
            self._notify(ep)  # again when ``_finish`` did (harmless; as before), once when it did not
            return
        # ``_notify`` inlined, and the deadlines of the turns ``open_due_turns`` opened (it gave them turn
        # ids and dropped turns that vanished) started here: this runs once per applied answer
        new = ep.open_due_turns()
        if new:
            deadline = time.monotonic() + ep.turn_timeout_s
            deadlines = ep.turn_deadlines
            for seat in new:
                deadlines[seat] = deadline
            if not ep.scheduled:
                self._schedule(ep, deadline)
        for listener in ep.listeners:
            listener(ep)
        if ep.watchers:
            self._wake(ep)

    def _continue_later(self, ep: Episode) -> None:
        """Queue the rest of ``ep``'s scripted run. One slice runs per event-loop turn whatever the number
        of episodes waiting (round robin), so each turn of the loop costs at most one slice."""
        if not ep.advancing:
            ep.advancing = True
            self._advancing.append(ep)
        if not self._slicing:
            self._slicing = True
            asyncio.get_running_loop().call_soon(self._run_slice)

    def _run_slice(self) -> None:
        self._slicing = False
        while self._advancing:
            ep = self._advancing.popleft()
            if not ep.advancing or ep.closed or self.episodes.get(ep.episode_id) is not ep:
                continue  # an act or a close finished it meanwhile
            ep.advancing = False
            try:
                self._advance(ep)  # re-queues itself (and this callback) if a slice is not enough
            except Exception:
                log.exception(
                    "a scripted seat failed; the episode is aborted", extra={"episode": ep.episode_id}
                )
                self.release(ep)
            break
        if self._advancing and not self._slicing:
            self._slicing = True
            asyncio.get_running_loop().call_soon(self._run_slice)

    def _schedule(self, ep: Episode, deadline: float) -> None:
        """One heap entry per episode with open turns, at its earliest deadline (turns open in time
        order, so that is the oldest open turn's). Answering a turn costs nothing here; the sweeper
        re-schedules an episode whose entry comes up while later turns are still open."""
        ep.scheduled = True
        heapq.heappush(self._deadlines, (deadline, ep.episode_id))
        if self._sweeper is None:
            self._ensure_sweeper()

    def _ensure_sweeper(self) -> None:
        if self._sweeper is not None or not self._deadlines:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # used synchronously (tests, CLI): no timeouts
        self._sweeper = loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        """Apply default actions to decisions whose deadline passed (checked at least every 50 ms)."""
        try:
            while self._deadlines:
                self.expire(time.monotonic())
                if self._deadlines:
                    await asyncio.sleep(min(0.05, max(0.001, self._deadlines[0][0] - time.monotonic())))
        finally:
            self._sweeper = None

    def expire(self, now: float) -> int:
        """Time out every open turn whose deadline is ``<= now``; returns how many. (The sweeper task
        calls it; a synchronous user of the manager can call it directly.)"""
        expired = 0
        if now - self._last_collect >= self.limits.collect_every_s:
            self._collect_garbage()
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _deadline, episode_id = heapq.heappop(heap)
            ep = self.episodes.get(episode_id)
            if ep is None or not ep.scheduled:
                continue
            ep.scheduled = False
            for seat, turn_id in list(ep.open_turns.items()):
                if ep.turn_deadlines.get(seat, now) <= now and not ep.done:
                    self._timeout(ep, seat, turn_id)
                    expired += 1
            if ep.open_turns and not ep.scheduled and not ep.done:
                self._schedule(ep, min(ep.turn_deadlines[s] for s in ep.open_turns))
        return expired

    def _timeout(self, ep: Episode, seat: int, turn_id: int) -> None:
        if ep.advancing:
            self._advance(ep, sliced=False)
        if ep.done or ep.open_turns.get(seat) != turn_id:
            return
        ep.timeouts += 1
        move = ep.env.default_action(seat)
        result = self._apply_traced(ep, seat, move, True) if ep.traced else ep.apply(seat, move)
        self._advance(ep)
        ep.acted[(seat, turn_id)] = ActResult(
            result.accepted, "timed out: default action applied", result.action, True, False
        )

    def _finish(self, ep: Episode, aborted: bool) -> None:
        if ep.finished_at is not None:
            return
        ep.finished_at = time.monotonic()
        self._finished.append((ep.finished_at, ep.episode_id))
        if ep.span is not None:
            ep.span.set_attribute("wolfpack.episode.winner", ep.env.winner() if ep.env.done else "")
            ep.span.set_attribute("wolfpack.episode.aborted", aborted)
            ep.span.end()
        self._notify(ep)

    def _notify(self, ep: Episode) -> None:
        for listener in ep.listeners:  # listeners only mark work for later; they never change this set
            listener(ep)
        if ep.watchers:  # else nobody waits on the condition: skip scheduling a wake-up task
            self._wake(ep)

    @staticmethod
    def _wake(ep: Episode) -> None:
        async def wake() -> None:
            async with ep.changed:
                ep.changed.notify_all()

        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(wake())

    async def watch(self, ep: Episode, seat: int) -> AsyncIterator[Observation]:
        """Yield the seat's observation now and whenever its situation changes (its turn comes, the
        phase or round moves on, the episode ends), until the episode ends. Other seats' moves in
        between are not pushed one by one: they are in the history of the next observation's text,
        which keeps a 12-seat game from rendering 12 texts per move."""
        last_key: tuple[int, bool, str, int] | None = None
        seen = -1
        ep.watchers += 1
        try:
            async for obs in self._watch(ep, seat, last_key, seen):
                yield obs
        finally:
            ep.watchers -= 1

    async def _watch(
        self, ep: Episode, seat: int, last_key: tuple[int, bool, str, int] | None, seen: int
    ) -> AsyncIterator[Observation]:
        while True:
            if ep.version != seen:
                seen = ep.version
                obs = ep.env.observe(seat)
                key = (self.current_turn_id(ep, seat), ep.done, obs.phase, obs.round)
                if key != last_key:
                    last_key = key
                    yield obs
                if ep.done:
                    return
            elif ep.done:  # closed while running: ``release`` ends it without a new version
                return
            async with ep.changed:
                if ep.version == seen and not ep.done:
                    await ep.changed.wait()

    # ------------------------------------------------------------------ protections
    def _collect_garbage(self, now: float | None = None) -> None:
        """Forget episodes finished longer than ``finished_ttl_s`` ago (``_finished`` is in finish order,
        so this looks only at the expired head), and, at most every ``collect_every_s``, abort and forget
        running episodes abandoned by their players (see ``Limits``)."""
        now = time.monotonic() if now is None else now
        limits = self.limits
        while self._finished and now - self._finished[0][0] > limits.finished_ttl_s:
            at, episode_id = self._finished.popleft()
            ep = self.episodes.get(episode_id)
            if ep is not None and ep.finished_at == at:  # not released already, nor a reused id
                self.release(ep)
        if now - self._last_collect < limits.collect_every_s:
            return
        self._last_collect = now
        abandoned = [
            ep
            for ep in self.episodes.values()
            if ep.finished_at is None
            and now - ep.last_active
            > (limits.unclaimed_ttl_s if ep.episode_id in self._unclaimed else limits.abandoned_ttl_s)
        ]
        for ep in abandoned:
            self.release(ep)


def _default_variant(game_id: str) -> str:
    """The variant a create without one plays ("" for an unknown game: ``start_session`` says why)."""
    try:
        return get_game(game_id).default_variant
    except KeyError:
        return ""


def parse_options(raw: Mapping[str, str]) -> dict[str, Any]:
    """``CreateEpisodeRequest.options`` (YAML values as strings) as Python values, or a ``SessionError``
    naming the bad option; bounded by ``MAX_OPTIONS``, ``MAX_OPTION_CHARS`` and ``MAX_OPTIONS_TOTAL_CHARS``."""
    if len(raw) > MAX_OPTIONS:
        raise SessionError(f"options has {len(raw)} entries; the limit is {MAX_OPTIONS}")
    total = 0
    for key, text in raw.items():
        if len(text) > MAX_OPTION_CHARS:
            raise SessionError(f"options[{key!r}] is longer than {MAX_OPTION_CHARS} characters")
        total += len(text)
    if total > MAX_OPTIONS_TOTAL_CHARS:
        raise SessionError(f"options hold {total} characters in all; the limit is {MAX_OPTIONS_TOTAL_CHARS}")
    out: dict[str, Any] = {}
    for key, text in raw.items():
        try:
            value = yaml.load(text, Loader=_YAML_LOADER)  # a safe loader (see _YAML_LOADER)
        except yaml.YAMLError as exc:
            first = str(exc).splitlines()[0] if str(exc) else "syntax error"
            raise SessionError(f"options[{key!r}] is not valid YAML/JSON: {first}") from None
        _check_finite(value, f"options[{key!r}]")
        out[key] = value
    return out


def _check_finite(value: Any, where: str) -> None:
    """NaN and infinities are never a meaningful option value (``.nan`` is valid YAML). The walk is
    bounded: YAML aliases can make a 16 KiB text stand for billions of nodes ("billion laughs"). A node's
    path is kept as a link to its parent's and spelled out only for an error: formatting it for every
    node cost more than parsing the YAML."""
    stack: list[tuple[Any, int, Any]] = [(value, 0, None)]
    budget = 10_000
    while stack:
        item, depth, trail = stack.pop()
        budget -= 1
        if budget < 0 or depth > 20:
            raise SessionError(f"{where} is too large or nested too deeply")
        if isinstance(item, float) and not math.isfinite(item):
            raise SessionError(f"{_spell(where, trail)} must be a finite number, got {item}")
        if isinstance(item, dict):
            stack.extend((v, depth + 1, (trail, f".{k}")) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, depth + 1, (trail, i)) for i, v in enumerate(item))


def _spell(where: str, trail: Any) -> str:
    """The path ``where.key[index]...`` of a node from its trail of (parent trail, step) links."""
    steps: list[str] = []
    while trail is not None:
        trail, step = trail
        steps.append(f"[{step}]" if isinstance(step, int) else step)
    return where + "".join(reversed(steps))
