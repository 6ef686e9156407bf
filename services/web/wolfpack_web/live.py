"""Spectating: the episodes this web view may show, and the games it plays itself.

How spectating works (the environment's rule, not ours): the service credential (``WOLFPACK_ADMIN_SECRET``,
attached by ``wolfpack.rpc.channel`` to privileged methods only) opens ``ListEpisodes`` (every episode of
the environment, a bounded page at a time) and ``SpectateEpisode`` (the full view, every role and the whole
event log, of any episode by id). Neither takes a token, so a seat token never opens them. So the list shows
every game of the environment, whoever plays it (``wolfpack rollout``, the trainer, external agents, this
process), and any of them opens as spectator. The credential stays in the channel; the browser gets episode
ids and views, never a token or the credential.

Games this process starts (``start``: every seat external, played here by a paced random-legal bot, so a
person can follow the game) keep their admin token here, to read their last view and release them. An
admin token handed in (``register``, refused for seat tokens) works the same way, for an environment that
predates ``SpectateEpisode``.

Once an episode is over its last full view is kept (the environment may release it), so it can be
replayed; at most ``max_watched`` episodes are remembered, the oldest finished ones forgotten first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import grpc

from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.client import EnvironmentClient

log = logging.getLogger(__name__)

LIST_REUSE_S = 1.0
"""Listings within this of the last ``ListEpisodes`` (same filter and page) share its answer."""
LIST_PAGE = 50
"""Episodes per listing page (the environment bounds it at 200)."""
STATUS_FILTERS = {"": pb.EPISODE_STATUS_UNSPECIFIED, "running": pb.EPISODE_STATUS_RUNNING,
                  "finished": pb.EPISODE_STATUS_FINISHED}  # fmt: skip
VIEW_REUSE_S = 0.2
"""Polls within this of the last ``GetEpisode`` share its answer: the environment's load stays one call per
episode per 0.2 s however many pages watch it."""
MAX_EVENTS_PER_VIEW = 2_000
"""Events sent per poll; the page asks again from where it stopped."""
PACED = "paced-random"
"""``start``'s bots value for a game played here, slowly enough to watch live."""
SPEECHES = (
    "I have been watching Player {t} closely; something is off.",
    "I trust Player {t} for now.",
    "Let us not rush. Player {t}, what did you see last night?",
    "My vote goes where the evidence points: Player {t}.",
)


class SpectateError(Exception):
    """A refused spectating request: HTTP ``status``, a stable ``code`` and a message for the page."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class Watched:
    episode_id: str
    admin_token: str = field(repr=False)  # never logged, never sent to a browser; "" when spectated by id
    origin: str  # "started" (played here), "registered" or "environment" (opened by id from the list)
    game: str = ""
    variant: str = ""
    started_at: float = field(default_factory=time.time)
    final: pb.GetEpisodeResponse | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    error: str = ""
    recent: pb.GetEpisodeResponse | None = field(default=None, repr=False)  # the last view, for VIEW_REUSE_S
    recent_at: float = 0.0


def seat_json(s: pb.SeatState) -> dict[str, Any]:
    return {
        "seat": s.seat,
        "alive": s.alive,
        "role": s.role,
        "controller": common_pb2.SeatController.Name(s.controller).removeprefix("SEAT_CONTROLLER_").lower(),
        "outcome": common_pb2.OutcomeKind.Name(s.outcome).removeprefix("OUTCOME_KIND_").lower(),
    }


def event_json(e: pb.GameEvent) -> dict[str, Any]:
    return {
        "index": e.index,
        "kind": e.kind,
        "channel": e.channel,
        "actor": e.actor,
        "target": e.target,
        "text": e.text,
        "phase": e.phase,
        "round": e.round,
    }


def view_json(state: pb.GetEpisodeResponse, since: int, watched: Watched) -> dict[str, Any]:
    events = list(state.events)
    return {
        "episode_id": state.episode_id,
        "game": state.game.game_id,
        "variant": state.game.variant,
        "seed": state.seed,
        "phase": state.phase,
        "round": state.round,
        "done": state.done,
        "winner": state.winner,
        "origin": watched.origin,
        "error": watched.error,
        "seats": [seat_json(s) for s in state.seats],
        "events_total": len(events),
        "since": since,
        "events": [event_json(e) for e in events[since : since + MAX_EVENTS_PER_VIEW]],
    }


def random_legal(rng: random.Random, pace_s: float) -> Any:
    """An async decider: wait ``pace_s`` (so a person can follow), then a random legal action, with a
    short canned speech where the action needs text."""

    async def decide(obs: pb.Observation) -> common_pb2.Action:
        if pace_s > 0:
            await asyncio.sleep(pace_s)
        legal = rng.choice(list(obs.legal_actions))
        action = common_pb2.Action(kind=legal.kind)
        if legal.targets:
            action.target = rng.choice(list(legal.targets))
        if legal.needs_text:
            target = rng.choice([t for t in legal.targets] or [obs.seat]) + 1
            action.text = rng.choice(SPEECHES).format(t=target)
        return action

    return decide


class Spectator:
    """The episodes this process may show (see the module docstring)."""

    def __init__(self, client: EnvironmentClient, *, enabled: bool, max_games: int, max_watched: int) -> None:
        self.client = client
        self.enabled = enabled
        self.max_games = max_games
        self.max_watched = max_watched
        self._episodes: OrderedDict[str, Watched] = OrderedDict()
        self._listed: dict[tuple[str, str], tuple[float, pb.ListEpisodesResponse | None, str]] = {}

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise SpectateError(
                403, "SPECTATING_OFF", "spectating is switched off here (WOLFPACK_WEB_SPECTATE=false)"
            )

    def _remember(self, watched: Watched) -> None:
        self._episodes[watched.episode_id] = watched
        while len(self._episodes) > self.max_watched:
            old = next((w for w in self._episodes.values() if w.final is not None), None) or next(
                (w for w in self._episodes.values() if w.origin == "environment"), None
            )  # finished ones first, then ones the environment keeps anyway (nothing to lose)
            if old is None:
                break
            del self._episodes[old.episode_id]

    def playing(self) -> int:
        return sum(1 for w in self._episodes.values() if w.task is not None and not w.task.done())

    async def games(self) -> list[pb.GameInfo]:
        return await self.client.list_games()

    async def start(self, game_id: str, variant: str, seed: int, pace_s: float, bots: str = PACED) -> Watched:
        """Create an episode and show it. ``bots`` ``PACED``: every seat external, played here by a random
        legal-move bot, ``pace_s`` per decision, to be watched live. Else the game's scripted bot of that
        name in every seat: the environment plays it to the end inside the create call (the same game
        ``wolfpack play GAME --seed SEED --bots BOTS`` prints), ready to replay at once."""
        self._check_enabled()
        if self.playing() >= self.max_games:
            raise SpectateError(
                429, "TOO_MANY_GAMES", f"{self.max_games} games are already playing here; wait for one to end"
            )
        games = {g.game_id: g for g in await self.games()}
        if game_id not in games:
            raise SpectateError(
                400, "INVALID_ARGUMENT", f"unknown game {game_id!r}; games: {', '.join(sorted(games))}"
            )
        variants = {v.name: v for v in games[game_id].variants}
        if variant not in variants:
            raise SpectateError(
                400,
                "INVALID_ARGUMENT",
                f"unknown variant {variant!r} of {game_id}; variants: {', '.join(variants)}",
            )
        if bots != PACED and bots not in games[game_id].bots:
            raise SpectateError(
                400, "INVALID_ARGUMENT",
                f"unknown bots {bots!r} for {game_id}; bots: {', '.join([PACED, *games[game_id].bots])}",
            )  # fmt: skip
        if bots == PACED:
            seats = tuple(range(variants[variant].num_seats))
            created = await self.client.create_episode(game_id, variant, seed, external_seats=seats)
        else:
            created = await self.client.create_episode(game_id, variant, seed, default_bot=bots)
        watched = Watched(created.episode_id, created.admin_token, "started", game_id, variant)
        if created.seat_tokens:
            watched.task = asyncio.create_task(self._play(watched, created.seat_tokens, seed, pace_s))
        else:  # every seat scripted: it is over already
            watched.final = await self.client.get_episode(created.episode_id, created.admin_token)
            await self.client.close_episode(created.episode_id, created.admin_token)
        self._remember(watched)
        log.info("web: started a game", extra={"episode_id": created.episode_id, "game": game_id})
        return watched

    async def _play(self, watched: Watched, tokens: dict[int, str], seed: int, pace_s: float) -> None:
        rng = random.Random(seed)
        try:
            await asyncio.gather(
                *(
                    self.client.seat(watched.episode_id, t).play(random_legal(rng, pace_s))
                    for t in tokens.values()
                )
            )
            watched.final = await self.client.get_episode(watched.episode_id, watched.admin_token)
            await self.client.close_episode(watched.episode_id, watched.admin_token)  # release it there
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as exc:
            watched.error = f"the game stopped: {exc.code().name}: {exc.details()}"
            log.warning(
                "web: a game stopped", extra={"episode_id": watched.episode_id, "code": exc.code().name}
            )
        except Exception as exc:  # the page shows why; the web view goes on
            watched.error = f"the game stopped: {type(exc).__name__}"
            log.exception("web: a game stopped", extra={"episode_id": watched.episode_id})

    async def register(self, episode_id: str, token: str) -> Watched:
        """Remember an episode another client created, given its admin token. A seat token is refused:
        it opens that seat's view only, and never the spectator's."""
        self._check_enabled()
        try:
            await self.client.seat(episode_id, token).observation()
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                raise
        else:
            raise SpectateError(
                403,
                "PERMISSION_DENIED",
                "that is a seat token: only the episode's admin token opens the spectator view",
            )
        state = await self.client.get_episode(episode_id, token)  # PERMISSION_DENIED unless admin
        watched = Watched(episode_id, token, "registered", state.game.game_id, state.game.variant)
        if state.done:
            watched.final = state
        self._remember(watched)
        return watched

    async def _full_view(self, watched: Watched) -> pb.GetEpisodeResponse:
        if watched.admin_token:
            return await self.client.get_episode(watched.episode_id, watched.admin_token)
        return await self.client.spectate(watched.episode_id)

    async def view(self, episode_id: str, since: int) -> dict[str, Any]:
        """The full view of ``episode_id`` from event ``since`` on. An episode this process does not know
        yet is opened by id (``SpectateEpisode``) and remembered only once the environment has shown it:
        an unknown id (NOT_FOUND, 404) leaves nothing behind."""
        self._check_enabled()
        now = time.monotonic()
        watched = self._episodes.get(episode_id)
        if watched is None:
            first = await self.client.spectate(episode_id)
            watched = Watched(episode_id, "", "environment", first.game.game_id, first.game.variant)
            watched.recent, watched.recent_at = first, now
            if first.done:
                watched.final = first
            self._remember(watched)
            return view_json(first, since, watched)
        state = watched.final
        if state is None and watched.recent is not None and now - watched.recent_at < VIEW_REUSE_S:
            state = watched.recent
        if state is None:
            state = await self._full_view(watched)
            watched.recent, watched.recent_at = state, now
            if state.done and (watched.task is None or watched.task.done()):
                watched.final = state
        return view_json(state, since, watched)

    async def listing(self, status: str = "", page_token: str = "") -> dict[str, Any]:
        """One page of the environment's episodes (newest first), each marked with what this process
        knows of it (``origin``, a game's error), and on the first page the finished games kept here that
        the environment has released since. When the environment refuses the list (this web view has no
        credential, or the environment predates ``ListEpisodes``), the games known here and why."""
        self._check_enabled()
        key = (status, page_token)
        now = time.monotonic()
        cached = self._listed.get(key)
        if cached is not None and now - cached[0] < LIST_REUSE_S:
            resp: pb.ListEpisodesResponse | None = cached[1]
            problem = cached[2]
        else:
            try:
                resp, problem = (
                    await self.client.list_episodes(LIST_PAGE, page_token, STATUS_FILTERS[status]),
                    "",
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (
                    grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                ):  # fmt: skip
                    raise  # a bad page token: the caller's 400
                resp, problem = (
                    None,
                    f"the environment's episodes are not listed: {exc.code().name}: {exc.details()}",
                )
            self._listed = {key: (now, resp, problem)}  # one entry: the page most recently asked for
        out: list[dict[str, Any]] = []
        listed = set()
        for e in resp.episodes if resp is not None else ():
            known = self._episodes.get(e.episode_id)
            listed.add(e.episode_id)
            out.append(
                {
                    "episode_id": e.episode_id, "game": e.game.game_id, "variant": e.game.variant, "seed": e.seed,
                    "done": e.status == pb.EPISODE_STATUS_FINISHED, "winner": e.winner, "phase": e.phase,
                    "round": e.round, "num_seats": e.num_seats, "played_seats": e.num_played_seats,
                    "created_at": e.created_at.ToJsonString(),
                    "origin": known.origin if known is not None else "environment",
                    "error": known.error if known is not None else "",
                }
            )  # fmt: skip
        if not page_token:
            for w in reversed(self._episodes.values()):
                done = w.final is not None
                if (
                    w.episode_id in listed
                    or (status == "running" and done)
                    or (status == "finished" and not done)
                ):
                    continue
                if resp is not None and not done and not w.error:
                    continue  # running but not on this page: the environment lists it further down
                out.append(
                    {
                        "episode_id": w.episode_id, "game": w.game, "variant": w.variant, "done": done,
                        "winner": w.final.winner if w.final is not None else "", "origin": w.origin,
                        "error": w.error,
                    }
                )  # fmt: skip
        return {"episodes": out, "next_page_token": resp.next_page_token if resp else "", "problem": problem}

    async def close(self) -> None:
        for watched in self._episodes.values():
            if watched.task is not None and not watched.task.done():
                watched.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await watched.task
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await self.client.close_episode(watched.episode_id, watched.admin_token)
