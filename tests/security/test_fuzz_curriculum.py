"""Fuzzing the curriculum and trainer services with Hypothesis, as ``test_fuzz.py`` does the environment,
inference and reward: every request type generated from its descriptor with plausible values mixed in,
with and without the service credential; any answer outside the documented statuses (docs/security.md)
fails. The curriculum runs on a real Redis, the trainer with a live tiny job (SaveCheckpoint writes real
checkpoints) and over run directories (GetTrainerStatus of finished runs)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import curriculum_service_pb2 as cur_pb
from wolfpack.v1 import curriculum_service_pb2_grpc as cur_grpc
from wolfpack.v1 import trainer_service_pb2 as tr_pb
from wolfpack.v1 import trainer_service_pb2_grpc as tr_grpc
from wolfpack_curriculum.config import CurriculumConfig
from wolfpack_curriculum.server import CurriculumServicer
from wolfpack_curriculum.server import register as register_cur
from wolfpack_curriculum.store import CurriculumStore
from wolfpack_trainer.config import TrainConfig
from wolfpack_trainer.server import register_live
from wolfpack_trainer.train import Trainer

from .conftest import SECRET
from .test_fuzz import FUZZ, _channel, expect_documented, message


@dataclass
class Servers:
    loop: asyncio.AbstractEventLoop
    curriculum: str
    trainer: str


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Servers]:
    root = tmp_path_factory.mktemp("fuzz-cur")
    cfg = TrainConfig.model_validate(
        {
            "name": "fuzzed",
            "game": {"id": "ultimatum_v1", "variant": "easy"},
            "policies": [{"id": "responder", "seats": [1], "model": "tiny"}],
            "train": {"updates": 3},
        }
    )
    trainer = Trainer(cfg, root / "runs" / "fuzzed", "redis://unused", cache_dir=root / "models")
    trainer.setup()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[Servers, Any]:
        settings = load_settings(rpc_timeout_s=30, admin_secret=SECRET)
        client = aioredis.Redis.from_url(redis_url)
        store = CurriculumStore(
            client,
            CurriculumConfig.model_validate(
                {
                    "key_prefix": f"test:fuzz:cur:{uuid.uuid4().hex}", "group_size": 2,
                    "buckets": [
                        {"game_id": "werewolf_v1", "variant": "6p",
                         "seats": {"trainee_seats": 1, "mix": {"self": 1, "league": 1}}},
                        {"game_id": "bargaining_v1", "variant": "easy", "seats": {"trainee_seats": [0]}},
                    ],
                }
            ),
        )  # fmt: skip
        cur = await rpc.start_server(
            "curriculum", lambda s: register_cur(s, CurriculumServicer(store)), settings, "127.0.0.1:0"
        )
        tr = await rpc.start_server("trainer", register_live(trainer), settings, "127.0.0.1:0")

        async def stop() -> None:
            await cur.stop(0)
            await tr.stop(0)
            await client.aclose()

        return Servers(loop, f"127.0.0.1:{cur.port}", f"127.0.0.1:{tr.port}"), stop

    started: Future[Any] = asyncio.run_coroutine_threadsafe(start(), loop)
    parts, stop = started.result(timeout=120)
    try:
        yield parts
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


HINTS: dict[str, st.SearchStrategy[Any]] = {
    "split": st.sampled_from(["", "train", "eval", "test"]),
    "bucket": st.sampled_from(["werewolf_v1/6p", "bargaining_v1/easy", "", "invented/x"]),
    "task_id": st.sampled_from(["werewolf_v1/6p#3/g", "werewolf_v1/6p#1000000001/g", "x#y", ""]),
    "trajectory_id": st.one_of(st.just(""), st.uuids().map(str)),
    "opponent_id": st.sampled_from(["scripted:heuristic", "checkpoint:p@1", "self:learner", "mix:a=1", ""]),
    "bot": st.sampled_from(["", "random", "heuristic"]),
    "policy_id": st.sampled_from(["", "p", "learner"]),
    "fingerprint": st.text(max_size=40),
    "directory": st.sampled_from(["", "exports/a", "../x", "/proc/self", "checkpoints", "/", "a\x00b"]),
    "run": st.sampled_from(["", "fuzzed", "nope", "../..", "/"]),
}

CUR_METHODS = ["NextTasks", "ReportOutcomes", "GetStats", "RegisterOpponent", "ListOpponents"]


@pytest.mark.parametrize("credential", [True, False], ids=["credential", "anonymous"])
@pytest.mark.parametrize("method", CUR_METHODS)
def test_curriculum_answers_only_documented_statuses(servers: Servers, method: str, credential: bool) -> None:
    stub = cur_grpc.CurriculumServiceStub(_channel(servers.curriculum, credential=credential))
    desc = cur_pb.DESCRIPTOR.services_by_name["CurriculumService"].methods_by_name[method].input_type

    @FUZZ
    @given(message(desc, HINTS))
    def check(req: Any) -> None:
        expect_documented(lambda: getattr(stub, method)(req, timeout=30))

    check()


@pytest.mark.parametrize("method", ["GetTrainerStatus", "SaveCheckpoint"])
def test_trainer_answers_only_documented_statuses(servers: Servers, method: str) -> None:
    stub = tr_grpc.TrainerServiceStub(_channel(servers.trainer, credential=True))
    desc = tr_pb.DESCRIPTOR.services_by_name["TrainerService"].methods_by_name[method].input_type

    @FUZZ
    @given(message(desc, HINTS))
    def check(req: Any) -> None:
        expect_documented(lambda: getattr(stub, method)(req, timeout=60))

    check()
