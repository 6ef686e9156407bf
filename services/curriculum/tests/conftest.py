"""Shared by the curriculum's unit tests: the knobs table of the package README, the written spec of the
AIW and league defaults and bounds, and a check of a pydantic config class against it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

README = Path(__file__).resolve().parents[1] / "wolfpack_curriculum" / "README.md"
_ROW = re.compile(r"^\| `(\w+)\.(\w+)` \| ([^|]+?) \| ([^|]+?) \|", re.MULTILINE)


@dataclass(frozen=True)
class Knob:
    section: str
    name: str
    default: float
    allowed: str


def documented(section: str) -> list[Knob]:
    return [
        Knob(s, name, float(default), allowed)
        for s, name, default, allowed in _ROW.findall(README.read_text())
        if s == section
    ]


def _accepts(model: type[BaseModel], name: str, value: float) -> bool:
    try:
        model.model_validate({name: value})
    except ValidationError:
        return False
    return True


def check(model: type[BaseModel], knob: Knob) -> None:
    """The default is the documented one; each documented bound accepts its edge and rejects one step past."""
    assert getattr(model(), knob.name) == knob.default, knob
    step = 1 if model.model_fields[knob.name].annotation is int else 1e-6
    clauses = {"any": [], "0 to 1": [">= 0", "<= 1"]}.get(knob.allowed, knob.allowed.split(" and "))
    for clause in clauses:
        op, edge = clause.split()
        x = float(edge)
        inside, outside = {
            ">=": (x, x - step), ">": (x + step, x), "<=": (x, x + step), "<": (x - step, x),
        }[op]  # fmt: skip
        assert _accepts(model, knob.name, inside), (knob, inside)
        assert not _accepts(model, knob.name, outside), (knob, outside)


@pytest.fixture
def check_documented_knobs() -> Callable[[type[BaseModel], str], None]:
    """``f(model, section)``: every field of ``model`` is in the README table, with its default and bounds."""

    def run(model: type[BaseModel], section: str) -> None:
        knobs = documented(section)
        assert {k.name for k in knobs} == set(model.model_fields), "README table and config fields differ"
        for knob in knobs:
            check(model, knob)

    return run
