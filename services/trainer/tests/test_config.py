"""Every training recipe in configs/ loads and validates; mistakes fail loudly with the valid names."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from wolfpack_trainer.config import ConfigError, load_config

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
RECIPES = sorted(p for p in CONFIGS.glob("*.yaml") if "policies" in (yaml.safe_load(p.read_text()) or {}))


def test_the_seed_recipes_are_all_there() -> None:
    names = {p.stem for p in RECIPES}
    assert {
        "demo-ultimatum",
        "werewolf-ppo",
        "werewolf-gigpo-aiw",
        "werewolf-12p-zh-grpo",
        "scenarios-selfplay-grpo-lora",
        "ippo-ultimatum",
    } <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_loads(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.name == path.stem
    cfg.algo_config()
    cfg.loss_config()
    cfg.batch_config()
    for policy in cfg.policies:
        cfg.learner_config(policy, "/tmp/models")


def _write(tmp_path: Path, **patch: object) -> Path:
    data = yaml.safe_load((CONFIGS / "demo-ultimatum.yaml").read_text())
    for dotted, value in patch.items():
        node = data
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = value
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"train__updatez": 3}, "updatez"),
        ({"algo__estimator": "ppo2"}, "grpo"),
        ({"loss__clip_ratoi": 0.1}, "clip_ratoi"),
        ({"game__id": "chess_v1"}, "chess_v1"),
        ({"game__bot": "genius"}, "heuristic"),
        ({"rollout__episodes_per_update": 30}, "multiple of"),
    ],
)
def test_mistakes_fail_with_a_readable_message(
    tmp_path: Path, patch: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(_write(tmp_path, **patch))
