"""The trainer's stream consumer under hostile conditions (issue 20, "consumers that never die silently"):

- entries it holds across updates (``checkpoint_every > 1``) are not reclaimed by its own consumer until
  ``max_deliveries`` dead-letters them while still in use (which lost them to a crash before the
  checkpoint);
- poison entries (a token id outside the vocabulary, fewer logprobs than tokens, a NaN logprob or reward,
  no data field) are dead-lettered with the reason and the run goes on with finite weights (they ended the
  run, or turned every weight into NaN);
- Redis away for longer than the stream's retry window (``WOLFPACK_STREAM_RETRY_TIMEOUT_S``, 30 s by default;
  the test sets 4 s, which the trainer's consumer honours like every other consumer of the stream) does not
  end the run: the loop waits, says so, reports NOT_SERVING through ``stream_health``, and finishes once
  Redis is back with every entry used.

Real Redis (an embedded server of the test's own where it is killed), the tiny model, local play.
"""

from __future__ import annotations

import asyncio
import copy
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from wolfpack.redis_server import EmbeddedRedis
from wolfpack.stream import ProtoStreamProducer, dead_letter_key
from wolfpack.v1 import trajectory_pb2
from wolfpack_inference.models import tiny_model
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.train import Trainer

PER_UPDATE = 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_model(tmp_path_factory.mktemp("models")))


def _config(
    tiny: str, stream: str, updates: int, checkpoint_every: int = 1, claim_idle_ms: int = 300
) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "name": "hostile-stream",
            "game": {"id": "ultimatum_v1", "variant": "easy", "bot": "heuristic"},
            "policies": [{"id": "responder", "seats": [1], "model": tiny, "lr": 1e-3}],
            "rollout": {"episodes_per_update": PER_UPDATE, "group_size": 2, "max_tokens": 4},
            "train": {"updates": updates, "checkpoint_every": checkpoint_every, "save_versions": False},
            "eval": {"every": 100, "episodes": 1},
            "stream": {"name": stream, "group": "trainer", "claim_idle_ms": claim_idle_ms},
        }
    )


def _stream(url: str) -> str:
    name = f"test:hostile-trainer:{os.getpid()}:{time.monotonic_ns()}"
    # An audit group that never reads: the stream trims only what every group acked, so it keeps all.
    redis.Redis.from_url(url).xgroup_create(name, "audit", id="0", mkstream=True)
    return name


def _trainer(cfg: TrainConfig, run: Path, url: str, cache: Path) -> Trainer:
    trainer = Trainer(cfg, run, url, cache_dir=cache)
    trainer.setup()
    return trainer


def _finite(trainer: Trainer) -> bool:
    model = trainer.learners["responder"].model  # type: ignore[attr-defined]
    return all(bool(p.detach().isfinite().all()) for p in model.parameters())


def test_entries_held_across_updates_are_not_reclaimed_into_the_dead_letters(
    tiny: str, redis_url: str, tmp_path: Path
) -> None:
    stream = _stream(redis_url)
    cfg = _config(tiny, stream, updates=4, checkpoint_every=4, claim_idle_ms=100)
    trainer = _trainer(cfg, tmp_path / "run", redis_url, tmp_path)
    # Each update holds the entries of the uncommitted ones a while longer than claim_idle_ms.
    trainer.on_update = lambda step, total, metrics: time.sleep(0.3)
    asyncio.run(trainer.run())
    client = redis.Redis.from_url(redis_url)
    dead = client.xrange(dead_letter_key(stream))
    reasons = [f[b"reason"].decode() for _, f in dead]
    assert dead == [], f"{len(dead)} entries the trainer was still using were dead-lettered: {reasons}"
    assert trainer.state.trajectories_used == 4 * PER_UPDATE
    assert client.xpending(stream, "trainer")["pending"] == 0


def _poison(good: trajectory_pb2.Trajectory) -> dict[str, trajectory_pb2.Trajectory]:
    out: dict[str, trajectory_pb2.Trajectory] = {}
    for kind in ("vocabulary", "negative", "logprobs for", "logprob is not finite", "reward is nan"):
        bad = copy.deepcopy(good)
        bad.trajectory_id = f"poison-{kind.replace(' ', '-')}"
        for t in bad.turns:
            if t.policy.policy_id != "responder":
                continue
            if kind == "vocabulary":
                t.response_token_ids[:] = [10**9] * len(t.response_token_ids)
            elif kind == "negative":
                t.prompt_token_ids[:] = [-5] * len(t.prompt_token_ids)
            elif kind == "logprobs for":
                del t.response_logprobs[:]
            elif kind == "logprob is not finite":
                t.response_logprobs[0] = math.nan
        if kind == "reward is nan":
            for o in bad.outcomes:
                o.final_reward = math.nan
        out[kind] = bad
    return out


def test_poison_entries_are_dead_lettered_with_the_reason_and_the_run_goes_on(
    tiny: str, redis_url: str, tmp_path: Path
) -> None:
    # Real trajectories first (one update of another run), then poisoned copies on the trained stream.
    source = _stream(redis_url)
    asyncio.run(_trainer(_config(tiny, source, updates=1), tmp_path / "source", redis_url, tmp_path).run())
    client = redis.Redis.from_url(redis_url)
    good = trajectory_pb2.Trajectory.FromString(client.xrange(source)[0][1][b"data"])
    assert any(t.policy.policy_id == "responder" and t.response_token_ids for t in good.turns)
    poison = _poison(good)

    stream = _stream(redis_url)

    async def append() -> None:
        aclient = aioredis.Redis.from_url(redis_url)
        producer: ProtoStreamProducer[trajectory_pb2.Trajectory] = ProtoStreamProducer(
            aclient, stream, lambda t: t.trajectory_id, required_groups=("trainer",)
        )
        await producer.append_many(list(poison.values()))
        await aclient.aclose()

    asyncio.run(append())
    client.xadd(stream, {"id": "no-data-field"})

    trainer = _trainer(_config(tiny, stream, updates=2), tmp_path / "run", redis_url, tmp_path)
    asyncio.run(trainer.run())
    assert trainer.state.step == 2
    assert _finite(trainer), "a poisoned entry reached the update: the weights are not finite"
    assert not {t.trajectory_id for t in poison.values()} & set(trainer.state.used_ids)
    dead = client.xrange(dead_letter_key(stream))
    reasons = {f[b"id"].decode(): f[b"reason"].decode() for _, f in dead}
    assert len(dead) == len(poison) + 1, reasons
    for kind, traj in poison.items():
        expected = "outside the model's vocabulary" if kind == "negative" else kind
        assert expected in reasons[traj.trajectory_id], (kind, reasons)
    assert "no data field" in reasons["no-data-field"], reasons
    assert trainer.dead_lettered == len(poison)
    assert client.xpending(stream, "trainer")["pending"] == 0


RETRY_WINDOW_S = 4


def test_redis_away_past_the_retry_window_is_waited_out_with_every_entry_used(
    tiny: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WOLFPACK_STREAM_RETRY_TIMEOUT_S", str(RETRY_WINDOW_S))
    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        stream = _stream(server.url)
        cfg = _config(tiny, stream, updates=3)
        trainer = _trainer(cfg, tmp_path / "run", server.url, tmp_path)
        health: list[bool] = []

        async def record(serving: bool) -> None:
            health.append(serving)

        trainer.stream_health = record
        restarted = threading.Event()

        def outage(step: int, total: int, metrics: dict[str, float]) -> None:
            if step != 1:
                return
            server.kill()  # SIGKILL; the AOF keeps what was acknowledged

            def back() -> None:
                time.sleep(RETRY_WINDOW_S + 3)  # past the consumer's retry window
                server.start()
                restarted.set()

            threading.Thread(target=back, daemon=True).start()

        trainer.on_update = outage
        asyncio.run(trainer.run())
        assert restarted.is_set()
        assert trainer.state.step == 3
        assert trainer.state.trajectories_used == 3 * PER_UPDATE
        assert health == [False, True]
        client = redis.Redis.from_url(server.url)
        assert client.xpending(stream, "trainer")["pending"] == 0
        client.close()
    finally:
        server.stop()


def test_unusable_names_each_problem_and_only_the_trained_policies_turns() -> None:
    from wolfpack_trainer.intake import unusable

    def traj(**turn: Any) -> trajectory_pb2.Trajectory:
        t = trajectory_pb2.Trajectory(trajectory_id="t")
        t.outcomes.add(seat=1, final_reward=1.0)
        fields = {"index": 3, "seat": 1, "prompt_token_ids": [1, 2], "response_token_ids": [3]}
        fields.update({"response_logprobs": [-0.5], **turn})
        u = t.turns.add(**{k: v for k, v in fields.items() if k != "policy"})
        u.policy.policy_id = turn.get("policy", "p")
        return t

    assert unusable(traj(), {"p"}, 10) == ""
    assert "vocabulary [0, 10)" in unusable(
        traj(response_token_ids=[10], response_logprobs=[-1.0]), {"p"}, 10
    )
    assert "vocabulary" in unusable(traj(prompt_token_ids=[-1]), {"p"}, 0)  # negative even when unknown
    assert unusable(traj(prompt_token_ids=[10**6]), {"p"}, 0) == ""  # no bound known: not refused
    assert "0 logprobs for 1 tokens" in unusable(traj(response_logprobs=[]), {"p"}, 10)
    assert "not finite" in unusable(traj(response_logprobs=[math.inf]), {"p"}, 10)
    assert "reward is nan" in unusable(traj(reward=math.nan), {"p"}, 10)
    assert unusable(traj(policy="opponent", response_token_ids=[10**6]), {"p"}, 10) == ""  # not trained here
    bad = traj()
    bad.outcomes[0].final_reward = -math.inf
    assert "final_reward is -inf" in unusable(bad, {"p"}, 10)
    assert unusable(trajectory_pb2.Trajectory(), {"p"}, 10) == "no trajectory_id"
