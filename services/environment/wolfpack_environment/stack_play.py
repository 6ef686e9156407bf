"""``wolfpack play`` through a running stack: the same game as the in-process run, hosted by the stack's
environment service, so the web view that ``wolfpack up`` started can show it live.

Why the client still runs the bots: scripted bots read the whole engine (``bot(env, seat, rng)``), which
no seat token exposes, and a game the service played by itself would be over before anyone opened the
page (no pacing). So every seat is bound EXTERNAL and this module plays them all from a *mirror* engine
built from the same game, variant, seed and options, with the bots drawing from one ``random.Random(seed)``
in acting-seat order — the session rules' order (``wolfpack_games.session``), which gives the in-process
run's game. Each move goes to the service first and is applied to the mirror only after the service
answered it the same way (accepted or not); at the end the service's full event log must equal the
mirror's. The werewolf transcript is rendered from the *service's* log, so a transcript identical to
``--local``'s shows the service played the same game.

Loaded only when a stack runs (it imports gRPC): the in-process ``wolfpack play`` stays light.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wolfpack_games import GameEnv, get_game, make_game
from wolfpack_games.base import Event


class StackPlayError(RuntimeError):
    """The stack could not host the game, or it played differently from the mirror; the message says how."""


@dataclass(frozen=True)
class Stack:
    """What ``wolfpack play`` needs of a running ``wolfpack up``: its environment address and web URL."""

    environment: str
    web_url: str


def find_stack(run_dir: Path) -> Stack | None:
    """The stack ``wolfpack up`` runs for ``run_dir`` (its ``up.json``), or None when none runs there: no
    file, a launcher that is gone (a SIGKILLed one leaves its file behind), or no environment address.
    Pure file reads: callable before any heavy import."""
    try:
        state = json.loads((run_dir / "up.json").read_text())
        environment = str(state["services"]["environment"])
        pid = int(state.get("launcher_pid") or 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pid > 0:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, another user's
    return Stack(environment, str(state.get("web_url") or ""))


def watch_url(web_url: str, episode_id: str) -> str:
    """The web view's live page of one episode (the app's ``#/live/<id>`` route)."""
    from urllib.parse import quote

    return f"{web_url.rstrip('/')}/#/live/{quote(episode_id, safe='')}"


@dataclass
class StackGame:
    """A game played through the service: its episode id, the mirror engine, the service's final view."""

    episode_id: str
    env: GameEnv
    counts: dict[str, int]
    events: list[Event]
    winner: str


def _event_key(e: Event) -> tuple[object, ...]:
    return (e.index, e.kind, e.channel, e.actor, e.target, e.text, e.phase, e.round)


async def play_on_stack(
    stack: Stack,
    game_id: str,
    variant: str,
    seed: int,
    bots: str,
    language: str = "en",
    options: dict[str, Any] | None = None,
    *,
    pace_ms: int = 0,
    on_created: Callable[[str], None] | None = None,
) -> StackGame:
    """Play one game on ``stack``'s environment service with ``bots`` in every seat (see the module
    docstring); ``on_created(episode_id)`` runs once the episode exists, before the first move, and
    ``pace_ms`` waits after each move so a person can follow it live."""
    import asyncio  # here: ``find_stack`` is all a local ``wolfpack play`` needs of this module

    import grpc

    from wolfpack_environment.client import EnvironmentClient
    from wolfpack_games.session_proto import action_to_pb

    spec = get_game(game_id)
    bot = spec.bots[bots]
    mirror = make_game(game_id, variant)
    reset_options = dict(options or {})
    if game_id == "werewolf_v1":
        reset_options["language"] = language
    mirror.reset(seed=seed, options=reset_options)
    n = len(mirror.possible_agents)
    # The service parses each option value as YAML; JSON is YAML, so the values arrive as given.
    wire_options = {k: json.dumps(v) for k, v in (options or {}).items()}
    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    try:
        async with EnvironmentClient(stack.environment) as client:
            created = await client.create_episode(
                game_id, variant, seed, external_seats=tuple(range(n)), language=language,
                options=wire_options,
            )  # fmt: skip
            if created.num_seats != n:
                raise StackPlayError(
                    f"the service seated {created.num_seats} players, the local engine {n}: "
                    "different game versions? (play with --local)"
                )
            if on_created is not None:
                on_created(created.episode_id)
            seats = {s: client.seat(created.episode_id, t) for s, t in created.seat_tokens.items()}
            while not mirror.done:
                acting = mirror.acting_seats()
                for seat in acting:  # one list per round, as the session rules and play_game step
                    action = bot(mirror, seat, rng)
                    obs = await seats[seat].observation()
                    if not obs.your_turn or obs.done:
                        raise StackPlayError(
                            f"seat {seat + 1} is due locally but not on the service ({obs.phase}, round "
                            f"{obs.round}): a turn timed out or another client acted for it"
                        )
                    resp = await seats[seat].act(obs.turn_id, action_to_pb(action))
                    info = mirror.step_seat(seat, action)
                    reason = str(info.get("invalid_reason", ""))
                    if resp.accepted != (not reason):
                        raise StackPlayError(
                            f"seat {seat + 1}'s {action.kind}: the service says accepted={resp.accepted} "
                            f"({resp.reason!r}), the local engine {reason or 'valid'}"
                        )
                    counts["actions"] += 1
                    counts["invalid"] += bool(reason)
                    if pace_ms > 0:
                        await asyncio.sleep(pace_ms / 1000)
                counts["steps"] += 1
                if counts["steps"] > 100_000:
                    raise StackPlayError("game did not finish")
            final = await client.spectate(created.episode_id)
    except grpc.aio.AioRpcError as exc:
        raise StackPlayError(
            f"environment service at {stack.environment}: {exc.code().name}: {exc.details()}"
        ) from None
    events = [
        Event(e.index, e.kind, e.channel, e.actor, e.target, e.text, e.phase, e.round) for e in final.events
    ]
    if not final.done or [_event_key(e) for e in events] != [_event_key(e) for e in mirror.events]:
        raise StackPlayError(
            f"episode {created.episode_id}: the service's game differs from the local engine's "
            f"(done={final.done}, {len(events)} vs {len(mirror.events)} events)"
        )
    return StackGame(created.episode_id, mirror, dict(counts), events, final.winner)


def stack_transcript(game: StackGame, game_id: str, language: str, local: Callable[[GameEnv], str]) -> str:
    """Werewolf: rendered from the service's event log (the title from the episode's seats and seed).
    Scenario games render from their tracker, which only the engine holds: the mirror's, whose log was
    checked equal to the service's."""
    if game_id != "werewolf_v1":
        return local(game.env)
    from wolfpack_games.werewolf.render import load_pack, render_events

    pack = load_pack(language)
    title = str(pack["transcript_title"]).format(n=len(game.env.possible_agents), seed=game.env.seed)  # type: ignore[attr-defined]
    body = render_events(game.events, language, True)
    return "\n".join([title, "=" * 40, *body]) + "\n"
