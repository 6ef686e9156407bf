"""A scenario sent with CreateEpisode whose private numbers are not what the family reads is refused at
create with INVALID_ARGUMENT naming the field (issue 20: a coalition target of ``"x"``, ``"NaN"``, ``2.5``
or a list answered INTERNAL with a logged traceback, when the scripted seats or the verdict read it;
the trust family's trustee target was just as unchecked). Real environment server over gRPC."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack.v1 import environment_service_pb2_grpc as pb_grpc
from wolfpack_environment.server import EnvironmentServicer, register
from wolfpack_environment.sessions import EpisodeManager, Limits
from wolfpack_games.scenarios.generator import generate_scenario


@pytest.fixture
async def stub() -> AsyncIterator[pb_grpc.EnvironmentServiceStub]:
    servicer = EnvironmentServicer(EpisodeManager(Limits(max_episodes=100)))
    settings = load_settings(rpc_timeout_s=20)
    server = await rpc.start_server("environment", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield pb_grpc.EnvironmentServiceStub(channel)
    servicer.manager.close_all()
    await server.stop(0)


def _with_private(family: str, seat: int, key: str, value: Any) -> str:
    data = generate_scenario(family, 3, "easy").model_dump(mode="json")
    data["players"][seat]["private"][key] = value
    data["id"], data["split"] = "", None  # the content changed: let the model derive them again
    return json.dumps(data)


async def _create(
    stub: pb_grpc.EnvironmentServiceStub, family: str, scenario: str
) -> pb.CreateEpisodeResponse:
    request = pb.CreateEpisodeRequest(
        game=common_pb2.GameRef(game_id=f"{family}_v1"), seed=1, options={"scenario": scenario}
    )
    # Every seat scripted: the bots read the targets.
    return await stub.CreateEpisode(request, timeout=20)  # type: ignore[misc,no-any-return]


BAD = ["x", "NaN", 2.5, [1, 2], {"a": 1}, -3]


@pytest.mark.parametrize(("family", "seat"), [("coalition", 0), ("coalition", 2), ("trust", 1)])
@pytest.mark.parametrize("bad", BAD, ids=repr)
async def test_a_bad_private_target_is_invalid_argument_naming_it(
    stub: pb_grpc.EnvironmentServiceStub, family: str, seat: int, bad: Any
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _create(stub, family, _with_private(family, seat, "target", bad))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert "target" in (err.value.details() or "")


@pytest.mark.parametrize("family", ["coalition", "trust"])
async def test_the_generated_scenario_still_plays(stub: pb_grpc.EnvironmentServiceStub, family: str) -> None:
    data = generate_scenario(family, 3, "easy").model_dump(mode="json")
    created = await _create(stub, family, json.dumps(data))
    assert created.episode_id
