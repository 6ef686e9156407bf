"""Trajectories for the replay page: from a file a user uploads, or read (never consumed) from the stream.

Why read with ``XREVRANGE`` and not a consumer group: the web view must not take entries from the
trainer's group or create a group of its own (a group pins entries against trimming, see
``wolfpack.stream``); a plain range read changes nothing on the stream.

A ``Trajectory`` becomes plain JSON here (``trajectory_json``): every turn's prompt, response, parsed
action, validity, reward and reward components, and the response tokens with their logprobs. Lengths
are capped so one huge trajectory cannot make a multi-megabyte page.
"""

from __future__ import annotations

import json
import re
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from wolfpack.v1 import common_pb2, trajectory_pb2

MAX_TEXT_CHARS = 20_000
"""Longer prompts/responses are cut (the cut is marked); the turn count is not capped."""
MAX_TOKENS_SHOWN = 2_048
"""Response tokens (id, logprob) shown per turn."""
ENTRY_ID = re.compile(r"^\d{1,20}-\d{1,20}$")
"""A Redis stream entry id; anything else is refused before Redis sees it."""


class ReplayError(ValueError):
    """Input that is not a trajectory; the message says what was expected."""


def _cut(text: str) -> str:
    if len(text) <= MAX_TEXT_CHARS:
        return text
    return text[:MAX_TEXT_CHARS] + f"\n… [{len(text) - MAX_TEXT_CHARS} more characters not shown]"


def _enum(name: str, prefix: str) -> str:
    return name.removeprefix(prefix).lower()


def action_json(action: common_pb2.Action) -> dict[str, Any]:
    return {
        "kind": action.kind,
        "target": action.target if action.HasField("target") else None,
        "text": _cut(action.text),
    }


def trajectory_json(traj: trajectory_pb2.Trajectory) -> dict[str, Any]:
    """The replay page's view of one trajectory (seats 0-based, as on the wire)."""
    turns = []
    for t in traj.turns:
        logprobs = list(t.response_logprobs)
        tokens = [
            [int(tok), round(float(logprobs[i]), 4) if i < len(logprobs) else None]
            for i, tok in enumerate(t.response_token_ids[:MAX_TOKENS_SHOWN])
        ]
        turns.append(
            {
                "index": t.index,
                "seat": t.seat,
                "phase": t.phase,
                "round": t.round,
                "prompt": _cut(t.observation_text),
                "prompt_tokens": len(t.prompt_token_ids),
                "response": _cut(t.response_text),
                "response_tokens": len(t.response_token_ids),
                "tokens": tokens,
                "action": action_json(t.action) if t.HasField("action") else None,
                "valid": t.valid,
                "invalid_reason": t.invalid_reason,
                "attempt": t.attempt,
                "defaulted": t.defaulted,
                "reward": t.reward,
                "reward_components": {k: float(v) for k, v in sorted(t.reward_components.items())},
                "prediction": _cut(t.prediction),
                "policy": f"{t.policy.policy_id}@{t.policy.version}" if t.policy.policy_id else "",
                "finish_reason": _enum(common_pb2.FinishReason.Name(t.finish_reason), "FINISH_REASON_"),
                "generate_ms": t.generate_ms,
            }
        )
    return {
        "trajectory_id": traj.trajectory_id,
        "episode_id": traj.episode_id,
        "task_id": traj.task_id,
        "game": traj.game.game_id,
        "variant": traj.game.variant,
        "seed": traj.seed,
        "reward_spec": traj.reward_spec,
        "winner": traj.winner,
        "trainee_seats": list(traj.trainee_seats),
        "seats": [
            {
                "seat": b.seat,
                "controller": _enum(common_pb2.SeatController.Name(b.controller), "SEAT_CONTROLLER_"),
                "policy": f"{b.policy.policy_id}@{b.policy.version}" if b.policy.policy_id else "",
                "bot": b.bot,
                "name": b.display_name,
            }
            for b in traj.seats
        ],
        "outcomes": [
            {
                "seat": o.seat,
                "role": o.role,
                "team": o.team,
                "outcome": _enum(common_pb2.OutcomeKind.Name(o.outcome), "OUTCOME_KIND_"),
                "final_reward": o.final_reward,
                "alive": o.alive if o.HasField("alive") else None,
            }
            for o in traj.outcomes
        ],
        "policy_versions": [f"{p.policy_id}@{p.version}" for p in traj.policy_versions],
        "metadata": dict(sorted(traj.metadata.items())),
        "turns": turns,
    }


def summary_json(traj: trajectory_pb2.Trajectory, entry_id: str = "") -> dict[str, Any]:
    """One line of the stream list."""
    return {
        "entry_id": entry_id,
        "trajectory_id": traj.trajectory_id,
        "game": traj.game.game_id,
        "variant": traj.game.variant,
        "seed": traj.seed,
        "turns": len(traj.turns),
        "winner": traj.winner,
    }


def parse_trajectory(data: bytes) -> trajectory_pb2.Trajectory:
    """A ``Trajectory`` from a file's bytes: protobuf JSON (``MessageToJson``) when it starts with ``{``,
    else the binary wire format. Raises ``ReplayError`` saying which was tried."""
    stripped = data.lstrip()
    traj = trajectory_pb2.Trajectory()
    if stripped.startswith(b"{"):
        try:
            json_format.Parse(stripped.decode("utf-8"), traj)
        except (UnicodeDecodeError, json_format.ParseError, json.JSONDecodeError) as exc:
            raise ReplayError(f"not a Trajectory in protobuf JSON: {str(exc)[:300]}") from None
    else:
        try:
            traj.ParseFromString(data)
        except (DecodeError, RuntimeWarning) as exc:
            raise ReplayError(f"not a binary Trajectory protobuf: {str(exc)[:300]}") from None
    if not traj.trajectory_id and not traj.turns:
        raise ReplayError("the file parsed but holds no trajectory (no trajectory_id and no turns)")
    return traj


async def recent_entries(redis: Any, stream: str, count: int) -> list[dict[str, Any]]:
    """The newest ``count`` stream entries as summaries, newest first (unreadable ones are listed as such)."""
    out = []
    for raw_id, fields in await redis.xrevrange(stream, count=count):
        entry_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
        try:
            out.append(summary_json(trajectory_pb2.Trajectory.FromString(fields[b"data"]), entry_id))
        except (KeyError, DecodeError):
            out.append({"entry_id": entry_id, "error": "not a Trajectory entry"})
    return out


async def entry(redis: Any, stream: str, entry_id: str) -> trajectory_pb2.Trajectory | None:
    """One stream entry's trajectory (None when trimmed or never there); ``entry_id`` must be checked."""
    if not ENTRY_ID.match(entry_id):
        raise ReplayError("an entry id looks like 1712345678901-0")
    rows = await redis.xrange(stream, min=entry_id, max=entry_id, count=1)
    if not rows:
        return None
    try:
        return trajectory_pb2.Trajectory.FromString(rows[0][1][b"data"])
    except (KeyError, DecodeError):
        raise ReplayError(f"stream entry {entry_id} is not a Trajectory") from None
