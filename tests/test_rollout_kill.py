"""SIGKILL the rollout worker mid-run, start it again: the stream holds no duplicate and no half-written
trajectory, and the curriculum (reading outcomes through its own consumer group) counts exactly what the
stream holds. Real processes, real gRPC, real Redis, the tiny model."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.stream import ProtoStreamConsumer
from wolfpack.v1 import trajectory_pb2
from wolfpack_curriculum.config import CurriculumConfig
from wolfpack_curriculum.consumer import consume
from wolfpack_curriculum.server import CurriculumServicer
from wolfpack_curriculum.server import register as register_curriculum
from wolfpack_curriculum.store import CurriculumStore
from wolfpack_environment.server import EnvironmentServicer
from wolfpack_environment.server import register as register_environment
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.models import tiny_model
from wolfpack_inference.policies import PolicyRegistry
from wolfpack_inference.server import InferenceServicer
from wolfpack_inference.server import register as register_inference
from wolfpack_reward.server import register as register_reward

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("models"))


@pytest.fixture
async def cluster(tmp_path: Path, tiny_dir: Path, redis_url: str) -> AsyncIterator[dict[str, Any]]:
    settings = load_settings(rpc_timeout_s=60)
    cfg = PolicyConfig(policy_id="default", model=str(tiny_dir), device="cpu", dtype="float32")
    registry = PolicyRegistry.from_configs([cfg], tmp_path)
    client = aioredis.Redis.from_url(redis_url)
    curriculum_cfg = CurriculumConfig.model_validate(
        {"key_prefix": f"test:kill:{uuid.uuid4().hex}", "group_size": 2, "replay_ratio": 0.0}
    )
    store = CurriculumStore(client, curriculum_cfg)
    servers = {
        "environment": await rpc.start_server(
            "environment", lambda s: register_environment(s, EnvironmentServicer()), settings, "127.0.0.1:0"
        ),
        "inference": await rpc.start_server(
            "inference", lambda s: register_inference(s, InferenceServicer(registry)), settings, "127.0.0.1:0"
        ),
        "reward": await rpc.start_server("reward", register_reward, settings, "127.0.0.1:0"),
        "curriculum": await rpc.start_server(
            "curriculum", lambda s: register_curriculum(s, CurriculumServicer(store)), settings, "127.0.0.1:0"
        ),
    }
    stream = f"test:kill:stream:{uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "WOLFPACK_"))}
    env.update({f"WOLFPACK_{name.upper()}_ADDR": f"127.0.0.1:{s.port}" for name, s in servers.items()})
    env.update(WOLFPACK_REDIS_URL=redis_url, WOLFPACK_STREAM_TRAJECTORIES=stream,
               WOLFPACK_RUN_DIR=str(tmp_path / "run"), WOLFPACK_LOG_LEVEL="WARNING")  # fmt: skip
    yield {"env": env, "stream": stream, "store": store, "client": client, "config": curriculum_cfg}
    for server in servers.values():
        await server.stop(0)
    await registry.close()
    await client.aclose()


def rollout(env: dict[str, str], episodes: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "wolfpack.cli.main", "rollout", "--episodes", str(episodes), "--max-tokens", "8",
           "--concurrency", "8"]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


async def stream_ids(client: aioredis.Redis, stream: str) -> list[trajectory_pb2.Trajectory]:
    out = []
    for _entry, fields in await client.xrange(stream):
        out.append(trajectory_pb2.Trajectory.FromString(fields[b"data"]))  # parses whole or raises
    return out


async def test_sigkill_mid_run_then_restart(cluster: dict[str, Any]) -> None:
    client, stream = cluster["client"], cluster["stream"]
    first = rollout(cluster["env"], 200)
    for _ in range(1200):  # bounded wait (120 s) for the worker to append a few trajectories
        if await client.exists(stream) and await client.xlen(stream) >= 3:
            break
        assert first.poll() is None, (first.stdout.read() if first.stdout else b"").decode()[-3000:]
        await asyncio.sleep(0.1)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    killed_at = await client.xlen(stream)
    assert 3 <= killed_at < 200, "killed mid-run"
    second = rollout(cluster["env"], 6)
    out, _ = await asyncio.to_thread(second.communicate, timeout=240)
    assert second.returncode == 0, out.decode()[-3000:]
    assert "Rollout summary" in out.decode()
    trajectories = await stream_ids(client, stream)
    ids = [t.trajectory_id for t in trajectories]
    assert len(ids) == len(set(ids)), "no duplicate trajectory"
    assert len(trajectories) >= killed_at + 6
    for traj in trajectories:  # complete: scored, with outcomes and policy turns
        assert traj.reward_spec and traj.outcomes and traj.turns
        assert any(t.response_token_ids for t in traj.turns)
    # The curriculum's own consumer group reads the stream: its counts match it exactly.
    store = cluster["store"]
    consumer = ProtoStreamConsumer(
        client, stream, cluster["config"].stream_group, "c", trajectory_pb2.Trajectory, block_ms=50
    )
    stop = asyncio.Event()
    reader = asyncio.create_task(consume(store, consumer, stop))
    for _ in range(1200):  # bounded wait (60 s; a few hundred ms normally) for the consumer to catch up
        if (await store.stats()).stream_outcomes >= len(trajectories):
            break
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(reader, 60)  # it ends within one 50 ms read; the bound only catches a hang
    stats = await store.stats()
    assert stats.outcomes == stats.stream_outcomes == len(trajectories)
    assert sum(b.finished for b in stats.buckets) == len(trajectories)
    assert sum(b.scheduled for b in stats.buckets) >= len(trajectories)


async def test_rollout_service_worker_plays_reports_status_and_drains_on_sigterm(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    """`wolfpack serve rollout` with `episodes: -1` plays forever into the stream; GetRolloutStatus reports
    it; SIGTERM stops new tasks and lets the episodes in flight finish: the process exits cleanly and every
    appended entry is a complete trajectory."""
    from wolfpack.v1 import rollout_service_pb2 as ro_pb
    from wolfpack.v1 import rollout_service_pb2_grpc as ro_grpc

    client, stream = cluster["client"], cluster["stream"]
    config = tmp_path / "rollout.yaml"
    config.write_text("episodes: -1\nconcurrency: 4\nsampling: {max_tokens: 8}\n")
    ready = tmp_path / "rollout.ready.json"
    env = {**cluster["env"], "WOLFPACK_ROLLOUT_CONFIG": str(config), "WOLFPACK_GRPC_GRACE_S": "5"}
    proc = subprocess.Popen(  # port 0: the server binds a free port itself and writes it to the ready file
        [sys.executable, "-m", "wolfpack.cli.main", "serve", "rollout", "--address", "127.0.0.1:0",
         "--ready-file", str(ready)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        for _ in range(1200):  # bounded wait (120 s) for a few trajectories
            if await client.exists(stream) and await client.xlen(stream) >= 4 and ready.exists():
                break
            assert proc.poll() is None, (proc.stdout.read() if proc.stdout else b"").decode()[-3000:]
            await asyncio.sleep(0.1)
        address = json.loads(ready.read_text())["address"]
        async with rpc.channel(address, load_settings()) as ch:
            status = await ro_grpc.RolloutServiceStub(ch).GetRolloutStatus(ro_pb.GetRolloutStatusRequest())
        assert status.episodes_finished >= 4 and status.episodes_failed == 0 and status.worker_id
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.to_thread(proc.communicate, timeout=120)
        assert proc.returncode == 0, out.decode()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    trajectories = await stream_ids(client, stream)
    assert len({t.trajectory_id for t in trajectories}) == len(trajectories) >= status.episodes_finished
    assert all(t.reward_spec and t.outcomes for t in trajectories)
