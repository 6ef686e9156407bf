"""The example agents as a user runs them: real subprocesses against a real environment server.

The OpenAI-compatible endpoint is a real HTTP server started here (aiohttp) that stands in for a remote
model: it reads the legal actions from the prompt it receives and answers like a model would, sometimes
with garbage (to exercise the game's re-prompts) and once with an HTTP 500 (to exercise the agent's
retries). Nothing of our own code is mocked.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
ENV = {**os.environ, "WOLFPACK_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
ENV.pop("WOLFPACK_ENVIRONMENT_ADDR", None)


def start_server(
    args: list[str], announces: str, from_stdout: bool = False
) -> tuple[subprocess.Popen[str], int]:
    """Start a server subprocess on port 0 and read the port it bound from the line it announces
    (regex ``announces`` with one group): no free-port race with other processes."""
    env = {**ENV, "WOLFPACK_LOG_LEVEL": "INFO", "WOLFPACK_LOG_FORMAT": "json"}
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    found: queue.Queue[int | None] = queue.Queue()

    def read(stream: Any, watch: bool) -> None:
        for line in stream:  # keep draining, so the server never blocks on a full pipe
            match = re.search(announces, line) if watch else None
            if match:
                found.put(int(match.group(1)))
        if watch:
            found.put(None)

    for stream, watch in ((proc.stdout, from_stdout), (proc.stderr, not from_stdout)):
        threading.Thread(target=read, args=(stream, watch), daemon=True).start()
    try:
        port = found.get(timeout=60)  # a bound for a hung start-up, not a timing claim
    except queue.Empty:
        port = None
    if port is None:
        proc.kill()
        raise RuntimeError(f"{args}: exited ({proc.poll()}) or never announced its port")
    return proc, port


def stop_server(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def env_addr() -> Iterator[str]:
    """``wolfpack serve environment`` as a subprocess, shared by this module's tests."""
    proc, port = start_server(
        ["-m", "wolfpack.cli.main", "serve", "environment", "--address", "127.0.0.1:0"],
        r'"msg": "serving".*"address": "127\.0\.0\.1:(\d+)"',
    )
    yield f"127.0.0.1:{port}"
    stop_server(proc)


@pytest.fixture(scope="module")
def gateway_url(env_addr: str) -> Iterator[str]:
    """The gateway as a user starts it (its ``main()``), in front of the environment subprocess."""
    proc, port = start_server(
        ["-m", "wolfpack_environment.gateway", "--port", "0", "--env", env_addr],
        r"wolfpack gateway on http://127\.0\.0\.1:(\d+)",
        from_stdout=True,
    )
    yield f"http://127.0.0.1:{port}"
    stop_server(proc)


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A URL whose port is bound but never listens: connections are refused, and no other process can
    take the port while the test runs (a closed free port could be reused by anyone)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}/v1"


LEGAL_RE = re.compile(r"^- (\w+)(?: <player> \(players ([\d, ]+)\))?", re.MULTILINE)


@dataclass
class FakeModel:
    """A canned chat model: a legal answer read off the prompt, garbage every third targeted decision."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    auth: set[str] = field(default_factory=set)
    targeted: int = 0
    garbage: int = 0

    def answer(self, prompt: str) -> str:
        now = prompt.rsplit("--- Now ---", 1)[-1]
        legal = LEGAL_RE.findall(now)
        kinds = [kind for kind, _ in legal]
        if "speak" in kinds:
            return (
                "<think>I should sound calm.</think>I am a simple villager. Player 2 seems suspicious to me."
            )
        targeted = [(kind, players) for kind, players in legal if players]
        if not targeted:
            return kinds[0] if kinds else "pass"
        self.targeted += 1
        if self.targeted % 3 == 1 and "invalid" not in now:
            self.garbage += 1
            return "Hmm, honestly I cannot decide what to do here."
        kind, players = targeted[0]
        return f"I choose: {kind} {players.split(',')[-1].strip()}"

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        self.auth.add(request.headers.get("Authorization", ""))
        if len(self.requests) == 2:
            return web.json_response({"error": {"message": "overloaded", "type": "server_error"}}, status=500)
        content = self.answer(body["messages"][-1]["content"])
        return web.json_response(
            {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }
        )


@pytest.fixture
async def model_server() -> AsyncIterator[tuple[str, FakeModel]]:
    model = FakeModel()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", model.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1", model
    await runner.cleanup()


async def run_example(
    *args: str, timeout: float = 30, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run an example without blocking this event loop (the fake model server lives on it)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        cwd=ROOT,
        env=env or ENV,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        raise
    return proc.returncode or 0, out.decode(), err.decode()


def summary_field(summary: str, name: str) -> str:
    match = re.search(rf"{name} ([\w-]+)", summary)
    assert match, (name, summary)
    return match.group(1)


async def test_examples_have_help() -> None:
    for script in ("openai_agent.py", "http_agent.py"):
        code, out, _ = await run_example(str(EXAMPLES / script), "--help")
        assert code == 0 and "usage:" in out and "--episode" in out
    code, out, _ = await run_example("-m", "wolfpack_environment.gateway", "--help")
    assert code == 0 and "--env" in out


async def test_openai_agent_plays_a_full_game_with_a_remote_model(
    env_addr: str, model_server: tuple[str, FakeModel]
) -> None:
    base_url, model = model_server
    code, out, err = await run_example(
        str(EXAMPLES / "openai_agent.py"),
        *("--env", env_addr, "--base-url", base_url, "--model", "fake-model", "--seed", "4", "--seat", "2"),
        *("--api-key-env", "FAKE_MODEL_KEY"),
        env={**ENV, "FAKE_MODEL_KEY": "sk-test-123"},
    )
    assert code == 0, (out, err)
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("Summary: episode "), out
    assert summary_field(summary, "outcome") in ("WIN", "LOSS", "DRAW")
    assert summary_field(summary, "winner") in ("village", "wolves")
    assert "Player 3" in summary
    assert model.auth == {"Bearer sk-test-123"}
    assert model.requests[0]["model"] == "fake-model"
    assert model.requests[0]["messages"][-1]["content"].startswith("You are playing Werewolf")
    # The 500 was retried, garbage was re-prompted by the game, and the agent still finished.
    assert int(summary_field(summary, "model errors")) >= 1 and "model error" in err
    assert model.garbage >= 1 and int(summary_field(summary, "invalid replies")) == model.garbage
    assert int(summary_field(summary, "replies")) >= 2


async def test_openai_agent_survives_an_unreachable_model(env_addr: str, dead_url: str) -> None:
    """Every model call fails: each decision falls back to a safe legal reply and the game finishes."""
    code, out, err = await run_example(
        str(EXAMPLES / "openai_agent.py"),
        *("--env", env_addr, "--base-url", dead_url, "--retries", "0"),
        *("--seed", "1", "--quiet", "--timeout", "2"),
    )
    assert code == 0, (out, err)
    summary = out.strip().splitlines()[-1]
    assert summary_field(summary, "outcome") in ("WIN", "LOSS", "DRAW")
    assert int(summary_field(summary, "fallbacks")) == int(summary_field(summary, "replies")) >= 1
    assert summary_field(summary, "invalid replies") == "0"


@pytest.mark.parametrize("mode", [[], ["--ws"]], ids=["reset-step", "websocket"])
async def test_http_agent_plays_through_the_gateway(gateway_url: str, mode: list[str]) -> None:
    code, out, err = await run_example(
        str(EXAMPLES / "http_agent.py"), "--gateway", gateway_url, "--seed", "2", "--seat", "1", *mode
    )
    assert code == 0, (out, err)
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("Summary: episode ") and "Player 2" in summary
    assert summary_field(summary, "outcome") in ("win", "loss", "draw")
    assert int(summary_field(summary, "actions")) >= 1
    assert ("websocket" if mode else "reset/step") in summary


async def test_http_agent_reports_gateway_errors_readably(gateway_url: str) -> None:
    code, _, err = await run_example(
        str(EXAMPLES / "http_agent.py"), "--gateway", gateway_url, "--episode", "nope", "--token", "x"
    )
    assert code == 1 and "404 NOT_FOUND" in err
