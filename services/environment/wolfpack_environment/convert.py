"""Proto <-> session values for the environment service: create requests -> started episodes, and the
create answer. No gRPC here: the servicer (``server.py``) and the PlaySeats state machine
(``play_stream.py``) both build on these, so a field is mapped in one place. The mapping of a session
itself (actions, events, observations with their legal-action cache, episode state, seat bindings) is
library code, ``wolfpack_games.session_proto``, shared with the trainer's in-process environment; it is
re-exported here for the servicer and the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from opentelemetry import context as otel_context

from wolfpack import telemetry
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.sessions import (
    Episode,
    EpisodeManager,
    NotFoundError,
    SessionError,
    parse_options,
)
from wolfpack_games import session_proto
from wolfpack_games.session import SeatPlan, SessionSetupError
from wolfpack_games.session_proto import (
    Observations,
    action_from_pb,
    action_to_pb,
    episode_state_pb,
)

__all__ = [
    "Create",
    "EpisodeFactory",
    "Observations",
    "action_from_pb",
    "action_to_pb",
    "created_pb",
    "episode_state_pb",
    "fingerprint",
    "parsed_options",
    "seat_plans",
]


def created_pb(ep: Episode) -> pb.CreateEpisodeResponse:
    """The CreateEpisodeResponse of a started episode: its id, one token per played seat, admin token."""
    resp = pb.CreateEpisodeResponse(
        episode_id=ep.episode_id, admin_token=ep.admin_token, num_seats=len(ep.env.possible_agents)
    )
    add = resp.seat_tokens.add
    for token, seat in sorted(ep.tokens.items(), key=itemgetter(1)):
        entry = add()  # then the fields: upb's keyword constructor path costs more per entry
        entry.seat = seat
        entry.token = token
    return resp


def fingerprint(request: pb.CreateEpisodeRequest) -> bytes:
    """What makes two create requests with one request_id the same request: everything but the trace
    context (a retry may be sent from a new span)."""
    if not request.HasField("trace"):
        return request.SerializeToString(deterministic=True)
    copy = pb.CreateEpisodeRequest()
    copy.CopyFrom(request)
    copy.ClearField("trace")
    return copy.SerializeToString(deterministic=True)


def seat_plans(request: pb.CreateEpisodeRequest) -> dict[int, SeatPlan]:
    """The request's seat bindings as plans (raises ``SessionError`` on a duplicate or missing controller)."""
    try:
        return session_proto.seat_plans(request)
    except SessionSetupError as exc:
        raise SessionError(str(exc)) from None


class EpisodeFactory:
    """Create requests -> started episodes: validation, options (YAML values), the scenario store
    (opened on first use) and the trace parent. Called by CreateEpisode and by PlaySeats creates."""

    def __init__(self, manager: EpisodeManager, scenario_store: str | None = None) -> None:
        self.manager = manager
        self.scenario_store_url = scenario_store
        self._store: Any = None

    def _scenario(self, scenario_id: str, game_id: str) -> Any:
        """Look a scenario up in the store and check it belongs to ``game_id``."""
        if self.scenario_store_url is None:
            raise SessionError("scenario_id needs a scenario store (WOLFPACK_SCENARIO_STORE)")
        from wolfpack_games.scenarios import open_store

        if self._store is None:
            self._store = open_store(self.scenario_store_url)
        scenario = self._store.get(scenario_id)
        if scenario is None:
            raise NotFoundError(f"no scenario {scenario_id!r} in {self.scenario_store_url}")
        if f"{scenario.family}_v1" != game_id:
            raise SessionError(f"scenario {scenario_id} is a {scenario.family} scenario, not {game_id}")
        return scenario

    def __call__(self, request: pb.CreateEpisodeRequest, options: dict[str, Any] | None = None) -> Episode:
        """Validate ``request`` and start its episode (raises ``SessionError`` on bad input). ``options``:
        the request's options already parsed (``await parsed_options(request)``), else parsed here."""
        if not request.game.game_id:
            raise SessionError("game.game_id is required")
        seats = seat_plans(request)
        # Option values are YAML scalars/collections sent as strings ("true", "[1, 2]", "revote").
        if options is None:
            options = parse_options(request.options)
        if request.scenario_id:
            options["scenario"] = self._scenario(request.scenario_id, request.game.game_id)
        # The episode span starts under the current context: the item's own trace context when the
        # caller sent one (PlaySeats creates many episodes over one call), else the call's.
        token = (
            otel_context.attach(telemetry.extract_from(request.trace)) if request.trace.traceparent else None
        )
        try:
            return self.manager.create(
                request.game.game_id, request.game.variant, request.seed, seats,
                default_bot=request.default_bot, language=request.language or "en",
                turn_timeout_s=request.turn_timeout_s, options=options, request_id=request.request_id,
                fingerprint=fingerprint(request) if request.request_id else b"",
            )  # fmt: skip
        finally:
            if token is not None:
                otel_context.detach(token)


Create = Callable[[pb.CreateEpisodeRequest, "dict[str, Any] | None"], Episode]
"""What PlaySeats needs to start an episode (an ``EpisodeFactory``)."""

OFF_LOOP_OPTION_CHARS = 2_048
"""Options longer than this in all are parsed in a worker thread: YAML of 64 KiB (the bound) takes
~0.1 s to build, during which the event loop (health checks, every other caller) would stand still."""


async def parsed_options(request: pb.CreateEpisodeRequest) -> dict[str, Any] | None:
    """The request's options parsed off the event loop when they are long (``OFF_LOOP_OPTION_CHARS``);
    ``None`` for short ones, which the factory parses inline for less than a thread hop costs."""
    raw = request.options
    if not raw or sum(len(v) for v in raw.values()) <= OFF_LOOP_OPTION_CHARS:
        return None
    return await asyncio.to_thread(parse_options, dict(raw))
