"""Hypothesis over the HTTP front's streaming paths, on a real front (its own event loop in a thread) and
the tiny Qwen2: random chat and completion bodies with ``stream: true``, each read to the end or dropped
after a random number of events. Every answer is a documented status with the JSON error shape, or an SSE
stream whose events are JSON objects (chunks, or one ``error`` event) ending in ``data: [DONE]``; after
every example, streams that were dropped have ended on the server (disconnects cancel)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wolfpack_inference.http_api import HttpFront
from wolfpack_inference.policies import PolicyRegistry

from .conftest import tiny_config  # type: ignore[import-not-found]

pytestmark = pytest.mark.timeout(600)

EXAMPLES = int(os.environ.get("WOLFPACK_FUZZ_EXAMPLES", "25"))
STATUSES = {200, 400, 404, 412, 413}


class Front:
    """The front on an event loop of its own, so the synchronous Hypothesis test can call it."""

    def __init__(self, tiny_dir: Path, tmp_path: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.registry = PolicyRegistry.from_configs(
            [tiny_config("tiny", tiny_dir, context_budget=200)], tmp_path
        )
        self.front = HttpFront(self.registry)
        self.url = f"http://127.0.0.1:{self.run(self.front.start('127.0.0.1', 0))}"

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)

    def close(self) -> None:
        self.run(self.front.stop())
        self.run(self.registry.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


@pytest.fixture
def front(tiny_dir: Path, tmp_path: Path) -> Iterator[Front]:
    f = Front(tiny_dir, tmp_path)
    yield f
    f.close()


def body(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object with any subset of ``fields``, ``stream: true`` always."""
    return st.fixed_dictionaries({"stream": st.just(True)}, optional=fields)


SAMPLING: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["tiny", "nope"]), "max_tokens": st.integers(-1, 24),
    "temperature": st.one_of(st.just(0.0), st.floats(0.01, 3.0)), "top_p": st.floats(0.0, 1.5),
    "top_k": st.integers(-1, 50), "n": st.integers(0, 3), "seed": st.integers(-1, 2**31),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3)),
    "logprobs": st.booleans(),
}  # fmt: skip
CHAT = body({**SAMPLING, "messages": st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "x"]), "content": st.text(max_size=40)}), max_size=4)})  # fmt: skip
COMPLETION = body(
    {**SAMPLING, "prompt": st.one_of(st.text(max_size=40), st.lists(st.integers(-1, 1200), max_size=8))}
)


def check_stream(lines: list[str], complete: bool) -> None:
    """SSE events as the front documents them; a complete stream ends with ``[DONE]``."""
    events = [line[len("data: ") :] for line in lines if line]
    assert all(line.startswith("data: ") for line in lines if line), lines[:3]
    for data in events[:-1] if complete else events:
        event = json.loads(data)
        assert isinstance(event, dict) and ("choices" in event or set(event) == {"error"}), event
    if complete:
        assert events and events[-1] == "[DONE]", events[-3:]


def test_streaming_requests_answer_documented_shapes_and_drops_end(front: Front) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(["chat", "completion"]), CHAT, COMPLETION, st.one_of(st.none(), st.integers(0, 3)))
    def check(kind: str, chat: dict[str, Any], completion: dict[str, Any], drop_after: int | None) -> None:
        path, payload = ("/v1/chat/completions", chat) if kind == "chat" else ("/v1/completions", completion)
        with (
            httpx.Client(base_url=front.url, timeout=60) as http,
            http.stream("POST", path, json=payload) as r,
        ):
            assert r.status_code in STATUSES, r.status_code
            if r.status_code != 200:
                r.read()
                assert set(r.json()) == {"error"} and r.json()["error"]["code"] == r.status_code, r.text
                return
            lines: list[str] = []
            for line in r.iter_lines():
                lines.append(line)
                if drop_after is not None and sum(1 for x in lines if x) > drop_after:
                    break  # leaving the block closes the connection mid-stream
            check_stream(lines, complete=drop_after is None)
        deadline = time.monotonic() + 10
        while front.front.in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert front.front.in_flight == 0, "a dropped stream kept running on the server"

    check()
