"""HTTP + WebSocket gateway in front of the environment gRPC service, for agents that do not speak gRPC.

Why a gateway and not a second server inside the environment service: the environment service stays
one gRPC adapter over ``EpisodeManager`` (one source of truth for tokens, turn ids, timeouts and rate
limits), while this process only translates. Every rule an agent can break is still enforced by the
service, and its gRPC status codes are mapped to HTTP statuses one to one, so an HTTP agent and a gRPC
agent see the same errors for the same mistakes.

Why reset/step: most agent code (gym loops, LLM harnesses in any language) is written as
``obs = reset(); while not done: obs = step(action)``. The environment service is push-based instead
(an ``Observe`` stream), so ``reset`` and ``step`` here *wait* (long-poll, bounded by ``wait_s``) until
the seat must act or the game ends; an agent written as a plain loop never has to poll. The WebSocket
endpoint exposes the push model directly for agents that prefer it.

Why waits and connections are capped: a long-poll holds a connection (a file descriptor) and an Observe
stream for up to ``max_wait_s``; 60 s long-polls paced 20 ms apart exhausted the descriptors and starved
``/healthz``. Concurrent waits (long-polls and WebSockets) are capped per client address and overall, with
a 429/503 before any work; open connections are capped (``wolfpack.http_limits``: the oldest idle one is
dropped, a connection that finds every other one busy reads a JSON 503), and the wait cap stays below the
connection cap so short calls always find room.

The protocol is documented in ``gateway_protocol.md`` next to this file. Run it with
``python -m wolfpack_environment.gateway --port 8080 --env 127.0.0.1:50051`` (intended CLI:
``wolfpack gateway --port 8080``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn, TypeVar

import grpc
from aiohttp import WSMsgType, web
from pydantic import BaseModel, ConfigDict, Field, SecretStr, StringConstraints, ValidationError

from wolfpack import auth, http_limits, rpc
from wolfpack.settings import Settings, load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.client import EnvironmentClient

log = logging.getLogger(__name__)

DEFAULT_PORT = 8080
DEFAULT_MAX_BODY_BYTES = 256 * 1024
DEFAULT_WAIT_S = 20.0
MAX_WAIT_S = 60.0

HTTP_STATUS: Mapping[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
"""gRPC status -> HTTP status; anything else (INTERNAL, UNKNOWN, ...) is a 502: the upstream failed."""

_OUTCOMES: Mapping[int, str | None] = {
    common_pb2.OUTCOME_KIND_UNSPECIFIED: None,
    common_pb2.OUTCOME_KIND_WIN: "win",
    common_pb2.OUTCOME_KIND_LOSS: "loss",
    common_pb2.OUTCOME_KIND_DRAW: "draw",
    common_pb2.OUTCOME_KIND_ABORTED: "aborted",
}
_CONTROLLERS: Mapping[int, str] = {
    common_pb2.SEAT_CONTROLLER_UNSPECIFIED: "",
    common_pb2.SEAT_CONTROLLER_POLICY: "policy",
    common_pb2.SEAT_CONTROLLER_EXTERNAL: "external",
    common_pb2.SEAT_CONTROLLER_SCRIPTED: "scripted",
}


class ApiError(Exception):
    """An error answered as ``{"error": {"code", "message"}}`` with an HTTP status (or a WS error)."""

    def __init__(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


def _bad(message: str) -> NoReturn:
    raise ApiError(400, "INVALID_ARGUMENT", message)


def from_rpc_error(exc: grpc.aio.AioRpcError) -> ApiError:
    code = exc.code()
    return ApiError(HTTP_STATUS.get(code, 502), code.name, exc.details() or code.name)


def _parser_error_body(status: int, message: str) -> dict[str, Any]:
    """The error body of a request aiohttp's parser refused (or another low-level error)."""
    codes = {400: "INVALID_ARGUMENT", 413: "PAYLOAD_TOO_LARGE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
    code = codes.get(status, "INVALID_ARGUMENT" if status < 500 else "INTERNAL")
    return {"error": {"code": code, "message": message}}


def error_response(err: ApiError) -> web.Response:
    body = {"error": {"code": err.code, "message": err.message}}
    return web.json_response(body, status=err.status, headers=err.headers or None)


# --------------------------------------------------------------------------- proto -> JSON


def outcome_name(kind: int) -> str | None:
    return _OUTCOMES.get(kind)


def observation_json(obs: pb.Observation) -> dict[str, Any]:
    """The observation as JSON. ``legal_actions[].targets`` are 0-based seat indices (as ``action.target``);
    texts (``text``, ``messages``) speak of 1-based player numbers, exactly as the game renders them."""
    return {
        "episode_id": obs.episode_id,
        "seat": obs.seat,
        "turn_id": obs.turn_id,
        "phase": obs.phase,
        "round": obs.round,
        "role": obs.role,
        "your_turn": obs.your_turn,
        "done": obs.done,
        "outcome": outcome_name(obs.outcome),
        "feedback": obs.feedback,
        "legal_actions": [
            {"kind": la.kind, "targets": list(la.targets), "needs_text": la.needs_text}
            for la in obs.legal_actions
        ],
        "text": obs.text,
        "messages": [{"role": m.role, "content": m.content} for m in obs.messages],
    }


def action_json(action: common_pb2.Action) -> dict[str, Any] | None:
    if not action.kind:
        return None
    return {
        "kind": action.kind,
        "target": action.target if action.HasField("target") else None,
        "text": action.text,
    }


def act_result_json(resp: pb.ActResponse) -> dict[str, Any]:
    return {
        "accepted": resp.accepted,
        "reason": resp.reason,
        "action": action_json(resp.action),
        "defaulted": resp.defaulted,
        "duplicate": resp.duplicate,
        "done": resp.observation.done,
        "outcome": outcome_name(resp.observation.outcome),
        "observation": observation_json(resp.observation),
    }


def episode_json(resp: pb.GetEpisodeResponse) -> dict[str, Any]:
    return {
        "episode_id": resp.episode_id,
        "game": {"game_id": resp.game.game_id, "variant": resp.game.variant},
        "seed": resp.seed,
        "phase": resp.phase,
        "round": resp.round,
        "done": resp.done,
        "winner": resp.winner,
        "seats": [
            {
                "seat": s.seat,
                "alive": s.alive,
                "role": s.role,
                "controller": _CONTROLLERS.get(s.controller, ""),
                "outcome": outcome_name(s.outcome),
            }
            for s in resp.seats
        ],
        "events": [
            {
                "index": e.index, "kind": e.kind, "channel": e.channel, "actor": e.actor, "target": e.target,
                "text": e.text, "phase": e.phase, "round": e.round,
            }
            for e in resp.events
        ],
    }  # fmt: skip


# --------------------------------------------------------------------------- JSON -> proto (validated)


def parse_json_object(raw: str | bytes) -> dict[str, Any]:
    """A JSON object or a 400 that says what is wrong (never a 500 on bad input)."""
    if not raw:
        return {}
    try:
        value = http_limits.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:  # too deep a nesting is a ValueError too
        _bad(f"malformed JSON: {exc}")
    if not isinstance(value, dict):
        _bad(f"expected a JSON object, got {type(value).__name__}")
    return value


INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
MAX_TEXT_CHARS = 65_536
MAX_SEATS = 64

Name = Annotated[str, StringConstraints(max_length=128)]


class _Body(BaseModel):
    """Request bodies are strict: unknown fields are refused (a typo never silently does nothing),
    every number is range-checked against the proto field it fills, NaN/inf are refused."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class CreateBody(_Body):
    """``POST /v1/episodes`` (bounds documented in gateway_protocol.md)."""

    game: Name = ""
    game_id: Name = ""
    variant: Name = ""
    seed: int = Field(default=0, ge=0, le=UINT64_MAX)
    default_bot: Name = ""
    language: Annotated[str, StringConstraints(max_length=16)] = "en"
    turn_timeout_s: float = Field(default=0.0, ge=0.0, le=900.0)
    request_id: Name = ""
    external_seats: list[Annotated[int, Field(ge=0, lt=MAX_SEATS)]] = Field(default=[], max_length=MAX_SEATS)
    bots: dict[Name, Name] = Field(default={}, max_length=MAX_SEATS)
    policy_seats: dict[Name, Name] = Field(default={}, max_length=MAX_SEATS)
    options: dict[Name, Any] = Field(default={}, max_length=64)


class ActionBody(_Body):
    kind: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    target: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    text: Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)] = ""


class StepBody(_Body):
    """``POST .../step`` and the WebSocket's ``act`` message (``type``/``id`` only there)."""

    token: Annotated[str, StringConstraints(max_length=256)] = ""
    turn_id: int = Field(ge=0, le=INT64_MAX)
    action: ActionBody | None = None
    text: Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)] | None = None
    wait_s: float | None = Field(default=None, ge=0.0, le=3600.0)
    type: str | None = None
    id: Any = None


class ResetBody(_Body):
    token: Annotated[str, StringConstraints(max_length=256)] = ""
    wait_s: float | None = Field(default=None, ge=0.0, le=3600.0)


M = TypeVar("M", bound=_Body)


def validate_body(model: type[M], body: Mapping[str, Any]) -> M:
    """``body`` as ``model`` or a 400 naming each bad field (``external_seats.0: ...``)."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False, include_input=False)[:5]:
            where = ".".join(str(p) for p in err["loc"]) or "body"
            problems.append(f"{where}: {err['msg']}")
        _bad("; ".join(problems))


def _seat_key(key: object, what: str) -> int:
    text = str(key)
    if not text.isdigit() or len(text) > 3 or int(text) >= MAX_SEATS:
        _bad(f"{what}: seat keys must be seat indices 0..{MAX_SEATS - 1}, got {key!r}")
    return int(text)


def create_request(body: Mapping[str, Any]) -> pb.CreateEpisodeRequest:
    """``POST /v1/episodes`` body -> ``CreateEpisodeRequest``; the service validates the game itself."""
    b = validate_body(CreateBody, body)
    game = b.game or b.game_id
    if not game:
        _bad("'game' is required, e.g. \"werewolf_v1\" (see GET /v1/games)")
    req = pb.CreateEpisodeRequest(
        game=common_pb2.GameRef(game_id=game, variant=b.variant),
        seed=b.seed,
        default_bot=b.default_bot,
        language=b.language,
        turn_timeout_s=b.turn_timeout_s,
        request_id=b.request_id,
    )
    for seat in b.external_seats:
        req.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_EXTERNAL)
    for seat_key, name in b.bots.items():
        req.seats.add(
            seat=_seat_key(seat_key, "bots"), controller=common_pb2.SEAT_CONTROLLER_SCRIPTED, bot=name
        )
    for seat_key, name in b.policy_seats.items():
        binding = req.seats.add(
            seat=_seat_key(seat_key, "policy_seats"), controller=common_pb2.SEAT_CONTROLLER_POLICY
        )
        binding.policy.policy_id = name
    for k, v in b.options.items():
        # The service reads option values as YAML; JSON is YAML, so non-strings travel as their JSON.
        try:
            req.options[k] = v if isinstance(v, str) else json.dumps(v, allow_nan=False)
        except ValueError:
            _bad(f"options.{k}: must be finite JSON (no NaN or infinity)")
        except RecursionError:
            _bad(f"options.{k}: JSON nested too deeply")
    return req


def fill_act(req: pb.ActRequest, body: Mapping[str, Any]) -> None:
    """``turn_id`` plus either ``action`` (structured, 0-based ``target``) or ``text`` (parsed by the game)."""
    b = validate_body(StepBody, body)
    req.turn_id = b.turn_id
    if b.action is not None and b.text is not None:
        _bad("give either 'action' or 'text', not both")
    if b.action is not None:
        req.action.kind = b.action.kind
        req.action.text = b.action.text
        if b.action.target is not None:
            req.action.target = b.action.target
    elif b.text is not None:
        req.raw_text = b.text
    else:
        _bad("give 'action' (structured) or 'text' (free text the game parses)")


# --------------------------------------------------------------------------- the app


@dataclass(frozen=True)
class GatewayConfig:
    """Gateway knobs; defaults suit agents on the open internet (bodies are small, waits bounded)."""

    env_target: str
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    default_wait_s: float = DEFAULT_WAIT_S
    max_wait_s: float = MAX_WAIT_S
    ws_heartbeat_s: float = 20.0
    header_timeout_s: float = 15.0  # a connection must complete a request's headers within this
    body_timeout_s: float = 30.0  # and its body within this after the headers (408)
    max_connections: int = 512
    """Open connections (at most a quarter of ``ulimit -n``): past it the oldest connection with no request
    in progress is dropped; when every one is busy the new one reads a JSON 503 and is closed."""
    max_waits: int = 256
    """Concurrent waits (long-polls with ``wait_s > 0`` and WebSockets) over all clients; past it 503."""
    max_waits_per_client: int = 64
    """Concurrent waits from one client address; past it 429."""


class WaitSlots:
    """Concurrent waits, overall and per client address. A wait is refused before any work (nothing is
    acted, nothing is read from the service), so a refused ``step`` loses nothing: send it again."""

    def __init__(self, total: int, per_client: int) -> None:
        self.total = total
        self.per_client = per_client
        self.held = 0
        self.by_client: dict[str, int] = {}

    @contextlib.contextmanager
    def hold(self, client: str) -> Iterator[None]:
        mine = self.by_client.get(client, 0)
        retry = {"Retry-After": "1"}
        if mine >= self.per_client:
            raise ApiError(
                429, "RESOURCE_EXHAUSTED",
                f"at most {self.per_client} concurrent waits (long-polls and WebSockets) per client; "
                "let one return first, or send wait_s=0",
                retry,
            )  # fmt: skip
        if self.held >= self.total:
            raise ApiError(
                503, "UNAVAILABLE", f"the gateway holds its limit of {self.total} concurrent waits; retry shortly",
                retry,
            )  # fmt: skip
        self.held += 1
        self.by_client[client] = mine + 1
        try:
            yield
        finally:
            self.held -= 1
            left = self.by_client[client] - 1
            if left:
                self.by_client[client] = left
            else:
                del self.by_client[client]


CLIENT_KEY = web.AppKey("wolfpack_env_client", EnvironmentClient)
CONFIG_KEY = web.AppKey("wolfpack_gateway_config", GatewayConfig)
WAITS_KEY = web.AppKey("wolfpack_gateway_waits", WaitSlots)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as a JSON body: ours, gRPC's (mapped), aiohttp's (404 route, 413 body) and
    unexpected ones (500, logged) — an agent's error handling only has to parse one shape."""
    try:
        return await handler(request)
    except ApiError as err:
        response = error_response(err)
        if err.status == 408:
            response.force_close()  # the rest of the body may still come: the connection is spent
        return response
    except grpc.aio.AioRpcError as exc:
        return error_response(from_rpc_error(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "PAYLOAD_TOO_LARGE"}.get(
            exc.status, "HTTP_ERROR"
        )
        message = exc.text or exc.reason
        if exc.status == 413:
            limit = request.app[CONFIG_KEY].max_body_bytes
            message = f"request body too large; the limit is {limit} bytes"
        return error_response(ApiError(exc.status, code, message))
    except Exception:
        log.exception("gateway: unexpected error", extra={"path": request.path})
        return error_response(ApiError(500, "INTERNAL", "internal gateway error"))


async def _body(request: web.Request) -> dict[str, Any]:
    """The JSON body, which must arrive within ``body_timeout_s`` of the headers (a body sent a byte at a
    time would otherwise hold a connection, busy and never dropped, for as long as the client likes)."""
    if not request.can_read_body:
        return {}
    limit = request.app[CONFIG_KEY].body_timeout_s
    try:
        raw = await asyncio.wait_for(request.read(), limit)
    except TimeoutError:
        raise ApiError(408, "REQUEST_TIMEOUT", f"the request body must arrive within {limit:g} s") from None
    return parse_json_object(raw)


def _token(request: web.Request, body: Mapping[str, Any] | None = None) -> str:
    """The token from ``Authorization: Bearer``, the JSON body or ``?token=`` (browsers' WebSockets
    cannot set headers, hence the query)."""
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        token = auth[7:].strip()
    else:
        given = (body or {}).get("token")
        token = (given if isinstance(given, str) else "") or request.query.get("token", "")
    if not token:
        raise ApiError(
            401, "UNAUTHENTICATED", "a token is required (body 'token', ?token= or Authorization: Bearer)"
        )
    return token


def _wait_s(request: web.Request, body: Mapping[str, Any]) -> float:
    cfg = request.app[CONFIG_KEY]
    raw: Any = body.get("wait_s", request.query.get("wait_s"))
    if raw is None:
        return cfg.default_wait_s
    try:
        value = float(raw)
    except (TypeError, ValueError, OverflowError):
        _bad("'wait_s' must be a number of seconds")
    if not math.isfinite(value):
        _bad("'wait_s' must be a finite number of seconds")
    return max(0.0, min(value, cfg.max_wait_s))


def wait_slot(request: web.Request, wait_s: float) -> contextlib.AbstractContextManager[None]:
    """A slot of ``WaitSlots`` for a call that may wait (``wait_s > 0``), taken before any work."""
    if wait_s <= 0:
        return contextlib.nullcontext()
    return request.app[WAITS_KEY].hold(request.remote or "")


async def wait_for_turn(
    client: EnvironmentClient, episode_id: str, token: str, current: pb.Observation, wait_s: float
) -> pb.Observation:
    """``current`` if the seat must act or the game is over; else the first observation of the Observe
    stream where that holds, or the latest one when ``wait_s`` runs out (``your_turn`` false: call again)."""
    if current.your_turn or current.done or wait_s <= 0:
        return current
    latest = current
    call = client.stub.Observe(pb.ObserveRequest(episode_id=episode_id, token=token))

    async def first_actionable() -> None:
        nonlocal latest
        async for resp in call:
            latest = resp.observation
            if latest.your_turn or latest.done:
                return

    try:
        await asyncio.wait_for(first_actionable(), wait_s)
    except TimeoutError:
        pass
    finally:
        call.cancel()
    return latest


async def list_games(request: web.Request) -> web.Response:
    games = await request.app[CLIENT_KEY].list_games()
    return web.json_response(
        {
            "games": [
                {
                    "game_id": g.game_id,
                    "description": g.description,
                    "variants": [
                        {"name": v.name, "num_seats": v.num_seats, "description": v.description}
                        for v in g.variants
                    ],
                    "bots": list(g.bots),
                }
                for g in games
            ]
        }
    )


async def create_episode(request: web.Request) -> web.Response:
    req = create_request(await _body(request))
    resp = await request.app[CLIENT_KEY].stub.CreateEpisode(req)
    return web.json_response(
        {
            "episode_id": resp.episode_id,
            "num_seats": resp.num_seats,
            "admin_token": resp.admin_token,
            "seat_tokens": [{"seat": t.seat, "token": t.token} for t in resp.seat_tokens],
        },
        status=201,
    )


async def reset(request: web.Request) -> web.Response:
    """The seat's welcome: rules and role are in ``observation.text``; waits until it must act."""
    body = await _body(request)
    validate_body(ResetBody, body)
    token = _token(request, body)
    episode_id = request.match_info["episode_id"]
    client = request.app[CLIENT_KEY]
    seat = client.seat(episode_id, token)
    wait_s = _wait_s(request, body)
    with wait_slot(request, wait_s):
        obs = await wait_for_turn(client, episode_id, token, await seat.observation(), wait_s)
        state = await client.get_episode(episode_id, token)
    return web.json_response(
        {
            "observation": observation_json(obs),
            "done": obs.done,
            "outcome": outcome_name(obs.outcome),
            "info": {
                "episode_id": episode_id,
                "seat": obs.seat,
                "player": obs.seat + 1,
                "role": obs.role,
                "game": {"game_id": state.game.game_id, "variant": state.game.variant},
                "num_seats": len(state.seats),
            },
        }
    )


async def step(request: web.Request) -> web.Response:
    """Act, then wait for the seat's next decision. A rejected answer returns at once with the
    re-prompt (same ``turn_id``, ``feedback`` set); an accepted one returns the next turn's observation."""
    body = await _body(request)
    token = _token(request, body)
    episode_id = request.match_info["episode_id"]
    req = pb.ActRequest(episode_id=episode_id, token=token)
    fill_act(req, body)
    client = request.app[CLIENT_KEY]
    wait_s = _wait_s(request, body)
    with wait_slot(request, wait_s):  # taken before the act: a refused step has changed nothing
        resp = await client.stub.Act(req)
        result = act_result_json(resp)
        if resp.accepted or resp.defaulted:
            obs = await wait_for_turn(client, episode_id, token, resp.observation, wait_s)
            result.update(observation=observation_json(obs), done=obs.done, outcome=outcome_name(obs.outcome))
    return web.json_response(result)


async def get_observation(request: web.Request) -> web.Response:
    """Long-poll for the seat's observation (``?wait_s=0`` for the current one without waiting)."""
    token = _token(request)
    episode_id = request.match_info["episode_id"]
    client = request.app[CLIENT_KEY]
    wait_s = _wait_s(request, {})
    with wait_slot(request, wait_s):
        current = await client.seat(episode_id, token).observation()
        obs = await wait_for_turn(client, episode_id, token, current, wait_s)
    return web.json_response(
        {"observation": observation_json(obs), "done": obs.done, "outcome": outcome_name(obs.outcome)}
    )


def _credential(request: web.Request) -> list[tuple[str, str]]:
    """The caller's service credential (``X-Wolfpack-Credential``), forwarded as is: the gateway holds no
    credential of its own, so spectating or closing a running episode through it needs the caller's."""
    given = request.headers.get("X-Wolfpack-Credential", "")
    if given and not (given.isascii() and given.isprintable()):  # not a credential, nor valid metadata
        raise ApiError(403, "PERMISSION_DENIED", "wrong service credential")
    return [(auth.METADATA_KEY, given)] if given else []


async def get_episode(request: web.Request) -> web.Response:
    token = _token(request)
    req = pb.GetEpisodeRequest(episode_id=request.match_info["episode_id"], token=token)
    resp = await request.app[CLIENT_KEY].stub.GetEpisode(req, metadata=_credential(request))
    return web.json_response(episode_json(resp))


async def close_episode(request: web.Request) -> web.Response:
    token = _token(request)
    req = pb.CloseEpisodeRequest(episode_id=request.match_info["episode_id"], token=token)
    resp = await request.app[CLIENT_KEY].stub.CloseEpisode(req, metadata=_credential(request))
    return web.json_response({"closed": resp.closed})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


# --------------------------------------------------------------------------- WebSocket


async def websocket(request: web.Request) -> web.StreamResponse:
    """Push model: observations as they happen, acts as messages. The token is checked *before* the
    upgrade, so a bad token or episode is a plain HTTP 403/404 with the usual JSON body."""
    token = _token(request)
    episode_id = request.match_info["episode_id"]
    cfg = request.app[CONFIG_KEY]
    with request.app[WAITS_KEY].hold(request.remote or ""):  # a socket is a wait for its whole life
        return await _websocket(request, token, episode_id, cfg)


async def _websocket(
    request: web.Request, token: str, episode_id: str, cfg: GatewayConfig
) -> web.StreamResponse:
    client = request.app[CLIENT_KEY]
    await client.seat(episode_id, token).observation()  # raises -> mapped HTTP error, no upgrade
    ws = web.WebSocketResponse(heartbeat=cfg.ws_heartbeat_s, max_msg_size=cfg.max_body_bytes)
    await ws.prepare(request)
    # Held while an act is answered: the act_result goes out before any later observation, and the
    # socket is not closed (game over) between an act and its result.
    act_lock = asyncio.Lock()

    async def send(message: dict[str, Any]) -> None:
        if not ws.closed:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_json(message)

    async def pump() -> None:
        call = client.stub.Observe(pb.ObserveRequest(episode_id=episode_id, token=token))
        try:
            async for resp in call:
                async with act_lock:
                    await send({"type": "observation", "observation": observation_json(resp.observation)})
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                err = from_rpc_error(exc)
                await send({"type": "error", "code": err.code, "message": err.message})
        finally:
            call.cancel()
        async with act_lock:
            await ws.close(code=1000, message=b"episode over")

    pump_task = asyncio.create_task(pump())
    try:
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                if msg.type == WSMsgType.BINARY:
                    await send(
                        {"type": "error", "code": "INVALID_ARGUMENT", "message": "send JSON text frames"}
                    )
                continue
            async with act_lock:
                await send(await _ws_message(client, episode_id, token, msg.data))
    finally:
        pump_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump_task
    return ws


async def _ws_message(client: EnvironmentClient, episode_id: str, token: str, data: str) -> dict[str, Any]:
    """One client message -> the reply; errors become ``{"type": "error"}`` and the socket stays open."""
    ref: object = None
    try:
        body = parse_json_object(data)
        ref = body.get("id")
        kind = body.get("type")
        if kind == "act":
            req = pb.ActRequest(episode_id=episode_id, token=token)
            fill_act(req, body)
            reply = {"type": "act_result", **act_result_json(await client.stub.Act(req))}
        elif kind == "observe":
            obs = await client.seat(episode_id, token).observation()
            reply = {"type": "observation", "observation": observation_json(obs)}
        elif kind == "ping":
            reply = {"type": "pong"}
        else:
            _bad(f"unknown message type {kind!r}; send 'act', 'observe' or 'ping'")
    except ApiError as err:
        reply = {"type": "error", "code": err.code, "message": err.message}
    except grpc.aio.AioRpcError as exc:
        mapped = from_rpc_error(exc)
        reply = {"type": "error", "code": mapped.code, "message": mapped.message}
    if ref is not None:
        reply["id"] = ref  # lets a client match replies to requests
    return reply


def create_app(
    env_target: str,
    settings: Settings | None = None,
    *,
    config: GatewayConfig | None = None,
) -> web.Application:
    """The gateway app; its gRPC channel opens on startup and closes on cleanup (it must live on the
    app's event loop)."""
    cfg = config or GatewayConfig(env_target=env_target)
    app = web.Application(middlewares=[errors_middleware], client_max_size=cfg.max_body_bytes)
    app[CONFIG_KEY] = cfg
    app[WAITS_KEY] = WaitSlots(cfg.max_waits, cfg.max_waits_per_client)

    async def channel(app: web.Application) -> AsyncIterator[None]:
        # The gateway's own channel never carries the service credential (see ``_credential``).
        own = (settings or load_settings()).model_copy(update={"admin_secret": SecretStr("")})
        async with EnvironmentClient(cfg.env_target, own) as client:
            app[CLIENT_KEY] = client
            yield

    app.cleanup_ctx.append(channel)
    app.router.add_get("/healthz", health)
    app.router.add_get("/v1/games", list_games)
    app.router.add_post("/v1/episodes", create_episode)
    app.router.add_get("/v1/episodes/{episode_id}", get_episode)
    app.router.add_delete("/v1/episodes/{episode_id}", close_episode)
    app.router.add_post("/v1/episodes/{episode_id}/reset", reset)
    app.router.add_post("/v1/episodes/{episode_id}/step", step)
    app.router.add_get("/v1/episodes/{episode_id}/observation", get_observation)
    app.router.add_get("/v1/episodes/{episode_id}/ws", websocket)
    return app


class RunningGateway:
    """A started gateway (tests, embedding): its bound port and ``stop()``."""

    def __init__(self, runner: web.AppRunner, host: str, port: int) -> None:
        self.runner = runner
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        await self.runner.cleanup()


def resolve_env_target(env_target: str | None, settings: Settings) -> str:
    """Explicit target, else ``WOLFPACK_ENVIRONMENT_ADDR``, else the stack's default address."""
    return env_target or settings.service_addr("environment")


async def start_gateway(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    env_target: str | None = None,
    *,
    settings: Settings | None = None,
    config: GatewayConfig | None = None,
) -> RunningGateway:
    """Bind and start the gateway (``port=0`` picks a free port); the caller owns ``stop()``."""
    settings = settings or load_settings()
    target = resolve_env_target(env_target, settings)
    app = create_app(target, settings, config=config or GatewayConfig(env_target=target))
    cfg = app[CONFIG_KEY]
    runner = web.AppRunner(
        app,
        handle_signals=False,
        access_log=None,
        # aiohttp closes a connection that has not completed a request within keepalive_timeout (it is
        # armed at connect and not reset by partial data): our header timeout against slow clients.
        keepalive_timeout=cfg.header_timeout_s,
        max_line_size=8190,
        max_field_size=8190,
        max_headers=64,
        # a client that goes away cancels its handler: its long-poll's slot and Observe stream go with it
        handler_cancellation=True,
        lingering_time=2.0,  # an unread body (a 408, a 413) is drained at most this long, then closed
    )
    await runner.setup()
    refused = {"error": {"code": "UNAVAILABLE", "message": "too many open connections; retry shortly"}}
    cap = http_limits.cap_connections(runner, cfg.max_connections, http_limits.refusal(refused))
    http_limits.json_errors(runner, _parser_error_body)
    waits = app[WAITS_KEY]
    waits.total = max(1, min(waits.total, cap // 2))  # waits never take every connection: /healthz has room
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    return RunningGateway(runner, host, int(bound))


async def serve_gateway(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    env_target: str | None = None,
    *,
    settings: Settings | None = None,
    config: GatewayConfig | None = None,
) -> None:
    """Run the gateway until SIGINT/SIGTERM (what ``wolfpack gateway`` will call)."""
    running = await start_gateway(host, port, env_target, settings=settings, config=config)
    target = config.env_target if config else resolve_env_target(env_target, settings or load_settings())
    log.info("gateway serving", extra={"url": running.url, "environment": target})
    print(f"wolfpack gateway on {running.url} -> environment {target}", flush=True)
    stop = rpc.stop_on_signals()
    try:
        await stop.wait()
    finally:
        await running.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m wolfpack_environment.gateway",
        description="HTTP + WebSocket gateway to the Wolfpack environment service (protocol: gateway_protocol.md).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = free)"
    )
    parser.add_argument(
        "--env",
        dest="env_target",
        default=None,
        help="environment service host:port (default WOLFPACK_ENVIRONMENT_ADDR or the stack default)",
    )
    parser.add_argument(
        "--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="request/WS message size limit"
    )
    parser.add_argument(
        "--max-wait-s", type=float, default=MAX_WAIT_S, help="upper bound of reset/step long-poll waits"
    )
    parser.add_argument(
        "--header-timeout-s", type=float, default=15.0, help="a connection must send its headers within this"
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=512,
        help="open connections; past it the oldest idle one is dropped (all busy: the new one gets a 503)",
    )
    parser.add_argument(
        "--max-waits", type=int, default=256, help="concurrent long-polls and WebSockets, all clients (503)"
    )
    parser.add_argument(
        "--max-waits-per-client", type=int, default=64, help="concurrent waits from one address (429)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    settings = load_settings()
    target = resolve_env_target(args.env_target, settings)
    cfg = GatewayConfig(
        env_target=target,
        max_body_bytes=args.max_body_bytes,
        max_wait_s=args.max_wait_s,
        header_timeout_s=args.header_timeout_s,
        max_connections=args.max_connections,
        max_waits=args.max_waits,
        max_waits_per_client=args.max_waits_per_client,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_gateway(args.host, args.port, target, settings=settings, config=cfg))


if __name__ == "__main__":
    main()
