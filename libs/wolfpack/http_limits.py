"""Connection caps and JSON parsing for the aiohttp servers that face clients we do not control (the
environment's gateway and the inference service's OpenAI-compatible front).

Why a hard connection cap: every TCP connection costs a file descriptor, and a process shares its
descriptors between the HTTP server and the gRPC server beside it. A flood of idle or half-sent
connections (no key is needed to open one) would otherwise exhaust ``ulimit -n`` and starve gRPC health
and every other caller. Past the cap the oldest connection with no request in progress is dropped (a
flood of idle connections then only pushes out its own kind); when every connection is busy the new one
is answered at once with a 503 in the server's own JSON error shape and closed, so the descriptor comes
straight back. The cap is also kept at a quarter of the process's descriptor limit.

Why a JSON helper: ``json.loads`` of a deeply nested document raises ``RecursionError``, which is not a
``ValueError``; without this the caller's mistake became a 500.

Why ``json_errors``: a request aiohttp's HTTP parser refuses (a bad request line, a header too long) never
reaches the app's middleware, and aiohttp answered it in plain text; a client's error handling should only
have to parse the server's one JSON shape.
"""

from __future__ import annotations

import asyncio
import json
import resource
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

ErrorBody = Callable[[int, str], dict[str, Any]]
"""``(status, message) -> JSON body``: a server's error shape."""


class JsonTooDeep(ValueError):
    """The document nests deeper than Python's parser can follow."""


def loads(raw: str | bytes) -> Any:
    """``json.loads``, with nesting too deep for the parser as ``JsonTooDeep`` (a ``ValueError``)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise JsonTooDeep("JSON nested too deeply") from None


def descriptor_cap(limit: int) -> int:
    """``limit``, at most a quarter of this process's soft descriptor limit (at least 1): the rest stays
    for gRPC, model files and outgoing channels."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return max(1, limit)
    return max(1, min(limit, soft // 4))


def refusal(body: dict[str, Any], status: int = 503, reason: str = "Service Unavailable") -> bytes:
    """A complete HTTP/1.1 response carrying ``body`` as JSON, closing the connection: what a refused
    connection reads before its socket closes."""
    payload = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(payload)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + payload


def cap_connections(runner: web.AppRunner, limit: int, refused: bytes) -> int:
    """Hold ``runner``'s open connections to ``descriptor_cap(limit)``; returns the cap in force.

    A new connection past the cap first drops the oldest connections with no request in progress (one
    still sending headers, or idle between requests); if every other connection is busy, the new one is
    sent ``refused`` (see ``refusal``) and closed."""
    cap = descriptor_cap(limit)
    server = runner.server
    if server is None:
        raise RuntimeError("cap_connections needs a runner after setup()")
    original = server.connection_made

    def connection_made(handler: Any, transport: asyncio.Transport) -> None:
        original(handler, transport)
        connections = server._connections  # insertion order: oldest first
        excess = len(connections) - cap
        for other in list(connections):
            if excess <= 0:
                return
            if other is not handler and not getattr(other, "_request_in_progress", True):
                _close(other, connections.get(other))
                excess -= 1
        if excess > 0:  # every other connection is busy: this one is refused
            transport.write(refused)
            _close(handler, transport)

    server.connection_made = connection_made  # type: ignore[method-assign]
    return cap


def _close(handler: Any, transport: asyncio.Transport | None) -> None:
    handler.force_close()
    if transport is not None:
        transport.close()


class _JsonErrorHandler(RequestHandler):
    """aiohttp's connection handler, answering its own errors (the parser's 400s, a 500 escaping every
    middleware) in the server's JSON shape; aiohttp still logs them and closes the connection."""

    __slots__ = ()

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        plain = super().handle_error(request, status, exc, message)
        shape: ErrorBody | None = getattr(self._manager, "wolfpack_error_body", None)
        if shape is None:
            return plain
        # the parser's message describes the request; a server error's text is never sent
        text = message if (message and status < 500) else HTTPStatus(status).phrase
        response = web.json_response(shape(status, text), status=status)
        response.force_close()
        return response


class _JsonErrorServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)


def json_errors(runner: web.AppRunner, body: ErrorBody) -> None:
    """Make ``runner``'s low-level HTTP errors answer ``body(status, message)`` as JSON (see the module
    docstring); call after ``setup()`` and before a site starts."""
    server = runner.server
    if server is None:
        raise RuntimeError("json_errors needs a runner after setup()")
    server.__class__ = _JsonErrorServer
    server.wolfpack_error_body = body  # type: ignore[attr-defined]
