"""The wire contracts: buf-style lint rules on the compiled descriptors, and generated code not stale."""

from __future__ import annotations

import filecmp
import importlib.util
import re
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto" / "wolfpack" / "v1"
PASCAL = re.compile(r"^[A-Z][A-Za-z0-9]*$")
SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")
UPPER_SNAKE = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _load_generate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate", ROOT / "proto" / "generate.py")
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def _descriptors() -> descriptor_pb2.FileDescriptorSet:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        files = [str(p) for p in sorted(PROTO_DIR.glob("*.proto"))]
        rc = protoc.main(
            [
                "protoc",
                f"-I{ROOT / 'proto'}",
                *[f"-I{p}" for p in _load_generate().include_paths()],
                "--include_source_info",
                f"--descriptor_set_out={out}",
                *files,
            ]
        )
        assert rc == 0, "protos do not compile"
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


FDS = _descriptors()


def _upper_snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def _commented_paths(f: descriptor_pb2.FileDescriptorProto) -> set[tuple[int, ...]]:
    return {tuple(loc.path) for loc in f.source_code_info.location if loc.leading_comments.strip()}


def test_package_matches_directory() -> None:
    assert FDS.file, "no proto files found"
    for f in FDS.file:
        assert f.package == "wolfpack.v1", f.name
        assert f.name.startswith("wolfpack/v1/"), f.name


def test_naming_rules() -> None:
    problems: list[str] = []
    for f in FDS.file:
        for m in f.message_type:
            if not PASCAL.match(m.name):
                problems.append(f"message {m.name} is not PascalCase")
            problems += [
                f"field {m.name}.{fd.name} is not snake_case" for fd in m.field if not SNAKE.match(fd.name)
            ]
        enums = list(f.enum_type) + [e for m in f.message_type for e in m.enum_type]
        for e in enums:
            prefix = _upper_snake(e.name) + "_"
            if e.value[0].name != prefix + "UNSPECIFIED" or e.value[0].number != 0:
                problems.append(f"enum {e.name} must start with {prefix}UNSPECIFIED = 0")
            for v in e.value:
                if not v.name.startswith(prefix) or not UPPER_SNAKE.match(v.name):
                    problems.append(f"enum value {v.name} must be UPPER_SNAKE prefixed with {prefix}")
        for s in f.service:
            if not s.name.endswith("Service"):
                problems.append(f"service {s.name} must end in Service")
            for rpc in s.method:
                req, resp = rpc.input_type.split(".")[-1], rpc.output_type.split(".")[-1]
                if not (req.endswith("Request") and resp.endswith("Response")):
                    problems.append(f"rpc {s.name}.{rpc.name} must use its own XRequest/XResponse")
                if req.startswith("google.protobuf") or "Empty" in (req, resp):
                    problems.append(f"rpc {s.name}.{rpc.name} must not use Empty")
    assert not problems, "\n".join(problems)


def test_every_element_is_commented() -> None:
    # descriptor.proto field numbers: FileDescriptorProto.message_type=4, enum_type=5, service=6;
    # DescriptorProto.field=2, enum_type=4; EnumDescriptorProto.value=2; ServiceDescriptorProto.method=2.
    missing: list[str] = []
    for f in FDS.file:
        commented = _commented_paths(f)
        for i, m in enumerate(f.message_type):
            if (4, i) not in commented:
                missing.append(f"message {m.name}")
            for j, fd in enumerate(m.field):
                if (4, i, 2, j) not in commented:
                    missing.append(f"field {m.name}.{fd.name}")
        for i, e in enumerate(f.enum_type):
            if (5, i) not in commented:
                missing.append(f"enum {e.name}")
            for j, v in enumerate(e.value):
                if (5, i, 2, j) not in commented:
                    missing.append(f"enum value {v.name}")
        for i, s in enumerate(f.service):
            if (6, i) not in commented:
                missing.append(f"service {s.name}")
            for j, rpc in enumerate(s.method):
                if (6, i, 2, j) not in commented:
                    missing.append(f"rpc {s.name}.{rpc.name}")
    assert not missing, "uncommented: " + ", ".join(missing)


def test_trajectory_carries_what_the_trainer_needs() -> None:
    from wolfpack.v1 import trajectory_pb2

    turn = trajectory_pb2.Turn.DESCRIPTOR.fields_by_name
    for name in (
        "prompt_token_ids",
        "response_token_ids",
        "response_logprobs",
        "action",
        "valid",
        "reward",
        "prediction",
    ):
        assert name in turn
    traj = trajectory_pb2.Trajectory.DESCRIPTOR.fields_by_name
    for name in ("trajectory_id", "turns", "outcomes", "policy_versions", "trace", "seats"):
        assert name in traj


@pytest.mark.slow
def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    _load_generate().generate(tmp_path)
    fresh, committed = tmp_path / "wolfpack" / "v1", ROOT / "libs" / "wolfpack" / "v1"
    names = sorted(p.name for p in fresh.iterdir())
    assert names == sorted(p.name for p in committed.iterdir() if p.name != "__pycache__")
    _match, mismatch, errors = filecmp.cmpfiles(fresh, committed, names, shallow=False)
    assert not mismatch and not errors, f"stale generated code, run `make proto`: {mismatch + errors}"
