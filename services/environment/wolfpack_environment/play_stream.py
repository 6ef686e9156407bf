"""The PlaySeats state machine: one object per stream, holding the seats it plays, what it last sent each
of them and the episodes it created; ``play`` drives it from the client's messages and episode changes.

Requests and episode changes go through one queue; each wake-up applies every queued request, then sends
every joined seat's new decisions in one message (both directions batched). Episodes whose end was sent
are forgotten at once, so a stream that plays episode after episode for hours holds only the live ones.
Per-item failures (a bad create, an act with a foreign token) become that item's ``google.rpc.Status``;
the stream goes on.

Bounded work per message: a message's creates past ``MAX_CREATES_PER_MESSAGE`` fail alone with
RESOURCE_EXHAUSTED (send them in a later message), and applying a message gives the event loop back every
``HANDLE_SLICE_S`` of work, so one message of costly creates (options at their bounds: ~10 ms each) never
leaves health checks and other callers unanswered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from wolfpack.errors import to_status
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.convert import (
    Create,
    Observations,
    action_from_pb,
    action_to_pb,
    created_pb,
    parsed_options,
)
from wolfpack_environment.sessions import Episode, EpisodeManager, ResourceExhaustedError, SessionError

log = logging.getLogger(__name__)

MAX_CREATES_PER_MESSAGE = 1024
"""Creates one PlaySeats message may carry; the rest of the message's creates fail alone with
RESOURCE_EXHAUSTED. Above any rollout's in-flight episodes per stream (the driver sends at most its
concurrency at once), far below what freezes a server."""

HANDLE_SLICE_S = 0.005
"""Longest stretch of one message's work (creates, joins, acts) before the event loop gets a turn."""


@dataclass(slots=True)
class _Joined:
    """An episode as one PlaySeats stream sees it: the seats it plays, the turn id last sent to each and,
    with ``prompt_delta``, the prompt last sent to each (with its UTF-8 length; -1 when it is ASCII)."""

    ep: Episode
    seats: set[int] = field(default_factory=set)
    sent: dict[int, int] = field(default_factory=dict)
    prompts: dict[int, tuple[str, int]] = field(default_factory=dict)


ANCHORS = 3
"""Blank lines ``shared_prefix`` tries as the end of the shared part before searching character by
character: a prompt's closing instruction mostly follows a blank line, and what precedes it (rules, role,
history) is what a seat's next prompt starts with."""


def shared_prefix(prev: str, text: str) -> int:
    """A number of leading characters ``text`` shares with ``prev``: all of them in the usual case, never
    more (the wire only needs a shared prefix, not the longest). Fast path: the part before one of the last
    blank lines of ``prev`` (``ANCHORS``), checked with one C-speed ``startswith``, then extended by a short
    search; otherwise a binary search over slice comparisons, each step comparing only the part not yet
    known to match."""
    n = min(len(prev), len(text))
    if text.startswith(prev) if len(prev) <= len(text) else prev.startswith(text):
        return n
    lo, hi = 0, n  # prev[:lo] == text[:lo] and prev[:hi] != text[:hi]
    end = len(prev)
    for _ in range(ANCHORS):
        cut = prev.rfind("\n\n", 0, end) + 1
        if cut <= 0:
            break
        if text.startswith(prev[:cut]):
            lo = cut
            if prev[cut] != text[cut]:  # cut < n: prev[:n] differs from text[:n]
                return cut
            break
        hi = end = cut  # the shared part ends before this blank line: try the one before
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if text.startswith(prev[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    return lo


class PlayStream:
    """State of one PlaySeats call (see the module docstring)."""

    def __init__(self, manager: EpisodeManager, create: Create, observations: Observations) -> None:
        self.manager = manager
        self.create = create
        self.observations = observations
        self.queue: asyncio.Queue[pb.PlaySeatsRequest | str | None] = asyncio.Queue()
        self.joined: dict[str, _Joined] = {}
        self.dirty: set[str] = set()  # episodes changed since the last wake-up: only they are looked at
        self.owned: set[str] = set()  # created by this stream: released when close_finished is set
        self.include_text = False
        self.close_finished = False
        self.rejected_results_only = False
        self.omit_messages = False
        self.prompt_delta = False
        self.omit_final_text = False
        self.busy = False  # applying a batch (see ``on_change``)

    async def play(self, requests: AsyncIterator[pb.PlaySeatsRequest]) -> AsyncIterator[pb.PlaySeatsResponse]:
        """The server side of one PlaySeats call: responses until the client finishes writing."""

        async def pump() -> None:
            try:
                async for req in requests:
                    self.queue.put_nowait(req)
            finally:
                self.queue.put_nowait(None)

        reader = asyncio.create_task(pump())
        client_done = False
        try:
            while not client_done:
                batch = [await self.queue.get()]
                while not self.queue.empty():
                    batch.append(self.queue.get_nowait())
                results: list[pb.SeatActResult] = []
                created: list[pb.CreatedEpisode] = []
                self.busy = True  # changes from here on are sent by the ``decisions`` below
                try:
                    for item in batch:
                        if item is None:
                            client_done = True
                        elif isinstance(item, pb.PlaySeatsRequest):
                            await self.handle(item, results, created)
                    response = pb.PlaySeatsResponse(results=results, created=created)
                    self.decisions(response.decisions)
                finally:
                    self.busy = False
                if results or created or response.decisions:
                    yield response
        finally:
            reader.cancel()
            self.detach()

    def on_change(self, ep: Episode) -> None:
        """An episode this stream watches changed: look at it on the next wake-up. While a batch is being
        applied no wake-up is queued (the batch's own ``decisions`` looks at it): a stream's own acts
        would otherwise wake it once more per message for nothing."""
        if not self.dirty and not self.busy:
            self.queue.put_nowait("changed")
        self.dirty.add(ep.episode_id)

    async def handle(
        self, req: pb.PlaySeatsRequest, results: list[pb.SeatActResult], created: list[pb.CreatedEpisode]
    ) -> None:
        self.include_text = self.include_text or req.include_text
        self.close_finished = self.close_finished or req.close_finished
        self.rejected_results_only = self.rejected_results_only or req.rejected_results_only
        self.omit_messages = self.omit_messages or req.omit_messages
        self.prompt_delta = self.prompt_delta or req.prompt_delta
        self.omit_final_text = self.omit_final_text or req.omit_final_text
        clock = time.perf_counter
        yield_at = clock() + HANDLE_SLICE_S
        too_many = (
            to_status(ResourceExhaustedError(
                f"a PlaySeats message carries at most {MAX_CREATES_PER_MESSAGE} creates; this one had "
                f"{len(req.create)}: send the rest in a later message"
            ))
            if len(req.create) > MAX_CREATES_PER_MESSAGE
            else None
        )  # fmt: skip
        for n, create in enumerate(req.create):
            if clock() > yield_at:
                await asyncio.sleep(0)  # one slice per loop turn: health and other streams get theirs
                yield_at = clock() + HANDLE_SLICE_S
            if too_many is not None and n >= MAX_CREATES_PER_MESSAGE:
                created.append(pb.CreatedEpisode(request_id=create.request_id, error=too_many))
                continue
            try:
                ep = self.create(create, await parsed_options(create))
            except Exception as exc:  # a bad request, or a bug: this create fails alone, the stream goes on
                if not isinstance(exc, SessionError):
                    log.exception("PlaySeats: create failed")
                created.append(pb.CreatedEpisode(request_id=create.request_id, error=to_status(exc)))
                continue
            self.owned.add(ep.episode_id)
            self._join(ep, ep.tokens.values())  # every played seat of the new episode, in one call
            created.append(pb.CreatedEpisode(episode=created_pb(ep), request_id=create.request_id))
        for ref in req.join:
            if clock() > yield_at:
                await asyncio.sleep(0)
                yield_at = clock() + HANDLE_SLICE_S
            try:
                ep = self.manager.get(ref.episode_id)
                seat = self.manager.seat_of(ep, ref.token)
            except SessionError as exc:
                results.append(pb.SeatActResult(episode_id=ref.episode_id, error=to_status(exc)))
                continue
            self._join(ep, (seat,))
        # Each act is applied in this loop's own frame (no method call per act of its own): the episode, then
        # ``EpisodeManager.act`` (the checks and the rules), each proto field read once.
        manager = self.manager
        episodes = manager.episodes
        rejected_only = self.rejected_results_only
        for act in req.acts:
            if clock() > yield_at:
                await asyncio.sleep(0)
                yield_at = clock() + HANDLE_SLICE_S
            episode_id = act.episode_id
            token = act.token
            turn_id = act.turn_id
            try:
                hosted = episodes.get(episode_id)
                if hosted is None:
                    hosted = manager.get(episode_id)  # raises NotFoundError, with its message
                # ``HasField`` first: reading ``act.action`` of a text answer (the common case) builds an
                # empty sub-message object only to find its kind empty
                if act.HasField("action") and act.action.kind:
                    result = manager.act(hosted, token, turn_id, action_from_pb(act.action), "")
                else:
                    result = manager.act(hosted, token, turn_id, None, act.raw_text)
            except SessionError as exc:
                known = episodes.get(episode_id)
                seat = known.tokens.get(token, 0) if known is not None else 0
                results.append(
                    pb.SeatActResult(episode_id=episode_id, seat=seat, turn_id=turn_id, error=to_status(exc))
                )
                continue
            accepted = result.accepted
            if accepted and rejected_only:
                continue
            seat = hosted.tokens[token]
            out = pb.SeatActResult(
                episode_id=episode_id, seat=seat, turn_id=turn_id, accepted=accepted, reason=result.reason,
                defaulted=result.defaulted, duplicate=result.duplicate,
            )  # fmt: skip
            if result.action is not None:
                out.action.CopyFrom(action_to_pb(result.action))
            results.append(out)
            if not (accepted or result.defaulted):
                # re-prompt: the same turn id is due again, now with feedback
                joined = self.joined.get(episode_id)
                if joined is not None:
                    joined.sent.pop(seat, None)
                    self.dirty.add(episode_id)

    def _join(self, ep: Episode, seats: Iterable[int]) -> None:
        """This stream plays ``seats`` of ``ep`` from now on (a join: one seat; a create: all its played
        seats at once)."""
        joined = self.joined.get(ep.episode_id)
        if joined is None:
            joined = self.joined[ep.episode_id] = _Joined(ep)
            ep.listeners.add(self.on_change)
        joined_seats, sent = joined.seats, joined.sent
        for seat in seats:
            joined_seats.add(seat)
            sent.pop(seat, None)  # a (re-)join sends the seat's pending decision again
        self.dirty.add(ep.episode_id)

    def decisions(self, out: Any) -> None:
        """Append to ``out`` (the response's repeated ``decisions``) the observations of joined seats
        whose decision is new since the last message, and every joined seat's final observation once
        its episode ends."""
        observation = self.observations.observation
        include_text = self.include_text
        messages = not self.omit_messages
        delta = include_text and self.prompt_delta
        final_text = include_text and not self.omit_final_text
        joined_by_id = self.joined
        for episode_id in self.dirty:
            joined = joined_by_id.get(episode_id)
            if joined is None:
                continue
            ep = joined.ep
            if ep.closed or ep.env.done:  # ``ep.done`` without the property call
                for seat in sorted(joined.seats):
                    if delta and final_text:
                        self._delta_observation(joined, seat, out, messages)
                    else:  # ``omit_final_text``: the seat's longest prompt is not even rendered
                        observation(ep, seat, None, final_text, out, messages)
                self._forget(joined)
                continue
            sent, seats = joined.sent, joined.seats
            open_turns = ep.open_turns.items()
            if open_turns <= sent.items():  # every open turn already sent (the rest of a vote): a C loop
                continue
            for seat, turn_id in open_turns:
                if sent.get(seat) != turn_id and seat in seats:
                    sent[seat] = turn_id
                    if delta:
                        self._delta_observation(joined, seat, out, messages)
                    else:
                        observation(ep, seat, None, include_text, out, messages)
        self.dirty.clear()

    def _delta_observation(self, joined: _Joined, seat: int, out: Any, messages: bool) -> None:
        """The seat's observation appended to ``out`` with its prompt as the part after what it shares
        with the seat's previous prompt on this stream (``PlaySeatsRequest.prompt_delta``): text = the
        rest, ``text_shared_prefix_bytes`` = the shared part's UTF-8 length."""
        ep = joined.ep
        o = ep.env.observe(seat)
        msg = self.observations.observation(ep, seat, o, False, out, False)
        text = o.text
        if messages:
            msg.messages.add(role="user", content=text)
        ascii_text = text.isascii()
        last = joined.prompts.get(seat)
        if last is None:
            msg.text = text
            joined.prompts[seat] = (text, -1 if ascii_text else len(text.encode("utf-8")))
            return
        prev, prev_bytes = last
        k = shared_prefix(prev, text)
        if ascii_text:
            shared, total = k, -1
        else:  # UTF-8 lengths from the short differing parts only: the prefix is the previous prompt's
            shared = k if prev_bytes < 0 else prev_bytes - len(prev[k:].encode("utf-8"))
            total = shared + len(text[k:].encode("utf-8"))
        msg.text = text[k:] if k else text
        if shared:
            msg.text_shared_prefix_bytes = shared
        joined.prompts[seat] = (text, total)

    def _forget(self, joined: _Joined) -> None:
        ep = joined.ep
        del self.joined[ep.episode_id]
        ep.listeners.discard(self.on_change)
        if ep.episode_id in self.owned:
            self.owned.discard(ep.episode_id)
            if self.close_finished:
                self.manager.release(ep)

    def detach(self) -> None:
        for joined in self.joined.values():
            joined.ep.listeners.discard(self.on_change)
