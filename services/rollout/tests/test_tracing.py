"""One trace per episode: the rollout's episode span is the root, and the environment's, inference's and
reward's spans for that episode join it (over gRPC metadata or the per-item trace context fields)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from wolfpack import rpc, telemetry
from wolfpack_environment.client import EnvironmentClient
from wolfpack_rollout.driver import RolloutConfig, RolloutDriver, SamplingConfig


@pytest.mark.tracing_sdk
async def test_each_episode_is_one_trace_across_services(stack: Any, tasks: dict[str, Any]) -> None:
    exporter = InMemorySpanExporter()
    telemetry.setup_telemetry("tests", exporter=exporter)
    config = RolloutConfig(concurrency=4, sampling=SamplingConfig(max_tokens=8))
    async with (
        EnvironmentClient(stack.environment, stack.settings) as env,
        rpc.channel(stack.inference, stack.settings) as inference,
        rpc.channel(stack.reward, stack.settings) as reward,
    ):
        driver = RolloutDriver(config, environment=env, inference_channel=inference, reward_channel=reward)
        played = await driver.play([tasks["werewolf"](21), tasks["werewolf"](22), tasks["bargaining"](23)])
        await driver.close()
    assert len(played) == 3
    by_trace: dict[str, list[Any]] = defaultdict(list)
    for span in exporter.get_finished_spans():
        by_trace[f"{span.context.trace_id:032x}"].append(span)
    trace_ids = [t.trace.traceparent.split("-")[1] for t in played]
    assert len(set(trace_ids)) == 3, "one trace per episode"
    for traj, trace_id in zip(played, trace_ids, strict=True):
        spans = by_trace[trace_id]
        names = [s.name for s in spans]
        roots = [s for s in spans if s.parent is None]
        assert [s.name for s in roots] == ["episode"], names
        assert roots[0].attributes["wolfpack.trajectory_id"] == traj.trajectory_id
        assert any(n == "turn" for n in names), f"environment turn spans: {names}"
        assert any(n.startswith("chat ") for n in names), f"inference spans: {names}"
        assert "score" in names, f"reward span: {names}"
        policy_turns = sum(1 for t in traj.turns if t.response_token_ids)
        assert sum(1 for n in names if n == "rollout.turn") == policy_turns
        assert sum(1 for n in names if n.startswith("chat ")) >= policy_turns
