"""Every recipe's ``curriculum:`` section is valid for the curriculum service.

Why here: the trainer config carries that section through as a plain mapping (the trainer may not import
the curriculum package), so nothing on the trainer's side would notice a misspelt AIW key; the curriculum's
own config model forbids unknown keys, and this cross-service test holds the recipes to it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from wolfpack_curriculum.config import CurriculumConfig

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
WITH_CURRICULUM = [
    p
    for p in CONFIGS
    if isinstance(yaml.safe_load(p.read_text()), dict) and "curriculum" in yaml.safe_load(p.read_text())
]


def test_some_recipe_sets_curriculum_options() -> None:
    assert WITH_CURRICULUM, "no recipe has a curriculum section: this test would check nothing"


@pytest.mark.parametrize("path", WITH_CURRICULUM, ids=lambda p: p.name)
def test_recipe_curriculum_section_validates(path: Path) -> None:
    section = yaml.safe_load(path.read_text())["curriculum"]
    CurriculumConfig.model_validate(section)


def test_a_misspelt_aiw_key_is_rejected() -> None:
    with pytest.raises(ValidationError, match="neighbour_boost"):
        CurriculumConfig.model_validate({"aiw": {"neighbour_boost": 0.5}})
