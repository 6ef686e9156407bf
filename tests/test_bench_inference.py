"""bench/inference/bench_inference.py --backend replay: every path (in process, unary Generate, GenerateBatch
coalesced or not) returns full-size responses, and the table's per-call numbers come from them (a bench that
silently measured empty responses would lie)."""

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
           "--uncoalesced", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [2, 5]
    for r in rows:
        expected = r["batch"] * 32
        assert (
            r["tokens"] == r["unary_tokens"] == r["batch_tokens"] == r["batch-uncoalesced_tokens"] == expected
        )
        # Every path was timed (no ordering between them is asserted: timings belong to the bench's
        # table, and on a loaded machine a single repeat can come out in any order).
        for key in ("inproc_us", "servicer_unary_us", "unary_us", "servicer_batch_us", "batch_us",
                    "batch-uncoalesced_us"):  # fmt: skip
            assert r[key] > 0, key
    assert "replay (bench-only instant engine)" in proc.stdout
    assert "GenerateBatch" in proc.stdout
