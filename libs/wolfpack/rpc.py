"""gRPC bootstrap shared by every service (server) and every caller (client channels).

Server: one ``serve()`` builds an asyncio server with the standard health service, reflection, message
size limits, tracing and access-log interceptors; on SIGTERM/SIGINT it marks itself NOT_SERVING (load
balancers stop routing), then ``server.stop(grace)`` lets in-flight calls drain before exit.

Client: ``channel()`` returns an asyncio channel whose unary calls always have a deadline (the default,
``rpc_timeout_s``, is added when the caller gives none) and whose idempotent methods retry on UNAVAILABLE
through gRPC's service config, so a service restarting under ``wolfpack up`` does not fail a whole rollout.
Which methods are idempotent is read from the protos (``option idempotency_level``), not listed here.
Streaming calls (PlaySeats, Observe, GenerateBatch, PushWeights) get no default deadline: they last as
long as an episode or a whole rollout, so their callers pass ``timeout=`` when they want one.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import json
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from wolfpack import auth, errors, telemetry
from wolfpack.files import write_text_atomic
from wolfpack.settings import Settings

log = logging.getLogger(__name__)

Registrar = Callable[[grpc.aio.Server], Awaitable[Sequence[str]] | Sequence[str]]
"""Adds servicers to the server and returns their full service names (for health and reflection)."""


HTTP2_OPTIONS: list[tuple[str, int]] = []
"""HTTP/2 transport options every server and every channel of ``channel()`` get (both ends alike). Empty:
gRPC's defaults. Larger frames and stream windows (``grpc.http2.max_frame_size`` /
``grpc.http2.lookahead_bytes`` 4 MiB), ``grpc.http2.bdp_probe`` 0 and a 256 KiB
``grpc.experimental.tcp_read_chunk_size`` were measured on the environment's PlaySeats path (server +
client CPU per action, interleaved rounds next to an identical defaults row): none moved it beyond the
defaults-vs-defaults spread, so none is set (``bench/results/2026-11-27-env-service-cpu-2.md``;
``bench/env/bench_env_cpu.py --transports`` replaces this list to compare others)."""


def _transport_options(settings: Settings) -> list[tuple[str, int]]:
    """Message size limits and ``HTTP2_OPTIONS``: the options servers and channels share."""
    size = settings.grpc_max_message_mb * 1024 * 1024
    return [("grpc.max_send_message_length", size), ("grpc.max_receive_message_length", size), *HTTP2_OPTIONS]


HANDSHAKE_TIMEOUT_MS = 10_000
"""A connection that has not completed gRPC's HTTP/2 handshake by then is closed (grpc's default waits two
minutes, so idle sockets opened by anyone, no credential needed, could hold every file descriptor)."""
IDLE_CONNECTION_MS = 300_000
"""A connection with no call for this long is closed (GOAWAY; a client's channel reconnects on its next call)."""
MAX_CONNECTIONS = 2048
"""Incoming connections a server holds at once, at most a quarter of the soft descriptor limit; more are
closed at accept, so the process keeps descriptors for Redis, model files and its own channels."""


def connection_options() -> list[tuple[str, int]]:
    """Server options that bound what idle or half-open connections can hold (see the constants)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = MAX_CONNECTIONS if soft == resource.RLIM_INFINITY or soft <= 0 else min(MAX_CONNECTIONS, soft // 4)
    return [
        ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
        ("grpc.max_connection_idle_ms", IDLE_CONNECTION_MS),
        ("grpc.max_allowed_incoming_connections", max(8, cap)),
    ]


class BindError(OSError):
    """A server could not listen on its address: the port is taken, or the host is not this machine's."""


_ready_file: Path | None = None


def announce_bound_address(path: Path | None) -> None:
    """Have the next server this process starts write ``{"service", "address", "pid"}`` (JSON, replaced
    atomically) to ``path`` once it is bound and started. Why: with ``host:0`` the kernel picks the port
    at bind time, so the server itself is the only one that knows it; a caller that picked a "free" port
    beforehand and handed it over raced every other process for it. ``wolfpack serve --ready-file``
    sets this; ``wolfpack up`` reads the file back."""
    global _ready_file
    _ready_file = path


def _announce(service: str, address: str) -> None:
    global _ready_file
    path, _ready_file = _ready_file, None
    if path is None:
        return
    write_text_atomic(path, json.dumps({"service": service, "address": address, "pid": os.getpid()}))


class AccessLogInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """One structured log line per finished unary call: method, status code and milliseconds
    (DEBUG when OK, WARNING otherwise). Streaming calls are logged by their services. Wrapped handlers
    are cached per method: building one per call showed up in the per-request overhead."""

    def __init__(self) -> None:
        self._wrapped: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method  # type: ignore[attr-defined]
        cached = self._wrapped.get(method)
        if cached is not None:
            return cached
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner: Any = handler.unary_unary

        async def logged(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.perf_counter()
            try:
                return await inner(request, context)
            finally:
                code = context.code() or grpc.StatusCode.OK
                code_name = code.name if isinstance(code, grpc.StatusCode) else str(code)
                level = logging.DEBUG if code_name == "OK" else logging.WARNING
                if log.isEnabledFor(level):
                    ms = round((time.perf_counter() - started) * 1000, 2)
                    log.log(level, "rpc", extra={"method": method, "code": code_name, "ms": ms})

        wrapped = grpc.unary_unary_rpc_method_handler(
            logged,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
        self._wrapped[method] = wrapped
        return wrapped


class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """The one error-to-status mapping of every server (see ``wolfpack.errors``): a ``ServiceError``
    raised by a handler ends the call with its status and message; any other exception is logged with
    its traceback and ends it INTERNAL without internals. Covers all four call kinds; wrapped handlers
    are cached per method. Innermost of the server's interceptors, so the access log sees the status."""

    def __init__(self) -> None:
        self._wrapped: dict[str, Any] = {}

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        method = details.method  # type: ignore[attr-defined]
        cached = self._wrapped.get(method)
        if cached is not None:
            return cached
        handler = await continuation(details)
        if handler is None:
            return None
        kinds = {
            "unary_unary": grpc.unary_unary_rpc_method_handler,
            "stream_unary": grpc.stream_unary_rpc_method_handler,
            "unary_stream": grpc.unary_stream_rpc_method_handler,
            "stream_stream": grpc.stream_stream_rpc_method_handler,
        }
        for kind, make in kinds.items():
            inner = getattr(handler, kind)
            if inner is None:
                continue
            if kind.startswith("stream_"):
                inner = _checked_requests(inner)
            body = _mapped_stream(inner, method) if kind.endswith("_stream") else _mapped(inner, method)
            wrapped = make(
                body,
                request_deserializer=_lenient(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
            self._wrapped[method] = wrapped
            return wrapped
        return handler


class Undecodable:
    """What a request that does not parse as the method's message becomes (instead of an exception inside
    gRPC's own deserialization, which ends the call UNKNOWN "Unexpected DecodeError", a status no client
    expects): the handler wrapper answers it INVALID_ARGUMENT before any service code runs."""

    def __init__(self, exc: Exception) -> None:
        self.reason = f"{type(exc).__name__}: {exc}"


class UndecodableRequest(errors.ServiceError):
    code = "INVALID_ARGUMENT"

    def __init__(self, bad: Undecodable) -> None:
        super().__init__(f"the request is not a valid message of this method ({bad.reason})")


def _lenient(deserialize: Any) -> Any:
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # protobuf's DecodeError, or whatever else a parser raises on garbage
            return Undecodable(exc)

    return parse


def _checked_requests(inner: Any) -> Any:
    """A request-streaming handler whose iterator raises ``UndecodableRequest`` at a message that did
    not parse (the wrapper then answers INVALID_ARGUMENT)."""

    async def checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, Undecodable):
                raise UndecodableRequest(request)
            yield request

    def call(requests: Any, context: Any) -> Any:
        return inner(checked(requests), context)

    return call


async def _abort_with(context: Any, exc: Exception, method: str) -> None:
    if not isinstance(exc, errors.ServiceError):
        log.error("handler failed", exc_info=exc, extra={"method": method})
    await context.abort(errors.status_code(exc), errors.public_message(exc))


def _mapped(inner: Any, method: str) -> Any:
    async def call(request: Any, context: Any) -> Any:
        try:
            if isinstance(request, Undecodable):
                raise UndecodableRequest(request)
            return await inner(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort_with(context, exc, method)

    return call


def _mapped_stream(inner: Any, method: str) -> Any:
    """A response-streaming handler: an async generator function, a function returning an async
    iterator, or a coroutine that writes with ``context.write`` and returns None. Wrapped as an async
    generator, the form the outer interceptors (telemetry) expect."""

    async def call(request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            if isinstance(request, Undecodable):
                raise UndecodableRequest(request)
            responses = inner(request, context)
            if inspect.isawaitable(responses):
                responses = await responses
            if responses is None:
                return
            async for response in responses:
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort_with(context, exc, method)

    return call


class Server:
    """A running service: the grpc.aio server, its health servicer and its bound port."""

    def __init__(self, server: grpc.aio.Server, health_servicer: Any, port: int, names: Sequence[str]):
        self.server = server
        self.health = health_servicer
        self.port = port
        self.service_names = list(names)

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ["", *self.service_names]:
            await self.health.set(name, status)

    async def stop(self, grace: float | None) -> None:
        await self.set_serving(False)
        await self.server.stop(grace)


async def start_server(
    service: str,
    registrar: Registrar,
    settings: Settings,
    address: str | None = None,
    interceptors: Iterable[grpc.aio.ServerInterceptor] = (),
) -> Server:
    """Build, bind and start a server for ``service``; the caller owns its shutdown."""
    addr = address or settings.service_addr(service)
    credential = auth.from_settings(settings)
    auth.check_bind(credential, addr, service)  # no open privileged RPCs beyond loopback
    server = grpc.aio.server(
        interceptors=[
            # Outermost: the interceptors after it cache one wrapped handler per method, so a check placed
            # behind them would run for a method's first call only.
            auth.CredentialInterceptor(credential),
            *telemetry.server_interceptors(),
            AccessLogInterceptor(),
            *interceptors,
            ErrorInterceptor(),
        ],
        # No SO_REUSEPORT: with it (grpc's default on Linux) a second server on a taken port binds anyway
        # and the kernel splits connections between two unrelated processes; without it the bind fails.
        options=[*_transport_options(settings), ("grpc.so_reuseport", 0), *connection_options()],
    )
    result = registrar(server)
    names = list(await result if asyncio.iscoroutine(result) else result)  # type: ignore[arg-type]
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    try:
        port = server.add_insecure_port(addr)
    except RuntimeError:  # grpcio raises RuntimeError("Failed to bind to address ...") for a failed bind
        port = 0
    if port == 0:
        raise BindError(
            f"{service}: cannot listen on {addr}: the port is in use or the address is not this host's "
            f"(set WOLFPACK_{service.upper()}_ADDR or --address to another host:port; port 0 picks a free one)"
        )
    await server.start()
    running = Server(server, health_servicer, port, names)
    await running.set_serving(True)
    bound = f"{addr.rpartition(':')[0]}:{port}"
    log.info("serving", extra={"service": service, "address": bound})
    _announce(service, bound)
    return running


def stop_on_signals() -> asyncio.Event:
    """An event that SIGTERM (Kubernetes, ``wolfpack up``) or SIGINT (Ctrl-C) sets: what every
    long-running Wolfpack process waits on before its graceful shutdown."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


def tune_gc() -> None:
    """Freeze what start-up allocated (modules, stubs, registries) out of the cyclic collector and
    collect the youngest generation less often. A server allocates many short-lived objects per request
    (protos, result records); with the default threshold (700) the collector runs every few requests and
    re-walks the live heap on each older-generation pass. Measured as the server's own CPU time per action
    (less noisy than throughput on a shared machine): the environment service's ``play_episodes`` path,
    6 players, 256 episodes in flight, used 36.4 µs/action with the defaults and 32.1 µs with this
    (medians of 8 alternating 2 s cells, every cell lower; ``bench/results/2026-11-26-cpu-environment-refactor.md``).

    It also turns the collector back on: ``wolfpack serve`` starts with it off (``wolfpack.cli.serve``), since
    start-up allocates hundreds of thousands of long-lived objects (modules, classes, torch's operator
    tables) and the collector's passes over them while they pile up are wasted work; the one ``collect``
    here then finds the start-up's garbage."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    gc.enable()


def freeze_imports() -> None:
    """Move everything allocated so far out of the cyclic collector's reach, without a collection: for a
    server right after its imports (``wolfpack serve`` runs start-up with the collector off). Modules,
    classes and registries live as long as the process; what imports left as cyclic garbage (~10,000
    objects, a few MB, for the inference service's torch and transformers) stays with them. The one
    collection of ``tune_gc`` then walks only what set-up allocated after this (the inference service:
    0.03 s instead of 0.5 s of its start-up on a 2-core machine)."""
    gc.freeze()


async def serve(
    service: str,
    registrar: Registrar,
    settings: Settings,
    address: str | None = None,
    on_stop: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Run ``service`` until SIGTERM/SIGINT, then drain in-flight calls for ``grpc_grace_s`` and exit."""
    running = await start_server(service, registrar, settings, address)
    tune_gc()
    stop = stop_on_signals()
    try:
        await stop.wait()
        log.info("shutting down: draining in-flight calls", extra={"grace_s": settings.grpc_grace_s})
        started = time.monotonic()
        await running.stop(settings.grpc_grace_s)
        if on_stop is not None:
            await on_stop()
        log.info("stopped", extra={"drain_s": round(time.monotonic() - started, 3)})
    finally:
        await running.server.stop(0)


# --- client side -----------------------------------------------------------------------------------


class DefaultDeadlineInterceptor(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Gives every unary call a deadline: calls without ``timeout=`` get the default. Streams are left
    to their callers (an Observe stream lasts a whole episode, a PushWeights transfer or a GenerateBatch
    as long as its size needs): pass ``timeout=`` there. (A grpc.aio channel files an interceptor under
    the first call kind it implements only, so one class per kind.)"""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if details.timeout is None:
            details = grpc.aio.ClientCallDetails(
                method=details.method,
                timeout=self.timeout_s,
                metadata=details.metadata,
                credentials=details.credentials,
                wait_for_ready=details.wait_for_ready,
            )
        return await continuation(details, request)


def service_config(idempotent_methods: Mapping[str, Sequence[str]]) -> str:
    """gRPC service config JSON: retries on UNAVAILABLE for the listed idempotent methods
    (``{"wolfpack.v1.EnvironmentService": ["ListGames", "GetEpisode"]}``). It sets no timeout: a service
    config cannot tell unary from streaming methods, and a timeout there cut long-lived streams (PlaySeats of a whole rollout, Observe)
    after ``rpc_timeout_s``. Unary calls get their default deadline from ``DefaultDeadlineInterceptor``."""
    configs: list[dict[str, Any]] = []
    names = [{"service": s, "method": m} for s, methods in idempotent_methods.items() for m in methods]
    if names:
        configs.append(
            {
                "name": names,
                "retryPolicy": {
                    "maxAttempts": 4,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        )
    return json.dumps({"methodConfig": configs})


EXTERNAL_IDEMPOTENT_METHODS: dict[str, Sequence[str]] = {"grpc.health.v1.Health": ["Check"]}
"""Retry-safe methods of services whose protos are not ours (they carry no idempotency option)."""


def idempotent_methods() -> dict[str, list[str]]:
    """Every ``wolfpack.v1`` method whose proto says ``option idempotency_level = NO_SIDE_EFFECTS`` or
    ``IDEMPOTENT``, by full service name, plus ``EXTERNAL_IDEMPOTENT_METHODS``. Read from the generated
    descriptors of every ``*_service_pb2`` module, so marking a method in its proto is the one place that
    makes clients retry it; nothing here lists methods by hand."""
    import importlib
    import pkgutil

    from google.protobuf import descriptor_pb2

    import wolfpack.v1

    safe = (descriptor_pb2.MethodOptions.NO_SIDE_EFFECTS, descriptor_pb2.MethodOptions.IDEMPOTENT)
    out: dict[str, list[str]] = {k: list(v) for k, v in EXTERNAL_IDEMPOTENT_METHODS.items()}
    for info in pkgutil.iter_modules(wolfpack.v1.__path__):
        if not info.name.endswith("_service_pb2"):
            continue
        module = importlib.import_module(f"wolfpack.v1.{info.name}")
        for service in module.DESCRIPTOR.services_by_name.values():
            names = [m.name for m in service.methods if m.GetOptions().idempotency_level in safe]
            if names:
                out[service.full_name] = names
    return out


IDEMPOTENT_METHODS: dict[str, list[str]] = idempotent_methods()
"""Methods clients retry on UNAVAILABLE: reads, and writes idempotent by key (``Act`` by turn id)."""


def channel(target: str, settings: Settings, *, traced: bool = True) -> grpc.aio.Channel:
    """An asyncio channel to ``target`` with deadlines, retries, size limits and trace propagation."""
    options: list[tuple[str, Any]] = [
        *_transport_options(settings),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", service_config(IDEMPOTENT_METHODS)),
    ]
    interceptors: list[Any] = [
        DefaultDeadlineInterceptor(settings.rpc_timeout_s),
        *auth.client_interceptors(settings),
    ]
    if traced:
        interceptors = [*telemetry.client_interceptors(), *interceptors]
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)


async def check_health(target: str, timeout_s: float = 2.0, service: str = "") -> str:
    """Health status name of ``target`` ("SERVING", "NOT_SERVING", …) or "UNREACHABLE"."""
    async with grpc.aio.insecure_channel(target) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        try:
            resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return "UNREACHABLE"
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))
