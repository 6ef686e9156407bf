"""OpenAI-compatible HTTP front over the same ``PolicyRegistry`` as the gRPC service.

Why a hand-rolled HTTP/1.1 server: neither FastAPI/uvicorn nor aiohttp is installed in the service's
environment, and the surface is four JSON routes. It speaks enough HTTP for OpenAI clients, httpx and
curl: one request per connection (``Connection: close``), ``Content-Length`` bodies, no streaming (SSE).

Routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions`` (``prompt`` as a
string or as a list of token ids), ``GET /health``. The ``model`` field names the policy id.
Extensions beyond OpenAI's schema, for RL callers: each choice carries ``token_ids``; responses carry
``prompt_token_ids``, ``policy_version`` and ``prompt_compressed``; ``top_k`` is accepted.
Auth: when an API key is configured, requests need ``Authorization: Bearer <key>`` (401 otherwise).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from typing import Any

from wolfpack_inference.backends.base import ErrorCode, InferenceError, Result
from wolfpack_inference.policies import PolicyRegistry, make_sampling

log = logging.getLogger(__name__)
_HTTP_STATUS = {
    ErrorCode.INVALID_ARGUMENT: 400, ErrorCode.NOT_FOUND: 404, ErrorCode.FAILED_PRECONDITION: 412,
    ErrorCode.UNAVAILABLE: 503, ErrorCode.UNIMPLEMENTED: 501, ErrorCode.INTERNAL: 500,
}  # fmt: skip
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            412: "Precondition Failed", 413: "Payload Too Large", 500: "Internal Server Error",
            501: "Not Implemented", 503: "Service Unavailable"}  # fmt: skip
MAX_BODY = 32 * 1024 * 1024


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HttpFront:
    """``await front.start("127.0.0.1", 0)`` returns the bound port; ``await front.stop()``."""

    def __init__(self, registry: PolicyRegistry, api_key: str = "") -> None:
        self.registry = registry
        self.api_key = api_key
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        status, payload = 200, {}
        try:
            method, path, headers, body = await _read_request(reader)
            self._check_auth(headers)
            status, payload = 200, await self._route(method, path, body)
        except HttpError as exc:
            status, payload = exc.status, _error(str(exc), "invalid_request_error")
        except InferenceError as exc:
            status, payload = _HTTP_STATUS[exc.code], _error(str(exc), exc.code.value.lower())
        except Exception as exc:
            log.exception("http request failed")
            status, payload = 500, _error(f"internal error: {exc}", "internal")
        data = json.dumps(payload).encode()
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n")  # fmt: skip
        try:
            writer.write(head.encode() + data)
            await writer.drain()
        finally:
            writer.close()

    def _check_auth(self, headers: dict[str, str]) -> None:
        if not self.api_key:
            return
        given = headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise HttpError(401, "missing or wrong API key (Authorization: Bearer <key>)")

    async def _route(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        path = path.split("?", 1)[0].rstrip("/")
        if method == "GET" and path == "/health":
            return {"status": "ok"}
        if method == "GET" and path == "/v1/models":
            return {"object": "list", "data": [
                {"id": p.policy_id, "object": "model", "owned_by": "wolfpack", "version": p.version}
                for p in self.registry.list()
            ]}  # fmt: skip
        if path in ("/v1/chat/completions", "/v1/completions"):
            if method != "POST":
                raise HttpError(405, f"{path} takes POST")
            return await self._complete(body, chat=path.endswith("chat/completions"))
        raise HttpError(404, f"no route {method} {path}")

    async def _complete(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        if body.get("stream"):
            raise HttpError(400, "stream=true is not supported by this front; use gRPC GenerateStream")
        policy = self.registry.get(str(body.get("model", "")))
        stop = body.get("stop") or []
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        sampling = make_sampling(
            max_tokens=16 if max_tokens is None else int(max_tokens),
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            top_k=int(body.get("top_k", 0) or 0),
            stop=[stop] if isinstance(stop, str) else list(stop),
            seed=body.get("seed"),
            n=int(body.get("n", 1)),
            logprobs=bool(body.get("logprobs")),
        )
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list):
                raise HttpError(400, "messages must be a list")
            # OpenAI chat completions always answer as the assistant (no continuation of a last turn)
            prep = policy.prepare(sampling, messages=[{"role": str(m.get("role", "")),
                                  "content": str(m.get("content", ""))} for m in messages],
                                  add_generation_prompt=True)  # fmt: skip
        else:
            prompt = body.get("prompt", "")
            if isinstance(prompt, str):
                tok = policy.backend.tokenizer
                if tok is None:
                    raise HttpError(400, "this policy has no tokenizer: send prompt as token ids")
                ids = list(tok.encode(prompt, add_special_tokens=False)) if prompt else []
            else:
                ids = [int(t) for t in prompt]
            prep = policy.prepare(sampling, token_ids=ids)
        result = await policy.backend.generate(prep.request)
        return _response(result, policy.policy_id, chat, prep.compressed, policy.backend.tokenizer)


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


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind}}


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], dict[str, Any]]:
    line = (await reader.readline()).decode("latin-1").strip()
    parts = line.split()
    if len(parts) != 3:
        raise HttpError(400, "malformed request line")
    method, path = parts[0].upper(), parts[1]
    headers: dict[str, str] = {}
    while True:
        raw = (await reader.readline()).decode("latin-1")
        if raw in ("\r\n", "\n", ""):
            break
        key, _, value = raw.partition(":")
        headers[key.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    if length > MAX_BODY:
        raise HttpError(413, "body too large")
    body: dict[str, Any] = {}
    if length:
        try:
            parsed = json.loads(await reader.readexactly(length))
        except json.JSONDecodeError as exc:
            raise HttpError(400, f"body is not JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise HttpError(400, "body must be a JSON object")
        body = parsed
    return method, path, headers, body
