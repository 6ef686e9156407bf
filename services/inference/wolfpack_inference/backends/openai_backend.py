"""A remote OpenAI-compatible chat endpoint as a policy (strong-model opponents, judges).

What it cannot do: return token ids. The remote server tokenizes with a tokenizer we do not have, so
completions carry **empty** ``token_ids`` (and logprobs only when the server returns them, aligned to
its own tokens). Such policies are opponents, never trained policies. The API key is read from the
environment variable *named* in the policy config at request time; it is never logged or returned.

Robustness: one ``httpx.AsyncClient`` with a timeout, a semaphore bounding concurrent calls, and retries
with exponential backoff on connection errors, 429 and 5xx.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from wolfpack_inference.backends.base import (
    Backend,
    Completion,
    ErrorCode,
    Finish,
    InferenceError,
    Request,
    Result,
    StreamChunk,
)
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.prompts import strip_think

log = logging.getLogger(__name__)
_FINISH = {"stop": Finish.STOP, "length": Finish.LENGTH}


class OpenAIBackend(Backend):
    name = "openai"
    chat_only = True

    @classmethod
    def from_config(cls, cfg: PolicyConfig, cache_dir: Path) -> OpenAIBackend:
        """Remote: no model files to prepare."""
        return cls(cfg)

    def __init__(self, cfg: PolicyConfig) -> None:
        import httpx

        if not cfg.base_url:
            raise InferenceError(ErrorCode.INVALID_ARGUMENT, f"policy {cfg.policy_id}: base_url is required")
        self.cfg = cfg
        self.model = cfg.remote_model or cfg.model
        self.version = cfg.version
        self.max_positions = cfg.context_budget
        self._sem = asyncio.Semaphore(cfg.max_concurrency)
        self._client = httpx.AsyncClient(base_url=cfg.base_url.rstrip("/"), timeout=cfg.timeout_s)

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.cfg.api_key_env, "") if self.cfg.api_key_env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _body(self, request: Request) -> dict[str, Any]:
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.model,
            "messages": request.messages or [],
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "n": s.n,
        }
        if s.stop:
            body["stop"] = list(s.stop)
        if s.seed is not None:
            body["seed"] = s.seed
        if s.top_k:
            body["top_k"] = s.top_k  # vLLM/SGLang extension; OpenAI ignores unknown sampling fields
        if s.logprobs:
            body["logprobs"] = True
        return body

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        delay = 0.5
        for attempt in range(self.cfg.retries + 1):
            try:
                async with self._sem:
                    resp = await self._client.post("/chat/completions", json=body, headers=self._headers())
                if resp.status_code == 429 or resp.status_code >= 500:
                    raise httpx.HTTPStatusError(f"{resp.status_code}", request=resp.request, response=resp)
                if resp.status_code >= 400:
                    raise InferenceError(
                        ErrorCode.INVALID_ARGUMENT,
                        f"remote {self.cfg.base_url} rejected the request ({resp.status_code}): "
                        f"{resp.text[:300]}",
                    )
                data: dict[str, Any] = resp.json()
                return data
            except (httpx.TransportError, httpx.HTTPStatusError) as exc:
                if attempt == self.cfg.retries:
                    raise InferenceError(
                        ErrorCode.UNAVAILABLE, f"remote {self.cfg.base_url} failed: {exc!r}"
                    ) from None
                log.warning("remote call failed, retrying", extra={"attempt": attempt, "error": repr(exc)})
                await asyncio.sleep(delay * (1 + random.random()))
                delay *= 2
        raise AssertionError("unreachable")

    async def generate(self, request: Request) -> Result:
        if request.messages is None:
            raise InferenceError(ErrorCode.INVALID_ARGUMENT, "the openai backend takes chat prompts only")
        data = await self._post(self._body(request))
        completions = []
        for choice in data.get("choices", []):
            text = (choice.get("message") or {}).get("content") or ""
            lps = ((choice.get("logprobs") or {}).get("content")) or []
            completions.append(
                Completion(
                    token_ids=[],  # not available from a remote endpoint (see the module docstring)
                    logprobs=[float(x.get("logprob", 0.0)) for x in lps] if request.sampling.logprobs else [],
                    text=strip_think(text) if request.strip_think else text,
                    finish=_FINISH.get(choice.get("finish_reason") or "", Finish.STOP),
                )
            )
        usage = data.get("usage") or {}
        return Result(completions, self.version, [], int(usage.get("prompt_tokens", 0)))

    async def stream(self, request: Request) -> AsyncIterator[StreamChunk]:
        """One chunk with the whole completion: remote streaming would add SSE parsing for no caller."""
        result = await self.generate(request)
        c = result.completions[0]
        yield StreamChunk(c.token_ids, c.logprobs, c.text, self.version, c.finish)

    async def load(self, version: int, model_path: str = "", adapter_path: str = "") -> None:
        """A new version names another remote model (``model_path``), or just re-labels the same one."""
        if adapter_path:
            raise InferenceError(ErrorCode.INVALID_ARGUMENT, "remote policies cannot take LoRA adapters")
        self.model = model_path or self.model
        self.version = version

    async def close(self) -> None:
        await self._client.aclose()
