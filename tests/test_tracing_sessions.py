"""Both tracing paths, each in its own pytest session, so neither depends on test order.

The OpenTelemetry SDK is process-global and cannot be uninstalled: once one test installs it, every server
started later in that process runs the full instrumentation. So the default session (this one) is the
production default, no ``OTEL_*`` and no SDK (the root conftest enforces it after every test), and the tests
marked ``tracing_sdk`` run here in a second session whose conftest installs the SDK before any test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEARCHED = ("tests", "libs", "services")


def marked_files() -> list[str]:
    """Test files with a ``tracing_sdk`` test, found by reading them (a new one is picked up unasked)."""
    found = []
    for top in SEARCHED:
        for path in sorted((ROOT / top).rglob("test_*.py")):
            if path.resolve() != Path(__file__).resolve() and "@pytest.mark.tracing_sdk" in path.read_text():
                found.append(str(path.relative_to(ROOT)))
    return found


def test_default_session_has_no_tracing_sdk() -> None:
    from wolfpack import telemetry

    assert not any(name.startswith("OTEL_") for name in os.environ)
    assert not telemetry.sdk_active()


def test_tracing_sdk_session_passes() -> None:
    files = marked_files()
    expected = sum(f.count("@pytest.mark.tracing_sdk") for f in (Path(ROOT / p).read_text() for p in files))
    assert expected >= 7, files  # rpc, stream, environment, inference x2, reward, end to end
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["WOLFPACK_TEST_TRACING"] = "sdk"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "tracing_sdk", "-p", "no:cacheprovider", *files],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # a bound for a hung child, not a timing claim
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed is not None and int(passed.group(1)) == expected, tail
