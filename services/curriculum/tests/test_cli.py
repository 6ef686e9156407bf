"""`wolfpack league` against a real curriculum server: registers a checkpoint and prints the table."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

import redis.asyncio as aioredis

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack_curriculum.config import CurriculumConfig
from wolfpack_curriculum.server import CurriculumServicer, register
from wolfpack_curriculum.store import CurriculumStore


async def test_league_command_registers_and_lists(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    store = CurriculumStore(client, CurriculumConfig(key_prefix=f"test:cli:{uuid.uuid4().hex}"))
    server = await rpc.start_server(
        "curriculum", lambda s: register(s, CurriculumServicer(store)), load_settings(), "127.0.0.1:0"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "WOLFPACK_"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "wolfpack.cli.main", "league", "--address", f"127.0.0.1:{server.port}",
        "--register", "checkpoint:learner@2", "--policy", "learner-v2", "--version", "2",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    await server.stop(0)
    await client.aclose()
    assert proc.returncode == 0, text
    assert "registered checkpoint:learner@2 (rating 1000)" in text
    assert "checkpoint:learner@2" in text.split("League")[1] and "learner-v2@2" in text
    assert "100%" in text, "the only opponent gets every PFSP draw"
