"""bench/inference/bench_inference.py --backend replay: both paths return full-size responses, and the
table's per-call numbers come from them (a bench that silently measured empty responses would lie)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_replay_mode_measures_full_responses(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    cmd = [sys.executable, str(ROOT / "bench" / "inference" / "bench_inference.py"), "--backend", "replay",
           "--prompt-len", "64", "--max-tokens", "32", "--batch-sizes", "2,5", "--repeats", "1", "--logprobs",
           "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [2, 5]
    for r in rows:
        assert r["tokens"] == r["grpc_tokens"] == r["batch"] * 32
        assert 0 < r["inproc_us"] < r["servicer_us"] < r["grpc_us"]
    assert "replay (bench-only instant engine)" in proc.stdout
