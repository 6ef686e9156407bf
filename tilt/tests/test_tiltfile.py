"""The Tiltfile evaluates (Starlark, with Tilt's builtins recorded) into builds and resources that match
the Dockerfiles and the Helm chart; the Dockerfiles pass hadolint. No docker or tilt is needed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import starlark as sl

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("environment", "inference", "reward", "curriculum", "rollout", "trainer")
# Tilt's `config` object, as far as our Tiltfile uses it.
PRELUDE = """
def _define_string(name): pass
def _parse(): return {}
config = struct(define_string = _define_string, parse = _parse)
"""


def evaluate(path: Path) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    module = sl.Module()
    for name in ("docker_build", "k8s_yaml", "helm", "k8s_resource", "sync"):

        def record(*args: Any, _name: str = name, **kwargs: Any) -> str:
            calls.append((_name, args, kwargs))
            return _name

        module.add_callable(name, record)
    globals_ = sl.Globals.extended_by([sl.LibraryExtension.StructType])
    ast = sl.parse(str(path), PRELUDE + path.read_text(), sl.Dialect.extended())
    sl.eval(module, ast, globals_)
    return calls


def test_tiltfile_builds_every_service_and_deploys_the_chart() -> None:
    calls = evaluate(ROOT / "tilt" / "Tiltfile")
    base = ROOT / "tilt"
    builds = {args[0]: kw for name, args, kw in calls if name == "docker_build"}
    assert set(builds) == {f"wolfpack-{s}" for s in SERVICES}
    for svc in SERVICES:
        dockerfile = (base / builds[f"wolfpack-{svc}"]["dockerfile"]).resolve()
        assert dockerfile == ROOT / "services" / svc / "Dockerfile"
    [helm_call] = [args for name, args, _kw in calls if name == "helm"]
    assert (base / helm_call[0]).resolve() == ROOT / "deploy" / "helm" / "wolfpack"
    resources = {args[0] for name, args, _kw in calls if name == "k8s_resource"}
    assert resources == {f"wolfpack-{s}" for s in SERVICES} | {"wolfpack-redis"}


def test_root_tiltfile_includes_the_real_one() -> None:
    assert 'include("./tilt/Tiltfile")' in (ROOT / "Tiltfile").read_text()


def test_dockerfiles_pass_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    for svc in SERVICES:
        result = subprocess.run(
            [hadolint, str(ROOT / "services" / svc / "Dockerfile")], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr
