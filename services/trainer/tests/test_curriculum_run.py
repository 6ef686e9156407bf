"""The ``curriculum`` section configures the run's curriculum: the job's stack gets a curriculum config made
from the training config (``stack.curriculum_config``, loaded by the real curriculum service the way
``wolfpack up`` loads ``WOLFPACK_CURRICULUM_CONFIG``), and service mode draws each update's seeds from it,
so AIW replays what failed; seats stay bound by role."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import curriculum_service_pb2 as cur_pb
from wolfpack_curriculum.client import CurriculumClient
from wolfpack_curriculum.config import CurriculumConfig
from wolfpack_curriculum.server import start
from wolfpack_games import make_game
from wolfpack_trainer.config import TrainConfig, load_config
from wolfpack_trainer.publish import Publisher
from wolfpack_trainer.stack import curriculum_config
from wolfpack_trainer.train import Trainer

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def aiw_config() -> TrainConfig:
    return load_config(
        CONFIGS / "werewolf-gigpo-aiw.yaml",
        ["rollout.episodes_per_update=8", "rollout.group_size=2", "curriculum.replay_ratio=1.0"],
    )


@pytest.fixture
async def curriculum(redis_url: str, tmp_path: Path) -> AsyncIterator[str]:
    cfg = aiw_config()
    data = curriculum_config(cfg)
    data["key_prefix"] = f"test:curriculum:{tmp_path.name}"
    path = tmp_path / "curriculum.yaml"
    path.write_text(yaml.safe_dump(data))
    settings = load_settings(redis_url=redis_url, curriculum_config=path, stream_name=f"test:{tmp_path.name}")
    running = await start(settings, "127.0.0.1:0", CurriculumConfig.load(settings.curriculum_config))
    yield f"127.0.0.1:{running.server.port}"
    await running.stop(0)


def test_the_stack_config_carries_the_section_and_the_run() -> None:
    cfg = aiw_config()
    data = curriculum_config(cfg)
    loaded = CurriculumConfig.model_validate(data)  # the curriculum service's own strict model
    assert loaded.aiw.top_k == 5 and loaded.aiw.threshold == 0.6 and loaded.replay_ratio == 1.0
    assert loaded.policy_id == "shared" and loaded.group_size == 2 and loaded.seed == cfg.seed
    (bucket,) = loaded.buckets
    assert (bucket.game_id, bucket.variant, bucket.seats.bot) == ("werewolf_v1", "6p", "heuristic")


async def test_service_mode_draws_seeds_from_the_curriculum_and_replays_failures(
    curriculum: str, tmp_path: Path, redis_url: str
) -> None:
    cfg = aiw_config()
    trainer = Trainer(cfg, tmp_path / "run", redis_url, cache_dir=tmp_path / "models")
    trainer.publisher = Publisher(tmp_path / "policies", load_settings(), curriculum_addr=curriculum)
    plan = trainer.tasks(list(range(4)), 2, "u0")
    first = await trainer.service_tasks(plan)
    assert len(first) == 8 and len({t.group_id for t in first}) == 4
    for a, b in zip(first[::2], first[1::2], strict=True):
        assert (a.seed, a.group_id, a.task_id) == (b.seed, b.group_id, b.task_id)  # GRPO groups
    for t in first:  # seats bound by role for the seed the curriculum chose
        env = make_game("werewolf_v1", "6p")
        env.start(seed=t.seed)
        assert set(t.trainee_seats) == set(env.possible_agents)  # all four roles are the shared policy's
        assert all(b.controller == common_pb2.SEAT_CONTROLLER_POLICY for b in t.seats)
    # Nothing failed yet, so AIW has nothing to replay: fresh seeds. Now every task fails ...
    async with CurriculumClient(curriculum) as client:
        failed = [
            cur_pb.TaskOutcome(
                task_id=t.task_id,
                bucket=t.bucket,
                success=False,
                trajectory_id=f"tr-{i}",
                fingerprint=f"failure {t.seed}",
                score=0.0,
            )
            for i, t in enumerate(first[::2])
        ]
        assert await client.report_outcomes(failed) == 4
    # ... and with replay_ratio 1.0 the next update plays those seeds again.
    again = await trainer.service_tasks(trainer.tasks(list(range(4, 8)), 2, "u1"))
    assert {t.seed for t in again} <= {t.seed for t in first}
