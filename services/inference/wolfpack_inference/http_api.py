"""OpenAI-compatible HTTP front over the same ``PolicyRegistry`` as the gRPC service.

Why aiohttp and not a hand-written parser: the front faces clients we do not control, and HTTP parsing
(request lines, header limits, chunked bodies, keep-alive, slow clients) is exactly what a well-kept
server library gets right; aiohttp is already a dependency. Limits: headers at most ``MAX_HEADERS``
fields of ``MAX_FIELD_BYTES``, bodies at most ``MAX_BODY`` bytes, a connection must complete its request
headers within ``HEADER_TIMEOUT_S`` (and is closed after as long idle between requests), at most
``MAX_CONNECTIONS`` open connections (``wolfpack.http_limits``: past it the oldest idle one is dropped, and
a connection that finds every other one busy reads a JSON 503 and is closed), a string ``prompt`` of at
most ``MAX_PROMPT_CHARS`` characters (a chat's messages: the same in all). The API key is checked from the
headers *before* any body is read.

Why the work leaves the event loop: the front shares its loop with the gRPC server, so parsing a large
body and tokenizing or rendering a prompt run in a worker thread (an 8 MB string prompt held every gRPC
caller for 21 s when it was tokenized on the loop). Why disconnects cancel: a client that goes away
(a dropped non-streaming request, an SSE stream closed after one event) cancels its handler, and with it
its rows in the engine batch; an SSE reader that stops reading is dropped once a write has waited
``WRITE_TIMEOUT_S``. Otherwise abandoned requests kept decoding and an honest request waited behind them.

Routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions`` (``prompt`` as a
string or as a list of token ids), ``GET /health``. The ``model`` field names the policy id.
``stream: true`` answers as OpenAI does: Server-Sent Events of ``chat.completion.chunk`` /
``text_completion`` objects, then ``data: [DONE]``.
Extensions beyond OpenAI's schema, for RL callers: each choice carries ``token_ids``; responses carry
``prompt_token_ids``, ``policy_version`` and ``prompt_compressed``; ``top_k`` is accepted.
Auth: when an API key is configured, requests need ``Authorization: Bearer <key>`` (401 otherwise);
without one the front only binds a loopback address. Errors are always ``{"error": {"message", "type",
"code"}}`` with status 400, 401, 404, 405, 408, 412, 413, 500, 501 or 503 (a refused connection's 503 too).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from wolfpack import auth, http_limits
from wolfpack_inference.backends.base import ErrorCode, InferenceError, Result
from wolfpack_inference.policies import (
    MAX_CHAT_MESSAGES,
    MAX_PROMPT_CHARS,
    MAX_PROMPT_TOKENS,
    Policy,
    PolicyRegistry,
    Prepared,
    make_sampling,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
_HTTP_STATUS = {
    ErrorCode.INVALID_ARGUMENT: 400, ErrorCode.NOT_FOUND: 404, ErrorCode.FAILED_PRECONDITION: 412,
    ErrorCode.UNAVAILABLE: 503, ErrorCode.UNIMPLEMENTED: 501, ErrorCode.INTERNAL: 500,
}  # fmt: skip
MAX_BODY = 8 * 1024 * 1024
MAX_HEADERS = 64
MAX_FIELD_BYTES = 8190
HEADER_TIMEOUT_S = 15.0
MAX_CONNECTIONS = 256
"""Open connections (at most a quarter of the process's descriptor limit): 1,100 idle connections, no key
needed, exhausted ``ulimit -n 1024`` and with it the gRPC server's accepts and health."""
BODY_TIMEOUT_S = 30.0
"""A request's body must arrive within this after its headers (408): a body sent a byte at a time would
hold a busy connection, which the connection cap never drops, for as long as the client likes."""
WRITE_TIMEOUT_S = 30.0
"""An SSE write that cannot go out within this (the client stopped reading) ends the stream and its
generation."""
PREPARE_THREADS = 2
"""Worker threads of the front's own pool (parsing, tokenizing, rendering, building answers): its own, so a
flood of HTTP work waits behind itself and never behind, or ahead of, the gRPC server's preparation."""
INLINE_BODY_BYTES = 64 * 1024
"""Bodies above this are parsed in a worker thread (an 8 MiB body takes ~0.1 s to parse and validate)."""


class HttpError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str = ""


class _Request(BaseModel):
    """The fields we read (OpenAI clients send more: ignored, as OpenAI's own server does); each is
    type-checked and range-checked here or in ``make_sampling`` with the field named."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: str = ""
    stream: StrictBool = False
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: StrictInt | None = 0
    stop: str | list[str] | None = None
    seed: StrictInt | None = None
    n: StrictInt = 1
    logprobs: StrictBool | None = None


class _ChatRequest(_Request):
    messages: Annotated[list[_Message], Field(max_length=MAX_CHAT_MESSAGES)]


class _CompletionRequest(_Request):
    prompt: str | Annotated[list[StrictInt], Field(max_length=MAX_PROMPT_TOKENS)] = ""


def _parse(model: type[_Request], raw: bytes) -> Any:
    try:
        body = http_limits.loads(raw) if raw else {}
    except (ValueError, UnicodeDecodeError) as exc:  # JsonTooDeep is a ValueError
        raise HttpError(400, f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise HttpError(400, "body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False)[:5]
        ]
        raise HttpError(400, "; ".join(problems)) from None


def _error_body(status: int, message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    if status >= 500:
        kind = "internal" if status == 500 else "unavailable"
    return {"error": {"message": message, "type": kind, "code": status}}


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response(_error_body(status, message, kind), status=status)


class HttpFront:
    """``await front.start("127.0.0.1", 0)`` returns the bound port; ``await front.stop()``."""

    def __init__(
        self, registry: PolicyRegistry, api_key: str = "", max_connections: int = MAX_CONNECTIONS
    ) -> None:
        self.registry = registry
        self.api_key = api_key.encode()
        self.max_connections = max_connections
        self.in_flight = 0
        """Completion requests being answered (parsed, prepared, generating or streaming): what a client
        that disconnects must take down with it."""
        self._runner: web.AppRunner | None = None
        self._pool = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="http-front")

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_BODY)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        return app

    async def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` (an empty host means 127.0.0.1, never every interface); without an API key
        only a loopback host is allowed."""
        host = host or "127.0.0.1"
        if not self.api_key and not auth.is_loopback(f"{host}:{port}"):
            raise PermissionError(
                f"the OpenAI-compatible front would listen on {host} without an API key: set "
                "WOLFPACK_INFERENCE_HTTP_API_KEY or bind 127.0.0.1"
            )
        self._runner = web.AppRunner(
            self.app(),
            handle_signals=False,
            access_log=None,
            keepalive_timeout=HEADER_TIMEOUT_S,  # armed at connect: also the header timeout
            max_line_size=MAX_FIELD_BYTES,
            max_field_size=MAX_FIELD_BYTES,
            max_headers=MAX_HEADERS,
            handler_cancellation=True,  # a client that goes away cancels its handler and its generation
            lingering_time=2.0,  # an unread body (a 408, a 413) is drained at most this long, then closed
        )
        await self._runner.setup()
        refused = {"error": {"message": "too many open connections; retry shortly", "type": "unavailable",
                             "code": 503}}  # fmt: skip
        self.max_connections = http_limits.cap_connections(
            self._runner, self.max_connections, http_limits.refusal(refused)
        )
        http_limits.json_errors(self._runner, _error_body)
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._pool.shutdown(wait=False, cancel_futures=True)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Key check first (nothing of the body is read before it), then one JSON error shape."""
        try:
            if self.api_key and request.path != "/health":
                given = request.headers.get("Authorization", "")
                key = given[7:].strip().encode() if given.lower().startswith("bearer ") else b""
                if not hmac.compare_digest(key, self.api_key):
                    raise HttpError(401, "missing or wrong API key (Authorization: Bearer <key>)", "authentication_error")  # fmt: skip
            response: web.StreamResponse = await handler(request)
            return response
        except HttpError as exc:
            response = _error(exc.status, str(exc), exc.kind)
            if exc.status == 408:
                response.force_close()  # the rest of the body may still come: the connection is spent
            return response
        except InferenceError as exc:
            return _error(_HTTP_STATUS[exc.code], str(exc), exc.code.value.lower())
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = (
                f"request body too large; the limit is {MAX_BODY} bytes" if exc.status == 413 else exc.reason
            )
            return _error(exc.status, message, "invalid_request_error")
        except Exception:
            log.exception("http request failed")
            return _error(500, "internal error", "internal")

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": p.policy_id, "object": "model", "owned_by": "wolfpack", "version": p.version}
            for p in self.registry.list()
        ]})  # fmt: skip

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, _ChatRequest, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, _CompletionRequest, chat=False)

    async def _complete(self, request: web.Request, model: type[_Request], chat: bool) -> web.StreamResponse:
        self.in_flight += 1
        try:
            try:
                raw = await asyncio.wait_for(request.read(), BODY_TIMEOUT_S)
            except TimeoutError:
                raise HttpError(408, f"the request body must arrive within {BODY_TIMEOUT_S:g} s") from None
            if len(raw) > INLINE_BODY_BYTES:
                body = await self._off_loop(_parse, model, raw)
            else:
                body = _parse(model, raw)
            return await self._answer(request, body, chat)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request, body: Any, chat: bool) -> web.StreamResponse:
        policy = self.registry.get(body.model)
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        stop = body.stop or []
        sampling = make_sampling(
            max_tokens=16 if max_tokens is None else max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k or 0,
            stop=[stop] if isinstance(stop, str) else list(stop),
            seed=body.seed,
            n=body.n,
            logprobs=bool(body.logprobs),
        )
        if not chat and isinstance(body.prompt, str) and len(body.prompt) > MAX_PROMPT_CHARS:
            raise HttpError(400, f"prompt: at most {MAX_PROMPT_CHARS} characters, got {len(body.prompt)}")
        prep = await self._off_loop(_prepare, policy, sampling, body, chat)
        if body.stream:
            if sampling.n != 1:
                raise HttpError(400, "n: streaming returns one completion; send n=1")
            return await _stream(request, policy, prep, chat)
        result = await policy.backend.generate(prep.request)
        # building the answer decodes every token for its logprobs (n=64 x thousands of tokens): off the loop
        answer = await self._off_loop(
            _answer_bytes, result, policy.policy_id, chat, prep.compressed, policy.backend.tokenizer
        )
        return web.Response(body=answer, content_type="application/json", charset="utf-8")


def _prepare(policy: Policy, sampling: Any, body: Any, chat: bool) -> Prepared:
    """The backend request of ``body`` (run in a worker thread: tokenizing and rendering are CPU work)."""
    if chat:
        # OpenAI chat completions always answer as the assistant (no continuation of a last turn)
        messages = [{"role": m.role, "content": m.content} for m in body.messages]
        return policy.prepare(sampling, messages=messages, add_generation_prompt=True)
    if isinstance(body.prompt, str):
        tok = policy.backend.tokenizer
        if tok is None:
            raise HttpError(400, "this policy has no tokenizer: send prompt as token ids")
        ids = list(tok.encode(body.prompt, add_special_tokens=False)) if body.prompt else []
    else:
        ids = list(body.prompt)
    return policy.prepare(sampling, token_ids=ids)


async def _stream(request: web.Request, policy: Any, prep: Any, chat: bool) -> web.StreamResponse:
    """OpenAI-style SSE: one ``data:`` event per chunk of new tokens, a final chunk with the finish
    reason, then ``data: [DONE]``. Errors after the first byte arrive as an ``error`` event. A write
    that waits ``WRITE_TIMEOUT_S`` (a reader that stopped reading) ends the stream: the generator is
    closed, which takes its row out of the engine batch."""
    created, ident = int(time.time()), f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    obj = "chat.completion.chunk" if chat else "text_completion"
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)

    async def send(payload: dict[str, Any] | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        await asyncio.wait_for(resp.write(f"data: {data}\n\n".encode()), WRITE_TIMEOUT_S)

    async def events() -> None:
        first = True
        chunks = policy.backend.stream(prep.request)
        try:
            async for ch in chunks:
                choice: dict[str, Any] = {"index": 0, "token_ids": ch.token_ids,
                                          "finish_reason": ch.finish.value if ch.finish else None}  # fmt: skip
                if chat:
                    choice["delta"] = {"content": ch.text, **({"role": "assistant"} if first else {})}
                else:
                    choice["text"] = ch.text
                if ch.logprobs:
                    choice["logprobs"] = {"token_logprobs": ch.logprobs}
                event: dict[str, Any] = {"id": ident, "object": obj, "created": created,
                                         "model": policy.policy_id, "choices": [choice],
                                         "policy_version": ch.version}  # fmt: skip
                if first:
                    event["prompt_token_ids"] = prep.request.prompt_ids
                    event["prompt_compressed"] = prep.compressed
                    first = False
                await send(event)
        except InferenceError as exc:
            error = {"message": str(exc), "type": exc.code.value.lower(), "code": _HTTP_STATUS[exc.code]}
            await send({"error": error})
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:  # the row leaves the engine batch now, not when the generator is collected
                with contextlib.suppress(Exception):
                    await aclose()
        await send("[DONE]")
        await resp.write_eof()

    try:
        await events()
    except (TimeoutError, ConnectionError):  # a reader that stopped reading, or went away
        if request.transport is not None:
            request.transport.close()
    return resp


def _answer_bytes(result: Result, model: str, chat: bool, compressed: bool, tok: Any) -> bytes:
    return json.dumps(_response(result, model, chat, compressed, tok)).encode()


def _response(result: Result, model: str, chat: bool, compressed: bool, tok: Any) -> dict[str, Any]:
    choices = []
    for i, c in enumerate(result.completions):
        choice: dict[str, Any] = {"index": i, "finish_reason": c.finish.value, "token_ids": c.token_ids}
        pieces = [tok.decode([t]) for t in c.token_ids] if tok is not None else [""] * len(c.logprobs)
        if chat:
            choice["message"] = {"role": "assistant", "content": c.text}
            choice["logprobs"] = {"content": [{"token": s, "logprob": lp} for s, lp in
                                              zip(pieces, c.logprobs, strict=False)]} if c.logprobs else None  # fmt: skip
        else:
            choice["text"] = c.text
            choice["logprobs"] = {"tokens": pieces, "token_logprobs": c.logprobs} if c.logprobs else None
        choices.append(choice)
    out_tokens = sum(len(c.token_ids) for c in result.completions)
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": result.prompt_tokens, "completion_tokens": out_tokens,
                  "total_tokens": result.prompt_tokens + out_tokens},
        "prompt_token_ids": result.prompt_ids,
        "policy_version": result.version,
        "prompt_compressed": compressed,
    }  # fmt: skip
