"""The worked examples of ``wolfpack_rewards.examples`` as fixtures (test modules cannot import each
other under importlib mode)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from wolfpack.v1 import trajectory_pb2
from wolfpack_games.scenarios import Scenario
from wolfpack_rewards import examples


@pytest.fixture
def ww() -> Callable[..., trajectory_pb2.Trajectory]:
    return examples.werewolf_trajectory


@pytest.fixture
def bargaining() -> Scenario:
    sc = examples.bargaining_scenario()
    assert sc.params["first"] == 0
    assert [p.private for p in sc.players] == [
        {"reservation": 728, "target": 654},
        {"reservation": 471, "target": 515},
    ]
    return sc


@pytest.fixture
def sc_traj() -> Callable[..., trajectory_pb2.Trajectory]:
    return examples.scenario_trajectory
