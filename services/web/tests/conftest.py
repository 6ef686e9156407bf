"""A real stack for the web view's tests: the environment's gRPC server on a free port with the service
credential on, the real Redis (a stream key of each test's own), and the web view on a free port."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from wolfpack import auth, rpc
from wolfpack.settings import Settings, load_settings
from wolfpack.v1 import common_pb2, trajectory_pb2
from wolfpack_environment.server import EnvironmentServicer, register
from wolfpack_environment.sessions import EpisodeManager, Limits
from wolfpack_web.server import RunningWeb, start_web
from wolfpack_web.settings import WebSettings

SECRET = "web-test-credential-5d1c9a"
REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass
class Stack:
    servicer: EnvironmentServicer
    settings: Settings
    target: str
    web: RunningWeb
    runs: Path
    redis: aioredis.Redis

    @property
    def url(self) -> str:
        return self.web.url

    @property
    def stream(self) -> str:
        return self.settings.stream_trajectories


@pytest.fixture
def web_settings(tmp_path: Path) -> WebSettings:
    return WebSettings(addr="127.0.0.1:0", runs=[tmp_path / "runs"])


@pytest.fixture
async def stack(tmp_path: Path, web_settings: WebSettings) -> AsyncIterator[Stack]:
    settings = load_settings(
        rpc_timeout_s=20, admin_secret=SECRET, redis_url=REDIS_URL, run_dir=tmp_path / "run",
        stream_trajectories=f"wolfpack:test-web:{uuid.uuid4().hex}",
    )  # fmt: skip
    servicer = EnvironmentServicer(EpisodeManager(Limits(max_episodes=120)))
    servicer.credential = auth.Credential(SECRET)
    server = await rpc.start_server("environment", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    target = f"127.0.0.1:{server.port}"
    (tmp_path / "runs").mkdir()
    web = await start_web(settings, web_settings, target)
    redis = aioredis.from_url(REDIS_URL)
    try:
        yield Stack(servicer, settings, target, web, tmp_path / "runs", redis)
    finally:
        await web.stop()
        await redis.delete(settings.stream_trajectories)
        await redis.aclose()
        servicer.manager.close_all()
        await server.stop(0)


def sample_trajectory(turns: int = 5, trajectory_id: str = "traj-web-1") -> trajectory_pb2.Trajectory:
    """A bargaining-shaped trajectory with everything the replay page shows: prompts, responses, parsed
    actions (one invalid), reward components, response tokens with logprobs."""
    traj = trajectory_pb2.Trajectory(
        trajectory_id=trajectory_id, episode_id="ep-web-1", task_id="task-1", seed=11, winner="seller",
        reward_spec="bargaining@v1",
    )  # fmt: skip
    traj.game.game_id, traj.game.variant = "bargaining_v1", "easy"
    traj.seats.add(seat=0, controller=common_pb2.SEAT_CONTROLLER_POLICY).policy.policy_id = "trainee"
    traj.seats.add(seat=1, controller=common_pb2.SEAT_CONTROLLER_SCRIPTED, bot="heuristic")
    for i in range(turns):
        t = traj.turns.add(index=i, seat=i % 2, phase="negotiate", round=i // 2 + 1)
        t.observation_text = f"Turn {i}: the buyer offers {40 + i}. Reply with OFFER <price> or FINAL_BID."
        t.prompt_token_ids.extend(range(100, 130))
        t.response_text = f"OFFER {60 - i}" if i != 2 else "I think we should talk more"
        t.response_token_ids.extend([11, 22, 33 + i])
        t.response_logprobs.extend([-0.05, -1.2, -3.5])
        t.valid = i != 2
        if t.valid:
            t.action.kind, t.action.text = "offer", str(60 - i)
        else:
            t.invalid_reason = "no OFFER, ACCEPT or FINAL_BID"
        t.reward = 0.1 * i
        t.reward_components["format"] = 0.0 if i == 2 else 0.05
        t.reward_components["outcome"] = 0.1 * i
    traj.outcomes.add(
        seat=0, role="seller", team="seller", outcome=common_pb2.OUTCOME_KIND_WIN, final_reward=1.0
    )
    traj.outcomes.add(
        seat=1, role="buyer", team="buyer", outcome=common_pb2.OUTCOME_KIND_LOSS, final_reward=-1.0
    )
    return traj


def metrics_values(step: int, evaluated: bool = False) -> dict[str, float]:
    """One update's metrics under the trainer's names (``wolfpack_trainer.metrics``), with the held-out
    evaluation's 95% CI bounds on evaluated updates."""
    row = {
        "charts/reward_mean": 0.1 * step,
        "charts/win_rate": min(1.0, 0.2 + 0.1 * step),
        "charts/trainee/seller/win_rate": min(1.0, 0.3 + 0.1 * step),
        "actor/ppo_kl": 0.001 * step,
        "actor/entropy": 2.0 - 0.1 * step,
        "actor/pg_loss": -0.01 * step,
    }
    if evaluated:
        row |= {
            "eval/reward_mean": 0.12 * step, "eval/reward_lo": 0.12 * step - 0.1, "eval/reward_hi": 0.12 * step + 0.1,
            "eval/win_rate": 0.5, "eval/win_rate_lo": 0.4, "eval/win_rate_hi": 0.6,
        }  # fmt: skip
    return row
