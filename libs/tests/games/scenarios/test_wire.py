"""``Scenario`` <-> ``wolfpack.v1.Scenario``: every family's scenarios survive the wire exactly (same
content, same id), through serialized bytes; a tampered message fails validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from wolfpack.v1 import common_pb2
from wolfpack_games.scenarios import available_families, generate_scenario
from wolfpack_games.scenarios.models import DIFFICULTIES
from wolfpack_games.scenarios.wire import scenario_from_pb, scenario_to_pb


@pytest.mark.parametrize("family", available_families())
def test_every_family_round_trips_exactly(family: str) -> None:
    for difficulty in DIFFICULTIES:
        for seed in (1, 2):
            scenario = generate_scenario(family, seed, difficulty)
            wire = common_pb2.Scenario.FromString(scenario_to_pb(scenario).SerializeToString())
            back = scenario_from_pb(wire)
            assert back.model_dump(mode="json") == scenario.model_dump(mode="json")
            assert back.id == scenario.id == wire.scenario_id


def test_int_and_float_values_keep_their_kind() -> None:
    scenario = generate_scenario("bargaining", 3)
    msg = scenario_to_pb(scenario)
    assert msg.players[0].private_params["reservation"].WhichOneof("kind") == "int_value"


def test_a_tampered_scenario_fails_validation() -> None:
    msg = scenario_to_pb(generate_scenario("bargaining", 4))
    msg.players[0].private_params["reservation"].int_value += 1  # content no longer matches the id
    with pytest.raises(ValidationError, match="content hash"):
        scenario_from_pb(msg)
    msg.params["cap"].Clear()
    with pytest.raises(ValueError, match="no kind"):
        scenario_from_pb(msg)
