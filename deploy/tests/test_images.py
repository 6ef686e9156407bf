"""The image recipe (deploy/docker/Dockerfile), checked without a docker engine: hadolint over it, its layer
order and pins read from the file, the requirements each SERVICE x VARIANT installs computed by the same script
the build runs, the build context (.dockerignore) holding every path it copies, and the entrypoint run here the
way the image runs it (source tree on PYTHONPATH, nothing pip-installed)."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
SERVICES = ("environment", "inference", "reward", "curriculum", "rollout", "trainer", "web")

sys.path.insert(0, str(ROOT / "deploy" / "docker"))
import requirements as reqs  # noqa: E402


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DOCKERFILE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_multi_stage_pinned_non_root_and_dependencies_before_source() -> None:
    ins = instructions()
    args = {rest.split("=")[0]: rest.split("=", 1)[1] for word, rest in ins if word == "ARG" and "=" in rest}
    # the base is an exact release (major.minor.patch), never a floating tag
    assert re.fullmatch(r"python:3\.12\.\d+-slim-bookworm", args["PYTHON_IMAGE"]), args["PYTHON_IMAGE"]
    stages = [rest.split() for word, rest in ins if word == "FROM"]
    assert [s[-1] for s in stages] == ["deps", "runtime", "dev", "release"]
    assert stages[0][0] == stages[1][0] == "${PYTHON_IMAGE}"
    # the dependency install sees only pyproject.toml and the script, so a source edit never re-runs it
    deps = ins[: next(i for i, (w, r) in enumerate(ins) if w == "FROM" and r.endswith("runtime"))]
    copies = [r for w, r in deps if w == "COPY"]
    assert copies == ["pyproject.toml deploy/docker/requirements.py ./"]
    assert any(w == "RUN" and "pip install --no-cache-dir -r requirements.txt" in r for w, r in deps)
    runtime = ins[len(deps) :]
    order = [r for w, r in runtime if w == "COPY"]
    assert order[0] == "--from=deps /opt/venv /opt/venv" and {"libs ./libs", "services ./services"} <= set(
        order
    )
    # every stage that runs ends as UID 10001
    users = [(i, r) for i, (w, r) in enumerate(ins) if w == "USER"]
    assert users[-1][1] == "10001:10001"
    for start in [i for i, (w, r) in enumerate(ins) if w == "FROM" and not r.endswith("deps")]:
        later = [r for i, r in users if i > start]
        assert (later and later[-1] == "10001:10001") or ins[start][1].endswith("release")
    env = " ".join(r for w, r in runtime if w == "ENV")
    assert "WOLFPACK_RUN_DIR=/var/lib/wolfpack" in env and "HOME=/var/cache/wolfpack" in env
    assert any(
        "chown 10001:10001 /var/lib/wolfpack /var/cache/wolfpack" in r for w, r in runtime if w == "RUN"
    )


def test_pythonpath_covers_every_package_root() -> None:
    """The project is not pip-installed in the image: its package roots must all be on PYTHONPATH."""
    env = " ".join(r for w, r in instructions() if w == "ENV")
    path = re.search(r"PYTHONPATH=(\S+)", env)
    assert path
    roots = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"][
        "where"
    ]
    assert path.group(1).split(":") == [f"/app/{r}" for r in roots]


@pytest.mark.parametrize("service", SERVICES)
def test_requirements_per_service_and_variant(service: str) -> None:
    pyproject = ROOT / "pyproject.toml"
    base = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    for variant in ("cpu", "cuda"):
        lines = reqs.requirements(pyproject, service, variant)
        names = {reqs.package(r) for r in lines if not r.startswith("--")}
        assert {reqs.package(r) for r in base} <= names
        heavy = service in ("inference", "trainer")
        assert ("torch" in names) == heavy, (service, variant)
        # sotopia 0.1.5 caps openai<2 and vLLM 0.24 needs openai>=2: never both in one image
        assert ("sotopia" in names) == (
            service == "environment" or (service == "trainer" and variant == "cpu")
        )
        assert not ("sotopia" in names and "vllm" in names)
        if service == "web":  # the web view: aiohttp for its server, gRPC to the environment, nothing heavy
            assert "aiohttp" in names and "grpcio" in names
        if not heavy:
            assert lines == reqs.requirements(pyproject, service, "cpu")  # one image serves both
            continue
        torch = next(r for r in lines if r.startswith("torch=="))
        if variant == "cpu":
            assert torch == "torch==2.13.0+cpu" and "vllm" not in names
            assert lines[0] == "--extra-index-url https://download.pytorch.org/whl/cpu"
        else:
            # verl 0.9.1's vllm extra: torch 2.11.0, vllm 0.24.0, transformers 5.9.0 (shared/facts.md)
            assert torch == "torch==2.11.0+cu130"
            assert "vllm==0.24.0" in lines and "transformers==5.9.0" in lines
            assert not [r for r in lines if "2.13.0" in r]
            assert lines[0] == "--extra-index-url https://download.pytorch.org/whl/cu130"
        if service == "trainer":
            assert "verl==0.9.1" in lines and reqs.RAY in lines  # the Ray of KubeRay clusters
    with pytest.raises(ValueError, match="unknown service"):
        reqs.requirements(pyproject, "gateway", "cpu")


def test_build_context_holds_every_copied_path() -> None:
    """.dockerignore excludes everything but what the Dockerfile copies; a COPY of an excluded path would
    fail the build, so check each one against the rules (last match wins, as Docker applies them)."""
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def included(path: str) -> bool:
        keep = True
        for rule in rules:
            negate = rule.startswith("!")
            pattern = rule.lstrip("!")
            parts = path.split("/")  # a rule matching a directory covers what is inside it
            prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
            hit = pattern == "**" or any(fnmatch.fnmatch(p, pattern) for p in prefixes)
            if hit:
                keep = negate
        return keep

    for word, rest in instructions():
        if word == "COPY" and "--from=" not in rest:
            for src in [a for a in rest.split()[:-1] if not a.startswith("--")]:
                assert (ROOT / src).exists(), src
                assert included(src), src
    assert not included(".venv") and not included(".git") and not included("services/trainer/tests/test_x.py")
    assert included("libs/wolfpack/cli/main.py")


def test_entrypoint_runs_the_cli_from_the_source_tree(tmp_path: Path) -> None:
    """The image's `wolfpack` (entrypoint.sh) with PYTHONPATH as the Dockerfile sets it, against this checkout:
    commands pass through; no arguments serves IMAGE_SERVICE on every interface, which without the admin
    credential refuses to start and says why; the web image's no-argument command is `wolfpack web` (here
    told to listen beyond loopback while spectating, which it refuses)."""
    env_line = " ".join(r for w, r in instructions() if w == "ENV")
    match = re.search(r"PYTHONPATH=(\S+)", env_line)
    assert match
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": match.group(1).replace("/app", str(ROOT)),
        "HOME": str(tmp_path),
        "WOLFPACK_RUN_DIR": str(tmp_path / "run"),
    }
    script = str(ROOT / "deploy" / "docker" / "entrypoint.sh")
    missing = subprocess.run(
        ["sh", script], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert missing.returncode != 0 and "IMAGE_SERVICE is not set" in missing.stderr
    served = subprocess.run(
        ["sh", script], env={**env, "IMAGE_SERVICE": "reward", "WOLFPACK_ADMIN_SECRET": ""},
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert served.returncode != 0
    assert (
        "WOLFPACK_ADMIN_SECRET" in served.stdout + served.stderr
        and "0.0.0.0:50051" in served.stdout + served.stderr
    )
    web = subprocess.run(
        ["sh", script], env={**env, "IMAGE_SERVICE": "web", "WOLFPACK_WEB_ADDR": "0.0.0.0:0"},
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert web.returncode == 1 and "web: refusing to listen on 0.0.0.0:0" in web.stdout + web.stderr
