"""bench/trainer/bench_conversation_layout.py at its smallest (two 6p games, one round, the tiny tokenizer):
the two shapes hold the same games (same turns), the turn layout one sample per turn, the episode layout one
sequence per seat-game and fewer real tokens, and both shapes were timed. No timing is compared: the
table's ratios belong to the bench, and on a shared CPU one round can come out either way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_two_6p_games_in_both_shapes(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    cmd = [sys.executable, str(ROOT / "bench" / "trainer" / "bench_conversation_layout.py"), "--games", "6p=2",
           "--rounds", "1", "--tokenizer", "tiny", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    turn, episode = json.loads(out.read_text())["rows"]
    assert (turn["shape"], episode["shape"]) == ("turn", "episode")
    assert turn["turns"] == episode["turns"] == turn["samples"] > 1  # the same games, a sample per turn
    seats = episode["samples"] - episode["split_sequences"]  # one sequence per village seat of each game
    assert 2 <= seats <= 2 * 4 and seats < turn["samples"]
    assert episode["real_tokens"] < turn["real_tokens"]  # each turn re-reads its prompt; a sequence does not
    for row in (turn, episode):
        assert row["dropped_too_long"] == 0 and row["real_tokens"] <= row["padded_tokens"]
        assert (
            len(row["logprobs_s"]) == len(row["update_s"]) == 1
            and min(row["logprobs_s"] + row["update_s"]) > 0
        )
    assert "tiny test model's" in proc.stdout and "only the ratios (b)/(a) mean anything" in proc.stdout
    assert "| Werewolf 6p EN x 2 | ratio (b)/(a) |" in proc.stdout
