"""The contracts CI enforces, offline: ``buf lint`` (STANDARD) and ``buf breaking`` (FILE) against the
recorded baseline image, the import-linter layers (``.importlinter``), and the client retry policy read
from the protos' idempotency options. Each check is shown to fail on a seeded violation, so none of them
passes vacuously."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from wolfpack import rpc

ROOT = Path(__file__).resolve().parent.parent


def _buf_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("buf_check", ROOT / "proto" / "buf_check.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUF = _buf_check()


def test_buf_lint_is_clean() -> None:
    result = BUF.run("lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_breaking_change_against_the_baseline() -> None:
    assert BUF.BASELINE.exists(), "record it: python proto/buf_check.py baseline"
    result = BUF.run("breaking")
    assert result.returncode == 0, (
        "wire-breaking change against proto/buf-baseline.binpb; if it is intended, re-record the baseline "
        "(python proto/buf_check.py baseline) and say why in the commit:\n" + result.stdout + result.stderr
    )


def test_buf_catches_a_renamed_field_and_a_bad_rpc_name(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "proto" / "wolfpack", tmp_path / "wolfpack")
    proto = tmp_path / "wolfpack" / "v1" / "reward_service.proto"
    text = proto.read_text()
    text = text.replace("string spec = 2;", "string spec_name = 2;", 1)
    text = text.replace("rpc Score(ScoreRequest)", "rpc ScoreIt(ScoreRequest)", 1)
    proto.write_text(text)
    breaking = BUF.run("breaking", proto_root=tmp_path)
    assert breaking.returncode != 0 and 'changed name from "spec" to "spec_name"' in breaking.stdout
    lint = BUF.run("lint", proto_root=tmp_path)
    assert lint.returncode != 0 and 'should be named "ScoreItRequest"' in lint.stdout


def _lint_imports(config: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "lint-imports"
    return subprocess.run(
        [str(exe), "--config", str(config), "--no-cache"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_import_contracts_are_kept() -> None:
    result = _lint_imports(ROOT / ".importlinter")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout
    # no excused import from the trainer into another service: it plays through the rollout client
    excused = [line.strip() for line in (ROOT / ".importlinter").read_text().splitlines() if " -> " in line]
    assert not [e for e in excused if e.startswith("wolfpack_trainer") and "-> wolfpack_trainer" not in e]


def test_import_contracts_catch_a_service_importing_another(tmp_path: Path) -> None:
    """The same contracts with one known import (environment's client) no longer excused: broken."""
    text = (ROOT / ".importlinter").read_text().replace("    ** -> wolfpack_environment.client\n", "")
    config = tmp_path / "importlinter.ini"
    config.write_text(text)
    result = _lint_imports(config)
    assert result.returncode != 0 and "-> wolfpack_environment.client" in result.stdout


def test_import_contracts_catch_a_cycle_in_the_trainer(tmp_path: Path) -> None:
    """The trainer's acyclic contract with its one package-level edge no longer excused: broken, naming it."""
    edge = "    wolfpack_trainer.learners.cpu -> wolfpack_trainer.algos\n"
    text = (ROOT / ".importlinter").read_text()
    assert edge in text
    config = tmp_path / "importlinter.ini"
    config.write_text(text.replace(edge, ""))
    result = _lint_imports(config)
    assert result.returncode != 0 and ".learners -> .algos" in result.stdout


def test_retried_methods_are_the_ones_the_protos_mark() -> None:
    """Reads and writes idempotent by key are retried; creates, pushes and streams of actions never."""
    methods = rpc.idempotent_methods()
    assert methods["wolfpack.v1.EnvironmentService"] == [
        "ListGames", "Observe", "GetObservation", "Act", "GetEpisode", "CloseEpisode", "ListEpisodes",
        "SpectateEpisode",
    ]  # fmt: skip
    assert methods["wolfpack.v1.InferenceService"] == [
        "Generate",
        "GenerateStream",
        "GenerateBatch",
        "GenerateBatchStream",  # generation has no side effects: retried at its start as GenerateBatch is
        "ListPolicies",
    ]
    assert methods["wolfpack.v1.RewardService"] == ["Score", "ListRewardSpecs"]
    never = {"CreateEpisode", "PlaySeats", "LoadPolicy", "PushWeights"}
    assert not never & {m for names in methods.values() for m in names}
    config = json.loads(rpc.service_config(methods))
    retried = {
        (n["service"], n["method"]) for c in config["methodConfig"] if "retryPolicy" in c for n in c["name"]
    }
    assert ("wolfpack.v1.EnvironmentService", "Act") in retried
    assert ("wolfpack.v1.EnvironmentService", "CreateEpisode") not in retried


def test_every_pluggable_part_uses_the_one_registry_shape() -> None:
    from wolfpack.registry import Registry
    from wolfpack_games.base import GAMES
    from wolfpack_games.scenarios.families import FAMILIES
    from wolfpack_inference.backends import BACKENDS
    from wolfpack_rewards.specs import SPECS
    from wolfpack_trainer.algos import ESTIMATORS
    from wolfpack_trainer.learners import LEARNERS

    assert "werewolf_v1" in GAMES and "bargaining" in FAMILIES
    assert {"transformers", "vllm", "openai"} <= set(BACKENDS) and "werewolf_outcome@1" in SPECS
    assert {"grpo", "gigpo"} <= set(ESTIMATORS) and "cpu" in LEARNERS
    assert all(isinstance(r, Registry) for r in (GAMES, FAMILIES, BACKENDS, SPECS, ESTIMATORS, LEARNERS))
