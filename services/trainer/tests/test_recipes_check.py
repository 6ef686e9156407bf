"""``wolfpack train --check`` over every recipe in configs/ (what CI runs), and what it plans: service mode
binds role-based policies to the seats dealt those roles, game options reach the episodes, and the opponent
mix is the same in every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from wolfpack.cli.main import app
from wolfpack.v1 import common_pb2
from wolfpack_games import make_game
from wolfpack_trainer.config import ConfigError, load_config
from wolfpack_trainer.train import plan_tasks, service_task

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
RECIPES = sorted(CONFIGS.glob("*.yaml"))
runner = CliRunner()


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_check_passes_every_recipe(path: Path) -> None:
    result = runner.invoke(app, ["train", "-c", str(path), "--check"])
    assert result.exit_code == 0, result.output
    assert f"{path}: ok ({path.stem}:" in result.output


def test_check_refuses_an_unresolvable_opponent_in_one_line(tmp_path: Path) -> None:
    data = yaml.safe_load((CONFIGS / "werewolf-12p-zh-grpo.yaml").read_text())
    data["rollout"]["opponents"] = [{"bot": "external:strong", "fraction": 0.2}]
    del data["opponent_policies"]
    path = tmp_path / "strong.yaml"
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["train", "-c", str(path), "--check"])
    assert result.exit_code == 2
    assert "has no bot 'external:strong'" in result.output and "opponent_policies" in result.output
    assert "Traceback" not in result.output


def test_check_takes_overrides_and_refuses_unknown_keys() -> None:
    demo = str(CONFIGS / "demo-ultimatum.yaml")
    ok = runner.invoke(
        app, ["train", "-c", demo, "--check", "rollout.episodes_per_update=16", "eval.episodes=64"]
    )
    assert ok.exit_code == 0, ok.output
    assert "80 episodes planned" in ok.output  # 16 for the update, 64 held-out
    bad = runner.invoke(app, ["train", "-c", demo, "--check", "train.updatez=2"])
    assert bad.exit_code == 2 and "updatez" in bad.output


def test_check_says_where_a_self_play_policy_trains_and_is_evaluated() -> None:
    aiw = str(CONFIGS / "gpu-werewolf-gigpo-aiw-smollm2.yaml")
    result = runner.invoke(app, ["train", "-c", aiw, "--check"], terminal_width=400)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "opponents: 50% of the training groups give the seats of wolves to the heuristic bot" in said
    assert "eval replaces: the held-out games give the seats of wolves to the heuristic bot" in said
    roles = runner.invoke(
        app, ["train", "-c", aiw, "--check", "eval.replaces=[]", "eval.roles={village: [seer]}"]
    )
    said = " ".join(roles.output.split())
    assert roles.exit_code == 0, roles.output
    assert (
        "eval roles: the held-out games seat village on seer only (eval.roles; it trains on villager, seer, "
        "witch), every other role plays the heuristic bot"
    ) in said
    assert "opponents: 50%" in said and "eval replaces" not in said
    served = runner.invoke(
        app,
        ["train", "-c", str(CONFIGS / "gpu-werewolf-12p-zh-grpo-smollm2.yaml"), "--check"],
        terminal_width=400,
    )
    assert (
        "opponents: 20% of the training groups give the untrained seats to the served policy frozen"
        in " ".join(served.output.split())
    )


def test_option_files_are_not_in_configs_top_level() -> None:
    for path in RECIPES:
        data = yaml.safe_load(path.read_text())
        assert {"name", "game", "policies"} <= set(data), f"{path} is not a training config"
    assert (CONFIGS / "play" / "werewolf-9p-wolf-king.yaml").exists()


def test_service_mode_binds_policies_by_role() -> None:
    """Every seat dealt a trained role is a POLICY seat of that policy in the curriculum Task; the others
    are the wolves' bot, and the options (the wolf king) are carried to CreateEpisode."""
    cfg = load_config(CONFIGS / "werewolf-12p-zh-grpo.yaml")
    tasks = plan_tasks(cfg, list(range(12)), 1, "u0", bot_mix=False)
    for i, task in enumerate(tasks):
        out = service_task(task, i)
        env = make_game("werewolf_v1", "12p")
        env.start(seed=task.seed, options={"wolf_king": True, "language": "zh"})
        roles = {s: env.role(s) for s in env.possible_agents}
        trained = {s for s, r in roles.items() if r in cfg.policies[0].roles}
        assert set(out.trainee_seats) == trained and len(trained) == 8
        for b in out.seats:
            if b.seat in trained:
                assert b.controller == common_pb2.SEAT_CONTROLLER_POLICY and b.policy.policy_id == "player"
            else:
                assert roles[b.seat] in ("werewolf", "wolf_king")
                assert b.controller == common_pb2.SEAT_CONTROLLER_SCRIPTED and b.bot == "heuristic"
        assert json.loads(out.options["wolf_king"]) is True and json.loads(out.options["language"]) == "zh"
        assert len(out.seats) == 12


def test_served_opponents_take_the_other_seats() -> None:
    cfg = load_config(CONFIGS / "werewolf-12p-zh-grpo.yaml", ["rollout.opponents.0.fraction=1.0"])
    out = service_task(plan_tasks(cfg, [3], 8, "u0")[0], 0)
    others = [b for b in out.seats if b.seat not in out.trainee_seats]
    assert len(others) == 4
    assert all(
        b.controller == common_pb2.SEAT_CONTROLLER_POLICY and b.policy.policy_id == "strong" for b in others
    )
    assert out.opponent_id == "external:strong"


_MIX = """
import sys
from wolfpack_trainer.config import load_config
from wolfpack_trainer.train import plan_tasks
cfg = load_config(sys.argv[1], ["rollout.opponents.0.fraction=0.5"])
print(",".join(t.opponent_policy or t.bot for t in plan_tasks(cfg, list(range(40)), 1, "u3")))
"""


def test_the_opponent_mix_is_the_same_in_every_process() -> None:
    """Python salts str hashes per process (PYTHONHASHSEED): a mix seeded with ``hash()`` differed between
    two runs of one config."""
    path = str(CONFIGS / "werewolf-12p-zh-grpo.yaml")
    outs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        res = subprocess.run(
            [sys.executable, "-c", _MIX, path], env=env, capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 0, res.stderr
        outs.append(res.stdout.strip())
    assert outs[0] == outs[1]
    drawn = outs[0].split(",")
    assert 5 < drawn.count("strong") < 35  # both kinds are drawn


def test_a_role_restricted_opponent_takes_only_those_roles() -> None:
    """The 12p villagers recipe: its frozen checkpoint plays the wolves only; the untrained seer, witch,
    guard and hunter stay the heuristic bot's (without ``roles`` the served policy took them too)."""
    path = CONFIGS / "gpu-werewolf-12p-zh-grpo-villagers-smollm2.yaml"
    cfg = load_config(path, ["rollout.opponents.0.fraction=1.0"])
    for seed in (3, 4):
        out = service_task(plan_tasks(cfg, [seed], 8, "u0")[0], 0)
        env = make_game("werewolf_v1", "12p")
        env.start(seed=seed, options={"wolf_king": True, "language": "zh"})
        by_role: dict[str, set[str]] = {}
        for b in out.seats:
            who = b.policy.policy_id if b.controller == common_pb2.SEAT_CONTROLLER_POLICY else f"bot:{b.bot}"
            by_role.setdefault(env.role(b.seat), set()).add(who)
        assert by_role == {
            "villager": {"villagers"},
            "werewolf": {"frozen"},
            "wolf_king": {"frozen"},
            "seer": {"bot:heuristic"},
            "witch": {"bot:heuristic"},
            "guard": {"bot:heuristic"},
            "hunter": {"bot:heuristic"},
        }
        assert sorted(out.trainee_seats) == sorted(s for s in range(12) if env.role(s) == "villager")
        assert out.opponent_id == "external:frozen"


def test_a_role_restricted_scripted_opponent_plays_only_its_roles() -> None:
    """A scripted entry with roles: its bot on those roles' seats, ``game.bot`` on the other untrained ones,
    in the proto both modes play (``service_task``)."""
    mix = '[{"bot": "random", "fraction": 1.0, "roles": ["werewolf"]}]'
    cfg = load_config(
        CONFIGS / "werewolf-ppo.yaml", ["policies.0.roles=[villager]", f"rollout.opponents={mix}"]
    )
    out = service_task(plan_tasks(cfg, [5], 1, "u0")[0], 0)
    env = make_game("werewolf_v1", "9p")
    env.start(seed=5)
    bots = {env.role(b.seat): b.bot for b in out.seats if b.controller == common_pb2.SEAT_CONTROLLER_SCRIPTED}
    assert bots["werewolf"] == "random" and {"seer", "witch", "hunter"} <= set(bots)
    assert all(bot == cfg.game.bot for role, bot in bots.items() if role != "werewolf")
    assert out.opponent_id == "scripted:random"


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        (["dragon"], "role 'dragon' is not dealt"),
        (["villager"], "role 'villager' is policy villagers's"),
    ],
)
def test_opponent_roles_are_checked(roles: list[str], message: str) -> None:
    mix = json.dumps([{"policy": "frozen", "fraction": 0.2, "roles": roles}])
    with pytest.raises(ConfigError, match=message):
        load_config(CONFIGS / "gpu-werewolf-12p-zh-grpo-villagers-smollm2.yaml", [f"rollout.opponents={mix}"])
