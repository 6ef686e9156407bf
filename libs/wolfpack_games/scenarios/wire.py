"""A ``Scenario`` on the wire: ``wolfpack.v1.Scenario`` (common.proto) and back.

Why a typed message rather than the scenario's JSON in ``Trajectory.metadata``: consumers (reward,
trainer, curriculum) read fields instead of parsing and validating a string, and buf's breaking-change
check covers the shape. Each parameter value keeps its kind (``int_value`` vs ``number_value``), so the
content hash, and with it the scenario id, survives the round trip; ``scenario_from_pb`` re-validates
the scenario (family rules, id, split) exactly as reading it from the store does.
"""

from __future__ import annotations

from collections.abc import Mapping

from wolfpack.v1 import common_pb2
from wolfpack_games.scenarios.models import ParamValue, PlayerInfo, Scenario


def _value_to_pb(value: ParamValue, out: common_pb2.ScenarioValue) -> None:
    if isinstance(value, bool):
        raise TypeError("scenario values are never booleans")
    if isinstance(value, int):
        out.int_value = value
    elif isinstance(value, float):
        out.number_value = value
    elif isinstance(value, str):
        out.string_value = value
    elif isinstance(value, dict):
        out.int_map.values.update(value)
    elif all(isinstance(v, dict) for v in value):
        for entry in value:
            out.int_map_list.values.add().values.update(entry)  # type: ignore[arg-type]
    elif all(isinstance(v, str) for v in value):
        out.string_list.values.extend(value)  # type: ignore[arg-type]
    else:
        out.int_list.values.extend(value)  # type: ignore[arg-type]


def _value_from_pb(msg: common_pb2.ScenarioValue) -> ParamValue:
    kind = msg.WhichOneof("kind")
    if kind == "int_value":
        return msg.int_value
    if kind == "number_value":
        return msg.number_value
    if kind == "string_value":
        return msg.string_value
    if kind == "int_list":
        return list(msg.int_list.values)
    if kind == "string_list":
        return list(msg.string_list.values)
    if kind == "int_map":
        return dict(msg.int_map.values)
    if kind == "int_map_list":
        return [dict(m.values) for m in msg.int_map_list.values]
    raise ValueError("a scenario value has no kind set")


def _values_to_pb(values: Mapping[str, ParamValue], out: Mapping[str, common_pb2.ScenarioValue]) -> None:
    for key, value in values.items():
        _value_to_pb(value, out[key])


def scenario_to_pb(scenario: Scenario) -> common_pb2.Scenario:
    """The wire form of a (validated) scenario."""
    msg = common_pb2.Scenario(
        scenario_id=scenario.id, family=scenario.family, difficulty=scenario.difficulty,
        template=scenario.template, tags=scenario.tags, split=scenario.split or "",
        public_text=scenario.public, max_turns=scenario.max_turns,
    )  # fmt: skip
    _values_to_pb(scenario.params, msg.params)
    for p in scenario.players:
        player = msg.players.add(seat=p.seat, name=p.name, role=p.role, brief=p.brief)
        _values_to_pb(p.private, player.private_params)
    return msg


def scenario_from_pb(msg: common_pb2.Scenario) -> Scenario:
    """The scenario in ``msg``, validated (raises ``ValueError``, e.g. pydantic's ``ValidationError``,
    when it breaks its family's rules or its id does not match its content)."""
    players = [
        PlayerInfo(
            seat=p.seat,
            name=p.name,
            role=p.role,
            brief=p.brief,
            private={k: _value_from_pb(v) for k, v in p.private_params.items()},
        )
        for p in msg.players
    ]
    return Scenario(
        id=msg.scenario_id, family=msg.family, difficulty=msg.difficulty,  # type: ignore[arg-type]
        template=msg.template, tags=list(msg.tags), split=msg.split or None,  # type: ignore[arg-type]
        public=msg.public_text, params={k: _value_from_pb(v) for k, v in msg.params.items()},
        players=players, max_turns=msg.max_turns,
    )  # fmt: skip
