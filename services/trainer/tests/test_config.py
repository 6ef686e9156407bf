"""Every training recipe in configs/ loads and validates; mistakes fail loudly with the valid names, and
``key=value`` overrides meet the same strict validation as the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from wolfpack_trainer.config import ConfigError, apply_overrides, load_config
from wolfpack_trainer.learners.base import get_learner

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
RECIPES = sorted(CONFIGS.glob("*.yaml"))
"""Every YAML file directly in configs/ is a training config (option files live in configs/play/)."""


def test_the_seed_recipes_are_all_there() -> None:
    names = {p.stem for p in RECIPES}
    assert {
        "demo-ultimatum",
        "werewolf-ppo",
        "werewolf-gigpo-aiw",
        "werewolf-12p-zh-grpo",
        "gpu-scenarios-selfplay-lora-smollm2",
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


def _write(tmp_path: Path, base: str = "demo-ultimatum", **patch: object) -> Path:
    data = yaml.safe_load((CONFIGS / f"{base}.yaml").read_text())
    for dotted, value in patch.items():
        node = data
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
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
        # learner capabilities, named by key
        (
            {"policies__0__learner": "verl_fsdp", "rollout__mode": "local"},
            "does not support rollout.mode local",
        ),
        ({"policies__0__learner": "nope"}, "unknown learner 'nope'; valid: cpu"),
        ({"policies__0__device": "tpu"}, "device 'tpu'"),
        ({"algo__estimator": "gae"}, "gae needs value_head"),
        # seats, roles, opponents
        ({"policies__0__seats": [2]}, "seat 2 out of range"),
        ({"policies__0__roles": ["seer"]}, "role 'seer' is not dealt"),
        ({"rollout__opponents": [{"bot": "external:strong", "fraction": 0.2}]}, "served by inference"),
        ({"rollout__opponents": [{"policy": "strong", "fraction": 0.2}]}, "not in opponent_policies"),
        ({"rollout__opponents": [{"bot": "random", "policy": "x", "fraction": 0.2}]}, "exactly one"),
        ({"opponent_policies": [{"id": "strong", "model": "tiny"}]}, "no rollout.opponents entry"),
        (
            {"policies__0__seats": [0, 1], "rollout__opponents": [{"bot": "random", "fraction": 0.5}]},
            "every seat",
        ),
        # sections that would be unread
        ({"game__options": {"max_reprompts": 9}}, "game.options"),
        ({"rollout__mode": "local", "curriculum": {"aiw": {"top_k": 3}}}, "curriculum: applies only"),
        ({"rollout__max_prompt_tokens": -1}, "max_prompt_tokens"),
        ({"rollout__mode": "local", "inference": {"backend": "vllm"}}, "inference: applies only"),
        ({"rollout__reward_spec": "nope@1"}, "unknown reward spec"),
        (
            {"rollout__invalid_penalty": 0.5},
            "invalid_penalty: 0.5 differs from reward spec scenario_shaped@1",
        ),
        ({"curriculum": {"aiw": {"top_k": 3}, "replay": 0.5}}, "replay"),
        (
            {"batch": {"layout": "episode", "skip_actions": ["speak"]}},
            "skip_actions .* needs batch.layout: turn",
        ),
    ],
)
def test_mistakes_fail_with_a_readable_message(
    tmp_path: Path, patch: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(_write(tmp_path, **patch))


def test_capabilities_are_the_learner_class_s_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A learner without "lora" refuses ``lora_rank`` by name; giving its class the capability is the whole
    change that makes the same config valid."""
    verl = get_learner("verl_fsdp")
    path = _write(tmp_path, policies__0__learner="verl_fsdp", policies__0__lora_rank=8, warmstart=None,
                  policies__0__target_kl=0.0)  # fmt: skip
    monkeypatch.setattr(verl, "capabilities", frozenset())
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert "policy responder: learner 'verl_fsdp' does not support lora_rank > 0" in text
    assert "errors.pydantic.dev" not in text and "input_value" not in text
    monkeypatch.setattr(verl, "capabilities", frozenset({"lora"}))
    assert load_config(path).policies[0].lora_rank == 8
    gae = _write(
        tmp_path,
        policies__0__learner="verl_fsdp",
        policies__0__value_head=True,
        algo__estimator="gae",
        policies__0__target_kl=0.0,
    )
    with pytest.raises(ConfigError, match="does not support value_head: true"):
        load_config(gae)
    monkeypatch.setattr(verl, "capabilities", frozenset({"lora", "value_head"}))
    assert load_config(gae).policies[0].value_head
    assert "errors.pydantic.dev" not in text and "input_value" not in text
    # the demo's early stop on the policy's KL is the CPU learner's; verl's actor has none, so it is refused
    early = _write(tmp_path, policies__0__learner="verl_fsdp")
    with pytest.raises(ConfigError, match="does not support target_kl > 0"):
        load_config(early)
    monkeypatch.setattr(verl, "capabilities", frozenset({"target_kl"}))
    assert load_config(early).policies[0].target_kl == 0.2


def test_role_based_policies_check_roles_against_the_dealt_game(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="role 'guard' is not dealt in werewolf_v1/9p"):
        load_config(_write(tmp_path, "werewolf-ppo", policies__0__roles=["villager", "guard"]))
    with pytest.raises(ConfigError, match="role 'wolf_king' is not dealt"):
        load_config(
            _write(tmp_path, "werewolf-12p-zh-grpo", game__options={}, policies__0__roles=["wolf_king"])
        )


def test_overrides_apply_with_yaml_values() -> None:
    path = CONFIGS / "demo-ultimatum.yaml"
    cfg = load_config(
        path, ["train.updates=2", "rollout.temperature=0.7", "policies.0.lr=1e-4", "algo.estimator=rloo"]
    )
    assert cfg.train.updates == 2
    assert cfg.rollout.temperature == 0.7
    assert cfg.policies[0].lr == pytest.approx(1e-4)
    assert cfg.algo_config().estimator == "rloo"
    base = load_config(path)
    assert base.train.updates != 2  # the file itself is untouched


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.updatez=2", "updatez"),
        ("trian.updates=2", "trian"),
        ("loss.clip_ratoi=0.1", "clip_ratoi"),
        ("train.updates", "key.path=value"),
        ("name.x=1", "name is not a section"),
        ("policies.7.lr=1", "policies.7 is not a section"),
        ("train.updates=[1", "not YAML"),
        ("train.updates=many", "updates"),
    ],
)
def test_bad_overrides_are_errors(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(CONFIGS / "demo-ultimatum.yaml", [override])


def test_apply_overrides_copies() -> None:
    data = {"train": {"updates": 1}}
    out = apply_overrides(data, ["train.updates=3"])
    assert out == {"train": {"updates": 3}} and data == {"train": {"updates": 1}}


@pytest.mark.slow
def test_train_tracking_feeds_verl_tracking_and_check_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``train.tracking`` reaches verl's ``Tracking`` through the trainer's metrics writer (its ``file``
    backend works offline: every logged row arrives there too), ``--check`` names the trackers, a tracker
    verl does not have or whose package is missing is refused at load, and console/tensorboard (always on)
    are accepted as no-ops."""
    from wolfpack_trainer.cli import check_plan
    from wolfpack_trainer.train import Trainer

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "verl.jsonl"))
    path = _write(tmp_path, train__tracking=["console", "tensorboard", "file"], train__tracking_project="p")
    cfg = load_config(path)
    assert cfg.train.extra_trackers == ["file"]
    assert check_plan(cfg, path).endswith("; tracking file)")
    trainer = Trainer(cfg, tmp_path / "run", "redis://unused", cache_dir=tmp_path / "cache")
    trainer.metrics.log(3, {"charts/win_rate": 0.75})
    trainer.metrics.close()
    (row,) = [json.loads(line) for line in (tmp_path / "verl.jsonl").read_text().splitlines()]
    assert row == {"step": 3, "data": {"charts/win_rate": 0.75}}
    with pytest.raises(ConfigError, match="unknown tracker 'neptune'"):
        load_config(_write(tmp_path, train__tracking=["neptune"]))
    from wolfpack_trainer.config import TRACKERS

    monkeypatch.setitem(TRACKERS, "wandb", "wolfpack_no_such_package")  # as on a machine without wandb
    with pytest.raises(ConfigError, match="wandb needs the 'wolfpack_no_such_package' package"):
        load_config(_write(tmp_path, train__tracking=["wandb"]))


def test_tracker_names_are_verl_tracking_backends() -> None:
    """Every ``train.tracking`` name is one verl's ``Tracking`` knows (the list is kept here so loading a
    config does not import verl)."""
    from verl.utils.tracking import Tracking

    from wolfpack_trainer.config import TRACKERS

    assert set(TRACKERS) <= set(Tracking.supported_backend)


def test_a_key_given_twice_is_an_error_naming_both_lines(tmp_path: Path) -> None:
    """YAML alone keeps the last of two equal keys: an edit of the first would silently do nothing."""
    base = (CONFIGS / "demo-ultimatum-local.yaml").read_text()
    twice = tmp_path / "twice.yaml"
    twice.write_text(base + "eval: {every: 1, episodes: 4}\n")
    first = 1 + next(i for i, line in enumerate(base.splitlines()) if line.startswith("eval:"))
    with pytest.raises(ConfigError, match=rf"found the key 'eval' twice \(first on line {first}\)"):
        load_config(twice)
    nested = tmp_path / "nested.yaml"  # the demo's game section names its bot: a second one inside it
    nested.write_text(base.replace("game: {id: ultimatum_v1,", "game: {bot: random, id: ultimatum_v1,", 1))
    assert nested.read_text() != base
    with pytest.raises(ConfigError, match="found the key 'bot' twice"):
        load_config(nested)
    # a merge key's values may be overridden by the mapping's own keys, as YAML intends
    merged = tmp_path / "merged.yaml"
    merged.write_text(
        "name: m\ngame: {id: ultimatum_v1, variant: outside, bot: heuristic}\n"
        "policies:\n  - &p {id: proposer, seats: [0], model: tiny}\n  - {<<: *p, id: responder, seats: [1]}\n"
    )
    assert [p.id for p in load_config(merged).policies] == ["proposer", "responder"]
