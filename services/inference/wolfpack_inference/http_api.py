"""OpenAI-compatible HTTP front over the same ``PolicyRegistry`` as the gRPC service.

Why aiohttp and not a hand-written parser: the front faces clients we do not control, and HTTP parsing
(request lines, header limits, chunked bodies, keep-alive, slow clients) is exactly what a well-kept
server library gets right; aiohttp is already a dependency. Limits: headers at most ``MAX_HEADERS``
fields of ``MAX_FIELD_BYTES``, bodies at most ``MAX_BODY`` bytes, a connection must complete its request
headers within ``HEADER_TIMEOUT_S``. The API key is checked from the headers *before* any body is read.

Routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions`` (``prompt`` as a
string or as a list of token ids), ``GET /health``. The ``model`` field names the policy id.
``stream: true`` answers as OpenAI does: Server-Sent Events of ``chat.completion.chunk`` /
``text_completion`` objects, then ``data: [DONE]``.
Extensions beyond OpenAI's schema, for RL callers: each choice carries ``token_ids``; responses carry
``prompt_token_ids``, ``policy_version`` and ``prompt_compressed``; ``top_k`` is accepted.
Auth: when an API key is configured, requests need ``Authorization: Bearer <key>`` (401 otherwise);
without one the front only binds a loopback address. Errors are always ``{"error": {"message", "type",
"code"}}`` with status 400, 401, 404, 405, 412, 413, 500, 501 or 503.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
import uuid
from typing import Annotated, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from wolfpack import auth
from wolfpack_inference.backends.base import ErrorCode, InferenceError, Result
from wolfpack_inference.policies import MAX_CHAT_MESSAGES, MAX_PROMPT_TOKENS, PolicyRegistry, make_sampling

log = logging.getLogger(__name__)
_HTTP_STATUS = {
    ErrorCode.INVALID_ARGUMENT: 400, ErrorCode.NOT_FOUND: 404, ErrorCode.FAILED_PRECONDITION: 412,
    ErrorCode.UNAVAILABLE: 503, ErrorCode.UNIMPLEMENTED: 501, ErrorCode.INTERNAL: 500,
}  # fmt: skip
MAX_BODY = 8 * 1024 * 1024
MAX_HEADERS = 64
MAX_FIELD_BYTES = 8190
HEADER_TIMEOUT_S = 15.0


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
        body = json.loads(raw) if raw else {}
    except (ValueError, UnicodeDecodeError) as exc:
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


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


class HttpFront:
    """``await front.start("127.0.0.1", 0)`` returns the bound port; ``await front.stop()``."""

    def __init__(self, registry: PolicyRegistry, api_key: str = "") -> None:
        self.registry = registry
        self.api_key = api_key.encode()
        self._runner: web.AppRunner | None = None

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
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

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
            return _error(exc.status, str(exc), exc.kind)
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
        body = _parse(_ChatRequest, await request.read())
        return await self._complete(request, body, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = _parse(_CompletionRequest, await request.read())
        return await self._complete(request, body, chat=False)

    async def _complete(self, request: web.Request, body: Any, chat: bool) -> web.StreamResponse:
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
        if chat:
            # OpenAI chat completions always answer as the assistant (no continuation of a last turn)
            messages = [{"role": m.role, "content": m.content} for m in body.messages]
            prep = policy.prepare(sampling, messages=messages, add_generation_prompt=True)
        else:
            if isinstance(body.prompt, str):
                tok = policy.backend.tokenizer
                if tok is None:
                    raise HttpError(400, "this policy has no tokenizer: send prompt as token ids")
                ids = list(tok.encode(body.prompt, add_special_tokens=False)) if body.prompt else []
            else:
                ids = list(body.prompt)
            prep = policy.prepare(sampling, token_ids=ids)
        if body.stream:
            if sampling.n != 1:
                raise HttpError(400, "n: streaming returns one completion; send n=1")
            return await _stream(request, policy, prep, chat)
        result = await policy.backend.generate(prep.request)
        return web.json_response(
            _response(result, policy.policy_id, chat, prep.compressed, policy.backend.tokenizer)
        )


async def _stream(request: web.Request, policy: Any, prep: Any, chat: bool) -> web.StreamResponse:
    """OpenAI-style SSE: one ``data:`` event per chunk of new tokens, a final chunk with the finish
    reason, then ``data: [DONE]``. Errors after the first byte arrive as an ``error`` event."""
    created, ident = int(time.time()), f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    obj = "chat.completion.chunk" if chat else "text_completion"
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)

    async def send(payload: dict[str, Any] | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        await resp.write(f"data: {data}\n\n".encode())

    first = True
    try:
        async for ch in policy.backend.stream(prep.request):
            choice: dict[str, Any] = {"index": 0, "token_ids": ch.token_ids,
                                      "finish_reason": ch.finish.value if ch.finish else None}  # fmt: skip
            if chat:
                choice["delta"] = {"content": ch.text, **({"role": "assistant"} if first else {})}
            else:
                choice["text"] = ch.text
            if ch.logprobs:
                choice["logprobs"] = {"token_logprobs": ch.logprobs}
            event: dict[str, Any] = {"id": ident, "object": obj, "created": created, "model": policy.policy_id,
                                     "choices": [choice], "policy_version": ch.version}  # fmt: skip
            if first:
                event["prompt_token_ids"] = prep.request.prompt_ids
                event["prompt_compressed"] = prep.compressed
                first = False
            await send(event)
    except InferenceError as exc:
        await send(
            {"error": {"message": str(exc), "type": exc.code.value.lower(), "code": _HTTP_STATUS[exc.code]}}
        )
    await send("[DONE]")
    await resp.write_eof()
    return resp


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
