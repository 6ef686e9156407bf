"""Credit assignment (``credit.assign``) against a hand-computed table, and a mode read from YAML."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from wolfpack.v1 import trajectory_pb2
from wolfpack_rewards.credit import assign
from wolfpack_rewards.specs import load_specs

WW = Callable[..., trajectory_pb2.Trajectory]

# Turns at positions 2, 5, 9; value 3.0. Discounted: turn k of n gets 3 * gamma ** (n - 1 - k).
TABLE = [
    ("terminal", 0.5, {9: 3.0}),
    ("uniform", 0.5, {2: 3.0, 5: 3.0, 9: 3.0}),
    ("discounted", 0.5, {2: 0.75, 5: 1.5, 9: 3.0}),  # 3 * 0.25, 3 * 0.5, 3 * 1
    ("discounted", 1.0, {2: 3.0, 5: 3.0, 9: 3.0}),  # gamma 1: no discount
]


@pytest.mark.parametrize(("mode", "gamma", "expected"), TABLE)
def test_assign_table(mode: str, gamma: float, expected: dict[int, float]) -> None:
    assert assign([2, 5, 9], 3.0, mode, gamma) == pytest.approx(expected)  # type: ignore[arg-type]


def test_default_gamma_is_no_discount() -> None:
    # The signature's default (gamma 1.0): discounted credit is the full value on every turn.
    assert assign([2, 5, 9], 3.0, "discounted") == pytest.approx({2: 3.0, 5: 3.0, 9: 3.0})


@pytest.mark.parametrize("mode", ["terminal", "uniform", "discounted"])
def test_single_turn_gets_the_value_in_every_mode(mode: str) -> None:
    assert assign([4], -1.0, mode, 0.5) == {4: -1.0}  # type: ignore[arg-type]


def test_mode_parsed_from_yaml_text() -> None:
    # A mode string built at run time (YAML), not the interned literal of the source code.
    mode = yaml.safe_load("mode: uniform")["mode"]
    assert assign([2, 5, 9], 3.0, mode, 0.5) == pytest.approx({2: 3.0, 5: 3.0, 9: 3.0})
    mode = yaml.safe_load("mode: terminal")["mode"]
    assert assign([2, 5, 9], 3.0, mode, 0.5) == {9: 3.0}


def test_uniform_spec_loaded_from_a_yaml_file(ww: WW, tmp_path: Path) -> None:
    path = tmp_path / "specs.yaml"
    path.write_text(
        "specs:\n  - {name: test_credit_yaml_uniform, version: 1, base: werewolf_outcome@1,\n"
        "     config: {credit: {mode: uniform, gamma: 0.5}}}\n"
    )
    (spec,) = load_specs(path)
    result = spec.score(ww())
    # Seat 0 (a winner) acts twice: uniform credit gives both turns the full +1 (discounted would be 0.5 + 1).
    seat0 = [t.reward for t in result.turns if t.seat == 0]
    assert seat0 == [1.0, 1.0]
    assert result.seat_reward(0) == 2.0
