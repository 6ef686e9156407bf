"""``buf lint`` and ``buf breaking`` for ``proto/wolfpack/v1``, offline, with no buf.yaml in the tree.

Why a script rather than a committed ``buf.yaml``: our protos import ``google/rpc/status.proto``, which a
buf module would pull from the Buf Schema Registry (network). Instead the check assembles a throwaway
workspace: our protos, googleapis' ``status.proto`` copied from the googleapis-common-protos wheel (the
same file the generated code imports), and the configuration below. ``buf`` itself comes from PyPI
(``buf-bin``, a dev dependency).

- ``lint``: buf's STANDARD rules (naming, request/response per RPC, enum prefixes, package versioning).
- ``breaking``: buf's FILE rules (wire and generated-code compatibility) against the recorded image
  ``proto/buf-baseline.binpb``. A break made on purpose is recorded explicitly: ``baseline`` rewrites
  the image, and the commit that does so is the place to say why.

Usage: ``python proto/buf_check.py {lint,breaking,baseline}`` (``make proto-check`` runs lint + breaking).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
BASELINE = PROTO_ROOT / "buf-baseline.binpb"
CONFIG = {
    "version": "v2",
    "lint": {"use": ["STANDARD"], "ignore": ["google"]},
    "breaking": {"use": ["FILE"], "ignore": ["google"]},
}
"""buf.yaml (v2) of the throwaway workspace; ``google/`` is vendored input, not ours to lint or guard."""


def buf_binary() -> str:
    """The ``buf`` executable: next to this interpreter (the venv's, from buf-bin), else on PATH."""
    local = Path(sys.executable).parent / "buf"
    if local.exists():
        return str(local)
    found = shutil.which("buf")
    if found is None:
        raise SystemExit("buf not found: install the dev extra (`pip install -e .[dev]`, package buf-bin)")
    return found


def _workspace(tmp: Path, proto_root: Path) -> Path:
    import google.rpc.status_pb2

    shutil.copytree(proto_root / "wolfpack", tmp / "wolfpack")
    status = Path(google.rpc.status_pb2.__file__).with_name("status.proto")
    (tmp / "google" / "rpc").mkdir(parents=True)
    shutil.copy(status, tmp / "google" / "rpc" / "status.proto")
    (tmp / "buf.yaml").write_text(json.dumps(CONFIG))  # JSON is YAML
    return tmp


def run(
    command: str, against: Path = BASELINE, proto_root: Path = PROTO_ROOT
) -> subprocess.CompletedProcess[str]:
    """Run ``lint``, ``breaking`` (against ``against``) or ``baseline`` (write the image) on the protos
    under ``proto_root``; returns buf's result (exit status 0 when clean, 100 with findings on stdout)."""
    with tempfile.TemporaryDirectory() as tmp:
        ws = _workspace(Path(tmp), proto_root)
        args = {
            "lint": ["lint"],
            "breaking": ["breaking", "--against", str(against)],
            "baseline": ["build", "--exclude-source-info", "-o", str(against)],
        }[command]
        return subprocess.run(
            [buf_binary(), *args], cwd=ws, capture_output=True, text=True, timeout=120, check=False
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["lint", "breaking", "baseline"])
    ns = parser.parse_args(argv)
    result = run(ns.command)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.returncode == 0:
        done = {"lint": "buf lint: clean", "breaking": "buf breaking: no breaking changes against "
                "the baseline", "baseline": f"recorded {BASELINE.relative_to(ROOT)}"}  # fmt: skip
        print(done[ns.command])
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
