"""``wolfpack rollout`` as a person sees it: every failed episode printed with its reason and detail, a
progress line that counts turns while episodes are still playing, a partial summary when stopped
(Ctrl-C), and defaults that fit the cores. Against the real local stack (tiny model, real curriculum,
real Redis stream)."""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
import typer
from rich.console import Console
from typer.testing import CliRunner

from wolfpack import rpc
from wolfpack_curriculum.config import CurriculumConfig
from wolfpack_curriculum.server import CurriculumServicer
from wolfpack_curriculum.server import register as register_curriculum
from wolfpack_curriculum.store import CurriculumStore
from wolfpack_rollout import cli
from wolfpack_rollout.client import Addresses, connect
from wolfpack_rollout.config import RolloutConfig, SamplingConfig
from wolfpack_rollout.summary import EpisodeFailure, RolloutSummary

from .conftest import POLICY

BARGAINING = {"game_id": "bargaining_v1", "variant": "easy", "seats": {"trainee_seats": [0]}}
WEREWOLF = {"game_id": "werewolf_v1", "variant": "6p"}


@pytest.fixture
def dead() -> Iterator[str]:
    """An address where nothing listens: a socket bound, never listening, held for the test."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{held.getsockname()[1]}"


async def _curriculum(stack: Any, redis_client: aioredis.Redis, bucket: dict[str, Any]) -> Any:
    cfg = CurriculumConfig.model_validate(
        {"policy_id": POLICY, "key_prefix": f"test:rocli:{uuid.uuid4().hex}", "buckets": [bucket]}
    )
    servicer = CurriculumServicer(CurriculumStore(redis_client, cfg))
    return await rpc.start_server(
        "curriculum", lambda s: register_curriculum(s, servicer), stack.settings, "127.0.0.1:0"
    )


@pytest.fixture
async def werewolf_curriculum(stack: Any, redis_client: aioredis.Redis) -> AsyncIterator[str]:
    server = await _curriculum(stack, redis_client, WEREWOLF)
    yield f"127.0.0.1:{server.port}"
    await server.stop(0)


@pytest.fixture
async def bargaining_curriculum(stack: Any, redis_client: aioredis.Redis) -> AsyncIterator[str]:
    server = await _curriculum(stack, redis_client, BARGAINING)
    yield f"127.0.0.1:{server.port}"
    await server.stop(0)


async def test_every_failed_episode_is_reported_once_with_reason_detail_and_task(
    stack: Any, bargaining_curriculum: str, redis_url: str, stream_key: str, dead: str
) -> None:
    """Inference unreachable: each of the 4 episodes fails; each failure reaches ``on_failure`` exactly
    once, with its counted reason, the status in words and the task; the summary keeps the first."""
    addresses = Addresses(stack.environment, dead, stack.reward, bargaining_curriculum, redis_url, stream_key)
    config = RolloutConfig(concurrency=2, retries=1, backoff_s=0.01, sampling=SamplingConfig(max_tokens=8))
    seen: list[EpisodeFailure] = []
    async with connect(stack.settings, config, addresses) as driver:
        summary, stopped = await cli.play_with_progress(
            driver, 4, "train", asyncio.Event(), on_failure=seen.append
        )
    assert not stopped and summary.episodes == 0
    assert [f.number for f in seen] == [1, 2, 3, 4], "each failure once, in order"
    for f in seen:
        assert f.reason == "inference_unavailable"
        assert "UNAVAILABLE" in f.detail, f.detail
        assert f.where.startswith("bargaining_v1/easy seed "), f.where
    assert summary.failures == {"inference_unavailable": 4} and summary.failed == 4
    assert summary.failure_details["inference_unavailable"] == f"{seen[0].where}: {seen[0].detail}"
    line = cli.failure_line(seen[0])
    assert "inference_unavailable" in line and seen[0].where in line


async def test_progress_counts_turns_in_flight_and_stop_gives_a_partial_summary(
    stack: Any,
    werewolf_curriculum: str,
    redis_url: str,
    redis_client: aioredis.Redis,
    stream_key: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The progress callback sees policy turns that no delivered trajectory holds yet (turns count as they
    are played); setting ``stop`` (what Ctrl-C does) ends the run with episodes still in flight, and the
    partial summary counts the delivered ones (each in the stream) and the interrupted ones."""
    monkeypatch.setattr(cli, "REFRESH_S", 0.01)
    addresses = Addresses(
        stack.environment, stack.inference, stack.reward, werewolf_curriculum, redis_url, stream_key
    )
    config = RolloutConfig(concurrency=2, sampling=SamplingConfig(max_tokens=8))
    stop = asyncio.Event()
    ahead: list[tuple[int, int]] = []  # (turns counted, trainee turns in delivered trajectories)
    async with connect(stack.settings, config, addresses) as driver:

        def refresh() -> None:
            delivered = sum(
                sum(t.seat in set(tr.trainee_seats) for t in tr.turns) for tr in driver.trajectories
            )
            if driver.stats.turns > delivered:
                ahead.append((driver.stats.turns, delivered))
            if driver.stats.turns >= 12:
                stop.set()

        summary, stopped = await asyncio.wait_for(
            cli.play_with_progress(driver, 200, "train", stop, on_refresh=refresh), timeout=120
        )
        stats = driver.stats
    assert ahead, "progress saw turns only when episodes were delivered"
    assert stopped and isinstance(summary, RolloutSummary)
    assert stats.episodes_started < 200, "stopped before playing everything"
    assert summary.interrupted >= 1 and stats.in_flight == 0
    assert summary.interrupted == stats.episodes_started - summary.episodes - summary.failed
    assert summary.episodes == len(driver.trajectories) == await redis_client.xlen(stream_key)
    out = Console(record=True, width=200)
    cli.print_summary(summary, out, title="Partial rollout summary (stopped by Ctrl-C)")
    text = out.export_text()
    assert "Partial rollout summary" in text and "interrupted (in flight at Ctrl-C)" in text


async def test_first_ctrl_c_sets_stop_and_hands_sigint_back() -> None:
    """A real SIGINT: the first one sets ``stop`` (the run then ends with a partial summary) and restores
    Python's handler, so a second Ctrl-C raises KeyboardInterrupt instead of being swallowed."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, cli._on_sigint(stop))
    try:
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(stop.wait(), timeout=5)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_summary_prints_each_reason_with_its_first_failure_escaped() -> None:
    s = RolloutSummary(
        failed=3, failures={"no_turns": 2, "inference_unavailable": 1},
        failure_details={"no_turns": "werewolf_v1/6p seed 15: ended [bold]early", "inference_unavailable": "x" * 500},
    )  # fmt: skip
    out = Console(record=True, width=300)
    cli.print_summary(s, out)
    text = out.export_text()
    assert "werewolf_v1/6p seed 15: ended [bold]early" in text, "markup in a detail is shown, not applied"
    assert "x" * (cli.DETAIL_CHARS - 1) + "…" in text and "x" * cli.DETAIL_CHARS not in text
    assert "interrupted" not in text, "a finished run has no interrupted row"


@pytest.mark.parametrize(
    ("cpus", "expected"),
    [
        (1, (2, 32, "memory", 600.0, 600.0)),
        (2, (2, 32, "memory", 600.0, 600.0)),
        (8, (4, 32, "memory", 600.0, 600.0)),
        (32, (16, 64, "full", 0.0, 300.0)),  # many cores: the dataclass defaults (a GPU policy)
    ],
)
def test_defaults_follow_the_cores(cpus: int, expected: tuple[Any, ...]) -> None:
    c = cli.build_config(cpus)
    assert (
        c.concurrency,
        c.sampling.max_tokens,
        c.prompt_mode,
        c.turn_timeout_s,
        c.generate_timeout_s,
    ) == expected
    assert c.turn_timeout_s <= 900, "within the environment's max_turn_timeout_s"


def test_flags_win_over_the_cpu_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[RolloutConfig] = []

    async def fake(episodes: int, split: str, config: RolloutConfig, stream: bool) -> int:
        seen.append(config)
        return 0

    monkeypatch.setattr(cli, "_rollout", fake)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    app = typer.Typer()
    cli.mount(app)
    app.command("noop")(lambda: None)  # two commands: typer keeps `rollout` a subcommand
    runner = CliRunner()
    assert runner.invoke(app, ["rollout"]).exit_code == 0
    assert seen[-1] == cli.build_config(2), "no flag: the two-core profile"
    flags = ["--concurrency", "5", "--max-tokens", "64", "--prompt-mode", "full", "--turn-timeout", "30"]
    assert runner.invoke(app, ["rollout", *flags]).exit_code == 0
    c = seen[-1]
    assert (c.concurrency, c.sampling.max_tokens, c.prompt_mode, c.turn_timeout_s) == (5, 64, "full", 30.0)
    bad = runner.invoke(app, ["rollout", "--concurrency", "0"])
    assert bad.exit_code == 2 and "concurrency must be >= 1" in bad.output and len(seen) == 2


async def test_the_command_prints_failures_progress_and_summary(
    stack: Any,
    bargaining_curriculum: str,
    redis_url: str,
    redis_client: aioredis.Redis,
    stream_key: str,
    dead: str,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``_rollout`` as ``wolfpack rollout`` runs it, addresses from the environment, output to a file
    (not a terminal: plain progress lines): first with inference unreachable (each failure printed, exit
    1, the reason table), then with it up (exit 0, the episodes in the stream)."""
    out = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=out, width=200))
    monkeypatch.setattr(cli, "PLAIN_PROGRESS_S", 0.0)
    for key, value in {
        "ENVIRONMENT_ADDR": stack.environment, "REWARD_ADDR": stack.reward, "CURRICULUM_ADDR": bargaining_curriculum,
        "REDIS_URL": redis_url, "STREAM_TRAJECTORIES": stream_key, "RUN_DIR": str(tmp_path), "INFERENCE_ADDR": dead,
    }.items():  # fmt: skip
        monkeypatch.setenv(f"WOLFPACK_{key}", value)
    config = RolloutConfig(concurrency=2, retries=0, backoff_s=0.01, sampling=SamplingConfig(max_tokens=8))
    assert await cli._rollout(2, "train", config, True) == 1, "no episode delivered"
    text = out.getvalue()
    assert text.count("episode failed (#") == 2 and "bargaining_v1/easy seed" in text, text
    assert "inference_unavailable" in text and "Failures by reason" in text
    assert await redis_client.xlen(stream_key) == 0

    out.truncate(0)
    monkeypatch.setenv("WOLFPACK_INFERENCE_ADDR", stack.inference)
    assert await cli._rollout(3, "train", config, True) == 0
    text = out.getvalue()
    assert re.search(r"\d+s: done \d+ · failed 0 · in flight \d+ · turns \d+ · tokens \d+", text), text
    assert "Rollout summary" in text and "episode failed" not in text
    assert await redis_client.xlen(stream_key) == 3
