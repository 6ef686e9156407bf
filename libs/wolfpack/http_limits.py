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
"""

from __future__ import annotations

import asyncio
import json
import resource
from typing import Any

from aiohttp import web


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
