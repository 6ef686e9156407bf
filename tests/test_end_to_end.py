"""Every contract at once, over real sockets: a policy seat of a Werewolf game is played by the inference
service (a tiny real model), the episode becomes a ``Trajectory`` with the exact token ids and logprobs,
the reward service scores it, it crosses a real Redis stream, and one trace spans it all.

This is the path the rollout and trainer services will take; the driver here is deliberately small.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from wolfpack import rpc, telemetry
from wolfpack.settings import load_settings
from wolfpack.stream import ProtoStreamConsumer, ProtoStreamProducer
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack.v1 import inference_service_pb2 as inf_pb
from wolfpack.v1 import inference_service_pb2_grpc as inf_grpc
from wolfpack.v1 import reward_service_pb2 as rew_pb
from wolfpack.v1 import reward_service_pb2_grpc as rew_grpc
from wolfpack_environment.client import EnvironmentClient
from wolfpack_environment.server import EnvironmentServicer
from wolfpack_environment.server import register as register_environment
from wolfpack_inference.config import PolicyConfig
from wolfpack_inference.policies import Policy, PolicyRegistry, build_backend
from wolfpack_inference.server import InferenceServicer
from wolfpack_inference.server import register as register_inference
from wolfpack_reward.server import register as register_reward

POLICY_SEAT = 3


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    settings = load_settings(rpc_timeout_s=60)
    cfg = PolicyConfig(policy_id="learner", backend="transformers", model="tiny")
    registry = PolicyRegistry(tmp_path, [Policy(cfg, build_backend(cfg, tmp_path))])
    servers = {
        "environment": await rpc.start_server(
            "environment", lambda s: register_environment(s, EnvironmentServicer()), settings, "127.0.0.1:0"
        ),
        "inference": await rpc.start_server(
            "inference", lambda s: register_inference(s, InferenceServicer(registry)), settings, "127.0.0.1:0"
        ),
        "reward": await rpc.start_server("reward", register_reward, settings, "127.0.0.1:0"),
    }
    yield {"settings": settings, **{k: f"127.0.0.1:{v.port}" for k, v in servers.items()}}
    for server in servers.values():
        await server.stop(0)


async def play_episode(stack: dict[str, Any], seed: int) -> trajectory_pb2.Trajectory:
    """A miniature rollout: scripted bots everywhere but one seat, which the inference service plays."""
    settings = stack["settings"]
    async with (
        EnvironmentClient(stack["environment"], settings) as env,
        rpc.channel(stack["inference"], settings) as inf_channel,
    ):
        inference = inf_grpc.InferenceServiceStub(inf_channel)
        created = await env.create_episode(
            "werewolf_v1", "6p", seed=seed, policy_seats={POLICY_SEAT: "learner"}, default_bot="heuristic"
        )
        seat = env.seat(created.episode_id, created.seat_tokens[POLICY_SEAT])
        traj = trajectory_pb2.Trajectory(
            trajectory_id=uuid.uuid4().hex, episode_id=created.episode_id, seed=seed,
            game=common_pb2.GameRef(game_id="werewolf_v1", variant="6p"),
        )  # fmt: skip
        telemetry.inject_into(traj.trace)
        obs = await seat.observation()
        while not obs.done:
            if not obs.your_turn:
                obs = await seat.observation()
                await asyncio.sleep(0.01)
                continue
            gen = await inference.Generate(
                inf_pb.GenerateRequest(
                    policy_id="learner",
                    chat=inf_pb.ChatPrompt(messages=obs.messages, add_generation_prompt=True),
                    sampling=common_pb2.SamplingParams(
                        max_tokens=12, temperature=1.0, seed=seed, logprobs=True
                    ),
                )
            )
            completion = gen.completions[0]
            act = await seat.act(obs.turn_id, completion.text)
            turn = traj.turns.add(
                index=len(traj.turns), seat=POLICY_SEAT, phase=obs.phase, round=obs.round,
                observation_text=obs.text, prompt_token_ids=gen.prompt_token_ids,
                response_token_ids=completion.token_ids, response_logprobs=completion.logprobs,
                response_text=completion.text, valid=act.accepted, invalid_reason=act.reason,
                defaulted=act.defaulted, turn_id=obs.turn_id, policy=gen.policy,
            )  # fmt: skip
            turn.action.CopyFrom(act.action)
            obs = act.observation
        state = await env.get_episode(created.episode_id, created.admin_token)
        traj.winner = state.winner
        for s in state.seats:
            traj.outcomes.add(seat=s.seat, role=s.role, outcome=s.outcome)
        traj.policy_versions.add(policy_id="learner", version=0)
        return traj


@pytest.mark.tracing_sdk
async def test_a_policy_plays_is_scored_and_crosses_the_stream(stack: dict[str, Any], redis_url: str) -> None:
    exporter = InMemorySpanExporter()
    telemetry.setup_telemetry("tests", exporter=exporter)
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("episode") as root:
        traj = await play_episode(stack, seed=5)
        async with rpc.channel(stack["reward"], stack["settings"]) as ch:
            scored = await rew_grpc.RewardServiceStub(ch).Score(rew_pb.ScoreRequest(trajectory=traj))
        client = aioredis.Redis.from_url(redis_url)
        stream = f"test:e2e:{uuid.uuid4().hex}"
        consumer = ProtoStreamConsumer(
            client, stream, "trainer", "t0", trajectory_pb2.Trajectory, block_ms=100
        )
        await consumer.ensure_group()
        await ProtoStreamProducer(client, stream, id_of=lambda t: t.trajectory_id).append(scored.trajectory)
    # The policy acted, with exact token ids and one logprob per token, valid or not (the rules handled it).
    assert traj.turns, "the policy seat must have acted"
    for turn in traj.turns:
        assert turn.response_token_ids and len(turn.response_logprobs) == len(turn.response_token_ids)
        assert all(lp <= 0.0 for lp in turn.response_logprobs)
        assert turn.valid or turn.invalid_reason
    assert scored.spec.startswith("werewolf_shaped@")
    assert len(scored.turn_rewards) == len(traj.turns)
    seat_reward = next(r.reward for r in scored.seat_rewards if r.seat == POLICY_SEAT)
    assert seat_reward == pytest.approx(
        sum(t.reward for t in scored.trajectory.turns if t.seat == POLICY_SEAT), abs=1e-5
    )
    # The trainer side gets the same bytes back, with the episode's trace as parent.
    [delivery] = await consumer.read()
    await consumer.ack([delivery])
    received = delivery.message
    assert received == scored.trajectory
    assert [list(t.response_token_ids) for t in received.turns] == [
        list(t.response_token_ids) for t in traj.turns
    ]
    with tracer.start_as_current_span("train", context=delivery.context):
        pass
    await client.aclose()
    spans = exporter.get_finished_spans()
    root_trace = root.get_span_context().trace_id
    names = {s.name for s in spans if s.context.trace_id == root_trace}
    assert {"train", "episode"} <= names
    assert any(n.startswith("chat ") for n in names), "inference span joins the episode trace"
    assert any("Score" in n for n in names), "reward span joins the episode trace"
    assert any(n == "turn" for n in names), "environment turn spans join the episode trace"
