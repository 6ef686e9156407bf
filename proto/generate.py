"""Generate Python code and typed stubs for ``proto/wolfpack/v1`` into ``libs/wolfpack/v1``.

The generated files are committed so that a plain ``pip install`` works without a build step;
``tests/test_protos.py`` regenerates them into a temporary directory and fails when the committed copy
is stale, so nobody edits generated code by hand.

Usage: ``python proto/generate.py [--out DIR]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
DEFAULT_OUT = ROOT / "libs"
PACKAGE = Path("wolfpack") / "v1"
INIT_TEXT = '"""Generated protobuf and gRPC code for the wolfpack.v1 package (do not edit)."""\n'


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / PACKAGE).glob("*.proto"))


def include_paths() -> list[Path]:
    """Import roots besides ``proto/``: protobuf's well-known types (shipped with grpcio-tools) and the
    googleapis protos (``google/rpc/status.proto``, shipped with googleapis-common-protos, whose Python
    modules the generated code imports at run time)."""
    import google.rpc.status_pb2
    import grpc_tools

    googleapis = Path(google.rpc.status_pb2.__file__).resolve().parent.parent.parent
    return [Path(grpc_tools.__file__).parent / "_proto", googleapis]


def generate(out: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) and return the generated files, relative to ``out``."""
    from grpc_tools import protoc

    # protoc finds the mypy-protobuf plugins on PATH; they live next to this interpreter.
    bindir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            *[f"-I{p}" for p in include_paths()],
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            *[str(p) for p in proto_files()],
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise SystemExit(f"protoc failed with exit code {rc}")
        gen_dir = Path(tmp) / PACKAGE
        (gen_dir / "__init__.py").write_text(INIT_TEXT)
        (gen_dir / "py.typed").write_text("")
        target = out / PACKAGE
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(gen_dir, target)
    return sorted(p.relative_to(out) for p in (out / PACKAGE).iterdir())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="root directory for wolfpack/v1")
    ns = parser.parse_args(argv)
    files = generate(ns.out)
    print(f"generated {len(files)} files into {ns.out / PACKAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
