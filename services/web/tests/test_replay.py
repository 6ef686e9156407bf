"""``replay``: a Trajectory as the replay page's JSON, and files that are or are not trajectories."""

from __future__ import annotations

import pytest
from google.protobuf import json_format

from wolfpack_web import replay

from .conftest import sample_trajectory


def test_every_turn_keeps_what_the_page_shows() -> None:
    traj = sample_trajectory(turns=4)
    out = replay.trajectory_json(traj)
    assert (out["game"], out["variant"], out["seed"], out["winner"]) == (
        "bargaining_v1",
        "easy",
        11,
        "seller",
    )
    assert [s["controller"] for s in out["seats"]] == ["policy", "scripted"]
    assert out["seats"][0]["policy"] == "trainee@0" and out["seats"][1]["bot"] == "heuristic"
    assert [o["outcome"] for o in out["outcomes"]] == ["win", "loss"]
    for t, turn in zip(out["turns"], traj.turns, strict=True):
        assert t["prompt"] == turn.observation_text and t["response"] == turn.response_text
        assert t["prompt_tokens"] == 30 and t["response_tokens"] == 3
        assert t["tokens"] == [[11, -0.05], [22, -1.2], [33 + turn.index, -3.5]]
        assert t["valid"] == turn.valid and t["invalid_reason"] == turn.invalid_reason
        assert t["reward_components"] == pytest.approx(dict(turn.reward_components))
    assert out["turns"][0]["action"] == {"kind": "offer", "target": None, "text": "60"}
    assert out["turns"][2]["action"] is None  # the invalid turn parsed to no action


def test_missing_logprobs_and_long_texts_are_marked_not_invented() -> None:
    traj = sample_trajectory(turns=1)
    turn = traj.turns[0]
    del turn.response_logprobs[1:]
    turn.observation_text = "x" * (replay.MAX_TEXT_CHARS + 5)
    turn.response_token_ids.extend(range(replay.MAX_TOKENS_SHOWN + 10))
    t = replay.trajectory_json(traj)["turns"][0]
    assert t["tokens"][0] == [11, -0.05] and t["tokens"][1] == [22, None]
    assert (
        len(t["tokens"]) == replay.MAX_TOKENS_SHOWN and t["response_tokens"] == replay.MAX_TOKENS_SHOWN + 13
    )
    assert t["prompt"].startswith("x" * replay.MAX_TEXT_CHARS) and t["prompt"].endswith(
        "[5 more characters not shown]"
    )


def test_files_parse_as_binary_or_json_and_anything_else_is_refused() -> None:
    traj = sample_trajectory(turns=2)
    assert replay.parse_trajectory(traj.SerializeToString()) == traj
    assert replay.parse_trajectory(b"  \n" + json_format.MessageToJson(traj).encode()) == traj
    for bad, why in (
        (b"", "holds no trajectory"),
        (b"\xff\xff\xff", "not a binary Trajectory"),
        (b'{"trajectory_id": 3, "nope": 1}', "protobuf JSON"),
        (b"{\xff", "protobuf JSON"),
        (b"{}", "holds no trajectory"),
    ):
        with pytest.raises(replay.ReplayError, match=why):
            replay.parse_trajectory(bad)
