"""``wolfpack web``: the aiohttp app (JSON API + static pages) and its start-up.

| route | what |
|---|---|
| ``GET /`` | the single page (``static/``: live, replay and training tabs, plain JS, no build step) |
| ``GET /api/episodes`` · ``POST /api/episodes`` · ``POST /api/episodes/watch`` · ``GET /api/episodes/{id}`` | spectating (``live.py``) |
| ``GET /api/stream`` · ``GET /api/stream/{entry_id}`` · ``POST /api/trajectory`` | replay (``replay.py``) |
| ``GET /api/runs`` · ``GET /api/runs/{name}/metrics`` · ``GET /api/runs/{name}/samples`` | training (``runs.py``) |
| ``GET /api/runs/{name}/episodes`` · ``GET /api/runs/{name}/episodes/{step}/{file}`` | a run's evaluated episodes (``Trajectory`` files) for the replay page |

Every error leaves as ``{"error": {"code", "message"}}`` with a 4xx status (5xx only for our own bugs,
logged here, never with a traceback to the client). Every input is bounded before use: body sizes, ids
by pattern, numbers by range. POSTs must be JSON (or a file upload) from this origin, so a page elsewhere
cannot drive them with a plain form.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web

from wolfpack import auth, rpc
from wolfpack.files import write_text_atomic
from wolfpack.settings import Settings
from wolfpack_environment.client import EnvironmentClient
from wolfpack_web import replay, runs
from wolfpack_web.live import PACED, STATUS_FILTERS, SpectateError, Spectator
from wolfpack_web.settings import WebSettings

log = logging.getLogger(__name__)

MAX_JSON_BYTES = 64 << 10
EPISODE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
PAGE_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # the environment's next_page_token, passed back as is
GRPC_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 403,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@dataclass
class Context:
    """What the handlers share: the spectator, the Redis URL of the trajectory stream, the run roots."""

    spectator: Spectator
    web: WebSettings
    stream_key: str
    redis_url: str | None
    run_roots: list[Path]
    redis: Any = None

    async def stream(self) -> Any:
        if not self.redis_url:
            raise ApiError(
                503,
                "NO_STREAM",
                "no Redis here: set WOLFPACK_REDIS_URL or start the stack with `wolfpack up`",
            )
        if self.redis is None:
            import redis.asyncio as aioredis

            self.redis = aioredis.from_url(self.redis_url, socket_timeout=5, socket_connect_timeout=5)
        return self.redis


CONTEXT = web.AppKey("wolfpack_web_context", Context)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """One error shape for every failure; no traceback leaves this process."""
    try:
        _allowed_host(request)
        response = await handler(request)
    except (ApiError, SpectateError) as err:
        response = _error(err.status, err.code, err.message)
    except (replay.ReplayError, runs.RunError) as err:
        response = _error(404 if isinstance(err, runs.RunError) else 400, type(err).__name__, str(err))
    except grpc.aio.AioRpcError as exc:
        status = GRPC_STATUS.get(exc.code(), 502)
        response = _error(status, exc.code().name, exc.details() or "the environment refused the call")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.reason if exc.status != 413 else "request body too large"
        response = _error(exc.status, "HTTP_ERROR", message)
    except Exception:
        log.exception("web: unexpected error", extra={"path": request.path})
        response = _error(500, "INTERNAL", "internal error in the web view (see its log)")
    response.headers.update(SECURITY_HEADERS)
    if response.status >= 400 and request.body_exists and not request.content.is_eof():
        response.force_close()  # a refused body is not read: close rather than drain it (e.g. 413)
    if request.path.startswith("/api/"):
        response.headers.setdefault("Cache-Control", "no-store")
    return response


def _allowed_host(request: web.Request) -> None:
    """Answer only requests addressed to this machine by a loopback name or the configured host: a page
    on another site that rebinds its own domain to 127.0.0.1 (DNS rebinding) would otherwise be same-origin
    with us and could read running games' hidden roles. Off with ``WOLFPACK_WEB_TRUST_NETWORK``."""
    settings = request.app[CONTEXT].web
    host = request.url.host or ""
    if settings.trust_network or host in ("localhost", settings.host) or auth.is_loopback(f"[{host}]:0"):
        return
    raise ApiError(403, "HOST_NOT_ALLOWED", "this web view answers requests to its own address only")


def _same_origin(request: web.Request) -> None:
    """POSTs only from our own page: a browser always sends ``Origin`` on them, and a script elsewhere
    cannot forge it."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        raise ApiError(403, "CROSS_ORIGIN", "requests from other sites are refused")


async def _json_body(request: web.Request) -> dict[str, Any]:
    _same_origin(request)
    if request.content_type != "application/json":
        raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE", "send the body as application/json")
    if (request.content_length or 0) > MAX_JSON_BYTES:
        raise ApiError(413, "PAYLOAD_TOO_LARGE", f"a JSON body is at most {MAX_JSON_BYTES} bytes")
    raw = await request.content.read(MAX_JSON_BYTES + 1)
    if len(raw) > MAX_JSON_BYTES:
        raise ApiError(413, "PAYLOAD_TOO_LARGE", f"a JSON body is at most {MAX_JSON_BYTES} bytes")
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "INVALID_JSON", "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "INVALID_JSON", "the body must be a JSON object")
    return body


def _int(value: Any, name: str, lo: int, hi: int, default: int | None = None) -> int:
    if value is None or value == "":
        if default is None:
            raise ApiError(400, "INVALID_ARGUMENT", f"{name} is required")
        return default
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ApiError(400, "INVALID_ARGUMENT", f"{name} must be an integer in [{lo}, {hi}]")
    try:
        number = int(value) if not isinstance(value, float) or math.isfinite(value) else None
    except ValueError:
        number = None
    if number is None or (isinstance(value, float) and number != value) or not lo <= number <= hi:
        raise ApiError(400, "INVALID_ARGUMENT", f"{name} must be an integer in [{lo}, {hi}]")
    return number


def _str(value: Any, name: str, max_len: int, pattern: re.Pattern[str] | None = None) -> str:
    if not isinstance(value, str) or not value or len(value) > max_len or not value.isprintable():
        raise ApiError(
            400, "INVALID_ARGUMENT", f"{name} must be a non-empty string of at most {max_len} characters"
        )
    if pattern is not None and not pattern.match(value):
        raise ApiError(400, "INVALID_ARGUMENT", f"{name} has characters that no {name} has")
    return value


def _episode_id(request: web.Request) -> str:
    return _str(request.match_info["episode_id"], "episode id", 128, EPISODE_ID)


# --- pages and health -------------------------------------------------------------------------------


STATIC = resources.files("wolfpack_web") / "static"
STATIC_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


async def index(request: web.Request) -> web.Response:
    return web.Response(body=(STATIC / "index.html").read_bytes(), content_type="text/html", charset="utf-8")


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    suffix = Path(name).suffix
    if not re.match(r"^[a-z0-9_-]{1,40}\.(js|css|html)$", name) or not (STATIC / name).is_file():
        raise ApiError(404, "NOT_FOUND", "no such file")
    return web.Response(body=(STATIC / name).read_bytes(), content_type=STATIC_TYPES[suffix], charset="utf-8")


async def health(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    return web.json_response(
        {"status": "SERVING", "spectate": ctx.spectator.enabled, "stream": bool(ctx.redis_url)}
    )


# --- live ----------------------------------------------------------------------------------------------


async def list_games(request: web.Request) -> web.Response:
    games = await request.app[CONTEXT].spectator.games()
    return web.json_response(
        {
            "games": [
                {
                    "game_id": g.game_id,
                    "variants": [{"name": v.name, "num_seats": v.num_seats} for v in g.variants],
                    "bots": [PACED, *g.bots],
                }
                for g in games
            ]
        }
    )


async def list_episodes(request: web.Request) -> web.Response:
    spectator = request.app[CONTEXT].spectator
    if not spectator.enabled:
        return web.json_response({"spectate": False, "episodes": []})
    status = request.query.get("status", "")
    if status not in STATUS_FILTERS:
        raise ApiError(400, "INVALID_ARGUMENT", "status must be empty (any), 'running' or 'finished'")
    page_token = request.query.get("page_token", "")
    if page_token:
        _str(page_token, "page_token", 64, PAGE_TOKEN)
    return web.json_response({"spectate": True, **await spectator.listing(status, page_token)})


async def start_episode(request: web.Request) -> web.Response:
    body = await _json_body(request)
    game = _str(body.get("game", "werewolf_v1"), "game", 64)
    variant = _str(body.get("variant", "9p"), "variant", 64)
    seed = _int(body.get("seed"), "seed", 0, 2**63 - 1, default=0)
    pace_ms = _int(body.get("pace_ms"), "pace_ms", 0, 5_000, default=300)
    bots = _str(body.get("bots", PACED), "bots", 64)
    watched = await request.app[CONTEXT].spectator.start(game, variant, seed, pace_ms / 1000, bots)
    return web.json_response({"episode_id": watched.episode_id}, status=201)


async def watch_episode(request: web.Request) -> web.Response:
    body = await _json_body(request)
    episode_id = _str(body.get("episode_id"), "episode id", 128, EPISODE_ID)
    token = _str(body.get("admin_token"), "admin_token", 256)
    if not token.isascii():
        raise ApiError(403, "PERMISSION_DENIED", "not an admin token")
    watched = await request.app[CONTEXT].spectator.register(episode_id, token)
    return web.json_response({"episode_id": watched.episode_id}, status=201)


async def get_episode(request: web.Request) -> web.Response:
    since = _int(request.query.get("since"), "since", 0, 10_000_000, default=0)
    view = await request.app[CONTEXT].spectator.view(_episode_id(request), since)
    return web.json_response(view)


# --- replay --------------------------------------------------------------------------------------------


async def list_stream(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    count = _int(request.query.get("count"), "count", 1, 200, default=50)
    redis = await ctx.stream()
    try:
        entries = await replay.recent_entries(redis, ctx.stream_key, count)
    except (OSError, ConnectionError) as exc:
        raise ApiError(503, "STREAM_UNAVAILABLE", f"cannot read the stream: {type(exc).__name__}") from None
    return web.json_response({"stream": ctx.stream_key, "entries": entries})


async def stream_entry(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    entry_id = request.match_info["entry_id"]
    if not replay.ENTRY_ID.match(entry_id):
        raise ApiError(400, "INVALID_ARGUMENT", "an entry id looks like 1712345678901-0")
    redis = await ctx.stream()
    try:
        traj = await replay.entry(redis, ctx.stream_key, entry_id)
    except (OSError, ConnectionError) as exc:
        raise ApiError(503, "STREAM_UNAVAILABLE", f"cannot read the stream: {type(exc).__name__}") from None
    if traj is None:
        raise ApiError(404, "NOT_FOUND", f"no entry {entry_id} on {ctx.stream_key} (trimmed, or never there)")
    return web.json_response(replay.trajectory_json(traj))


async def upload_trajectory(request: web.Request) -> web.Response:
    _same_origin(request)
    if request.content_type not in ("application/octet-stream", "application/json"):
        raise ApiError(
            415, "UNSUPPORTED_MEDIA_TYPE", "send the file as application/octet-stream or application/json"
        )
    limit = request.app[CONTEXT].web.max_upload_mb << 20
    if (request.content_length or 0) > limit:
        raise ApiError(413, "PAYLOAD_TOO_LARGE", f"a trajectory file is at most {limit >> 20} MiB")
    data = await request.content.read(limit + 1)
    if len(data) > limit:
        raise ApiError(413, "PAYLOAD_TOO_LARGE", f"a trajectory file is at most {limit >> 20} MiB")
    traj = await asyncio.to_thread(replay.parse_trajectory, data)
    return web.json_response(replay.trajectory_json(traj))


# --- training ------------------------------------------------------------------------------------------


async def list_runs(request: web.Request) -> web.Response:
    found = await asyncio.to_thread(runs.find_runs, request.app[CONTEXT].run_roots)
    return web.json_response({"runs": sorted(found)})


async def run_metrics(request: web.Request) -> web.Response:
    """Panels of a run; ``ETag`` from the file's size and mtime, so a page polling an idle run gets 304."""
    run = await asyncio.to_thread(runs.get_run, request.app[CONTEXT].run_roots, request.match_info["name"])
    try:
        st = run.metrics.stat()
    except OSError:
        raise ApiError(404, "NOT_FOUND", "the run has no metrics.jsonl") from None
    etag = f'"{st.st_size}-{st.st_mtime_ns}"'
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers={"ETag": etag})
    rows = await asyncio.to_thread(runs.read_rows, run.metrics)
    body = {
        "run": run.name,
        "updates": len(rows),
        "last_step": int(rows[-1]["step"]) if rows else None,
        "latest": runs.latest(
            rows, ("charts/reward_mean", "charts/win_rate", "eval/reward_mean", "eval/win_rate")
        ),
        "panels": runs.panels(rows),
    }
    return web.json_response(body, headers={"ETag": etag})


async def run_samples(request: web.Request) -> web.Response:
    run = await asyncio.to_thread(runs.get_run, request.app[CONTEXT].run_roots, request.match_info["name"])
    return web.json_response({"run": run.name, "samples": await asyncio.to_thread(runs.samples, run)})


async def run_episodes(request: web.Request) -> web.Response:
    run = await asyncio.to_thread(runs.get_run, request.app[CONTEXT].run_roots, request.match_info["name"])
    return web.json_response({"run": run.name, "episodes": await asyncio.to_thread(runs.eval_episodes, run)})


async def run_episode(request: web.Request) -> web.Response:
    """One evaluated episode as the replay page's trajectory JSON (the same shape as a stream entry)."""
    run = await asyncio.to_thread(runs.get_run, request.app[CONTEXT].run_roots, request.match_info["name"])
    step = _int(request.match_info["step"], "step", 0, 10**9 - 1)
    traj = await asyncio.to_thread(runs.read_episode, run, step, request.match_info["file"])
    return web.json_response(replay.trajectory_json(traj))


# --- app and start-up ----------------------------------------------------------------------------------


def resolve_redis_url(settings: Settings) -> str | None:
    """``WOLFPACK_REDIS_URL``, else the running stack's (``<run_dir>/up.json``), else none."""
    if settings.redis_url:
        return settings.redis_url
    try:
        return str(json.loads((settings.run_dir / "up.json").read_text())["redis_url"]) or None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def create_app(
    settings: Settings, web_settings: WebSettings, env_target: str | None = None
) -> web.Application:
    """The app; its gRPC channel opens on start-up and closes (stopping the games it plays) on clean-up."""
    app = web.Application(
        middlewares=[errors_middleware], client_max_size=(web_settings.max_upload_mb << 20) + 1024
    )
    target = env_target or settings.service_addr("environment")

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        async with EnvironmentClient(target, settings) as client:
            spectator = Spectator(
                client, enabled=web_settings.spectate, max_games=web_settings.max_games,
                max_watched=web_settings.max_watched,
            )  # fmt: skip
            ctx = Context(
                spectator, web_settings, settings.stream_trajectories, resolve_redis_url(settings),
                [settings.run_dir / "train", *web_settings.runs],
            )  # fmt: skip
            app[CONTEXT] = ctx
            try:
                yield
            finally:
                await spectator.close()
                if ctx.redis is not None:
                    await ctx.redis.aclose()

    app.cleanup_ctx.append(lifecycle)
    r = app.router
    r.add_get("/", index)
    r.add_get("/static/{name}", static)
    r.add_get("/healthz", health)
    r.add_get("/api/games", list_games)
    r.add_get("/api/episodes", list_episodes)
    r.add_post("/api/episodes", start_episode)
    r.add_post("/api/episodes/watch", watch_episode)
    r.add_get("/api/episodes/{episode_id}", get_episode)
    r.add_get("/api/stream", list_stream)
    r.add_get("/api/stream/{entry_id}", stream_entry)
    r.add_post("/api/trajectory", upload_trajectory)
    r.add_get("/api/runs", list_runs)
    r.add_get("/api/runs/{name}/metrics", run_metrics)
    r.add_get("/api/runs/{name}/samples", run_samples)
    r.add_get("/api/runs/{name}/episodes", run_episodes)
    r.add_get("/api/runs/{name}/episodes/{step}/{file}", run_episode)
    return app


class RunningWeb:
    """A started web view (the CLI, tests): its URL and ``stop()``."""

    def __init__(self, runner: web.AppRunner, host: str, port: int) -> None:
        self.runner, self.host, self.port = runner, host, port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    async def stop(self) -> None:
        await self.runner.cleanup()


def check_bind(web_settings: WebSettings) -> None:
    """The page shows hidden roles of running games: beyond loopback only when told the network is trusted."""
    if web_settings.spectate and not web_settings.trust_network and not auth.is_loopback(web_settings.addr):
        raise PermissionError(
            f"web: refusing to listen on {web_settings.addr} with spectating on: anyone reaching it would see "
            "hidden roles. Bind 127.0.0.1, set WOLFPACK_WEB_SPECTATE=false, or put an authenticating proxy in "
            "front and set WOLFPACK_WEB_TRUST_NETWORK=true."
        )


async def start_web(
    settings: Settings, web_settings: WebSettings, env_target: str | None = None
) -> RunningWeb:
    check_bind(web_settings)
    runner = web.AppRunner(
        create_app(settings, web_settings, env_target), handle_signals=False, access_log=None,
        keepalive_timeout=15, max_line_size=8190, max_field_size=8190,
        lingering_time=1.0,  # after refusing a big upload, discard the rest for 1 s (aiohttp's 10 s held shutdown)
    )  # fmt: skip
    await runner.setup()
    site = web.TCPSite(runner, web_settings.host, web_settings.port)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else web_settings.port
    return RunningWeb(runner, web_settings.host, int(port))


async def main(settings: Settings, web_settings: WebSettings, ready_file: Path | None = None) -> None:
    """Serve until SIGINT/SIGTERM; print the URL, and write ``{"service", "address", "url", "pid"}`` to
    ``ready_file`` once listening (how ``wolfpack up`` learns a port 0 gave)."""
    import os

    running = await start_web(settings, web_settings)
    print(f"wolfpack web on {running.url}", flush=True)
    log.info("web serving", extra={"url": running.url, "spectate": web_settings.spectate})
    if ready_file is not None:
        address = f"{running.host}:{running.port}"
        write_text_atomic(
            ready_file,
            json.dumps({"service": "web", "address": address, "url": running.url, "pid": os.getpid()}),
        )
    stop = rpc.stop_on_signals()
    try:
        await stop.wait()
    finally:
        await running.stop()
