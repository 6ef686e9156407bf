"""Pure ``Trajectory`` builder: what the driver recorded of an episode in, the stream's proto out.

No I/O here, so the rules are testable on hand-made records:

* Policy turns carry the exact prompt/response token ids, logprobs, finish reason, sampling and policy
  version that inference returned (copied, never re-tokenized). Every attempt is a turn: a re-prompted
  attempt has ``valid=False`` and ``attempt`` counts up; a defaulted one ``defaulted=True``.
* Scenario games are re-verified by the reward service from the transcript, which needs every seat's
  messages in order, so their trajectories also hold the scripted seats' turns (no tokens, no policy),
  interleaved from the environment's event log. Werewolf rewards come from the outcomes alone, so its
  trajectories hold only policy turns.
* A truncated episode (turn cap, context overflow) keeps its turns; every outcome is ABORTED and
  ``metadata["truncated"]`` says why (for scenario games the reward service re-verifies the transcript
  as if the turn limit had been reached, and its verdict replaces ABORTED).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from google.protobuf.timestamp_pb2 import Timestamp

from wolfpack.v1 import common_pb2, curriculum_service_pb2, environment_service_pb2, trajectory_pb2
from wolfpack_games.scenarios import GAME_CLASSES, Scenario, generate_scenario, get_family
from wolfpack_games.scenarios.wire import scenario_to_pb
from wolfpack_games.werewolf.models import TEAM_VILLAGE, TEAM_WOLVES, WOLF_ROLES

MESSAGE_KINDS = ("say", "final")


@dataclass
class TurnRecord:
    """One generated attempt of one policy seat, as inference returned it and the environment judged it."""

    seat: int
    turn_id: int
    phase: str
    round: int
    observation_text: str
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float]
    response_text: str
    finish_reason: int
    policy: common_pb2.PolicyRef
    sampling: common_pb2.SamplingParams
    started_at: float = 0.0
    generate_ms: float = 0.0
    attempt: int = 0
    valid: bool = True
    invalid_reason: str = ""
    defaulted: bool = False
    compressed: bool = False
    applied_text: str = ""
    action: common_pb2.Action | None = None
    """What the environment applied for this attempt (the parsed action, or the default that replaced
    it), from PlaySeats' ``SeatActResult.action``; ``None`` for a rejected attempt."""

    def to_pb(self, index: int) -> trajectory_pb2.Turn:
        turn = trajectory_pb2.Turn(
            index=index, seat=self.seat, phase=self.phase, round=self.round,
            observation_text=self.observation_text, prompt_token_ids=self.prompt_token_ids,
            response_token_ids=self.response_token_ids, response_logprobs=self.response_logprobs,
            response_text=self.response_text, valid=self.valid, invalid_reason=self.invalid_reason,
            attempt=self.attempt, defaulted=self.defaulted, turn_id=self.turn_id, generate_ms=self.generate_ms,
            finish_reason=self.finish_reason,  # type: ignore[arg-type]
        )  # fmt: skip
        turn.policy.CopyFrom(self.policy)
        turn.sampling.CopyFrom(self.sampling)
        if self.started_at:
            turn.started_at.FromNanoseconds(int(self.started_at * 1e9))
        if self.action is not None:
            turn.action.CopyFrom(self.action)
        if self.defaulted and self.applied_text:
            turn.action.text = self.applied_text
        return turn


@dataclass
class EpisodeResult:
    """The environment's account of a finished (or truncated) episode."""

    winner: str = ""
    roles: dict[int, str] = field(default_factory=dict)
    outcomes: dict[int, int] = field(default_factory=dict)
    alive: dict[int, bool] = field(default_factory=dict)
    events: list[environment_service_pb2.GameEvent] = field(default_factory=list)

    @classmethod
    def from_pb(cls, state: environment_service_pb2.GetEpisodeResponse) -> EpisodeResult:
        return cls(
            winner=state.winner,
            roles={s.seat: s.role for s in state.seats},
            outcomes={s.seat: int(s.outcome) for s in state.seats},
            alive={s.seat: s.alive for s in state.seats},
            events=list(state.events),
        )


def is_scenario_game(game_id: str) -> bool:
    return game_id in GAME_CLASSES


def scenario_of(task: curriculum_service_pb2.Task) -> Scenario:
    """The scenario a scenario task plays: the task's ``options["scenario"]`` (JSON) when the curriculum
    sent one, else what the environment generates from the (family, seed, difficulty = variant) triple."""
    given = task.options.get("scenario", "")
    if given:
        return Scenario.model_validate_json(given)
    family = next(f for f in _families() if get_family(f).game_id == task.game.game_id)
    variant = task.game.variant or "medium"
    return generate_scenario(family, task.seed, variant)


def _families() -> Iterable[str]:
    from wolfpack_games.scenarios import available_families

    return available_families()


def team_of(game_id: str, role: str) -> str:
    if is_scenario_game(game_id):
        return role
    return TEAM_WOLVES if role in WOLF_ROLES else TEAM_VILLAGE if role else ""


def message_events(
    events: Sequence[environment_service_pb2.GameEvent],
) -> list[environment_service_pb2.GameEvent]:
    """The applied messages of a scenario game in order; a sealed message (a redacted public event followed
    by the author's own full copy) counts once, with its full text."""
    out: list[environment_service_pb2.GameEvent] = []
    for i, ev in enumerate(events):
        if ev.kind not in MESSAGE_KINDS or ev.actor < 0:
            continue
        if ev.channel == "public":
            nxt = events[i + 1] if i + 1 < len(events) else None
            if (
                nxt is not None
                and nxt.kind == ev.kind
                and nxt.actor == ev.actor
                and nxt.channel == f"seat:{ev.actor}"
            ):
                continue  # the sealed copy follows
            out.append(ev)
        elif ev.channel == f"seat:{ev.actor}":
            out.append(ev)
    return out


def ordered_turns(
    game_id: str, records: Sequence[TurnRecord], events: Sequence[environment_service_pb2.GameEvent],
    policy_seats: set[int],
) -> list[trajectory_pb2.Turn]:  # fmt: skip
    """Turns in play order: policy records as recorded; for scenario games interleaved with the scripted
    seats' messages from the event log (each applied message closes its author's pending attempts)."""
    if not is_scenario_game(game_id):
        return [r.to_pb(i) for i, r in enumerate(records)]
    pending: dict[int, deque[TurnRecord]] = {}
    for r in records:
        pending.setdefault(r.seat, deque()).append(r)
    turns: list[trajectory_pb2.Turn] = []
    for ev in message_events(events):
        if ev.actor in policy_seats:
            queue = pending.get(ev.actor, deque())
            while queue:
                rec = queue.popleft()
                if rec.defaulted:
                    rec.applied_text = ev.text
                turns.append(rec.to_pb(len(turns)))
                if rec.valid or rec.defaulted:
                    break
            continue
        turn = turns_append_scripted(len(turns), ev)
        turns.append(turn)
    for queue in pending.values():  # attempts the game never applied (a truncated episode)
        turns.extend(rec.to_pb(len(turns) + i) for i, rec in enumerate(queue))
    for i, t in enumerate(turns):
        t.index = i
    return turns


def turns_append_scripted(index: int, ev: environment_service_pb2.GameEvent) -> trajectory_pb2.Turn:
    turn = trajectory_pb2.Turn(
        index=index, seat=ev.actor, phase=ev.phase, round=ev.round, response_text=ev.text, valid=True
    )
    turn.action.kind = ev.kind
    turn.action.text = ev.text
    return turn


def build_trajectory(
    task: curriculum_service_pb2.Task,
    *,
    trajectory_id: str,
    episode_id: str,
    records: Sequence[TurnRecord],
    result: EpisodeResult,
    trace: common_pb2.TraceContext | None = None,
    truncated: str = "",
    worker_id: str = "",
    finished_at: float | None = None,
    extra_metadata: Mapping[str, str] | None = None,
    started_at: float | None = None,
) -> trajectory_pb2.Trajectory:
    """The unscored ``Trajectory`` of one episode (the reward service fills the rewards); ``started_at``:
    when the driver began it (wall clock, seconds), unset when not given."""
    game_id = task.game.game_id
    policy_seats = {b.seat for b in task.seats if b.controller == common_pb2.SEAT_CONTROLLER_POLICY}
    traj = trajectory_pb2.Trajectory(
        trajectory_id=trajectory_id, episode_id=episode_id, task_id=task.task_id, seed=task.seed,
        seats=list(task.seats), winner="" if truncated else result.winner,
        group_id=task.group_id or trajectory_id, group_size=max(1, task.group_size),
        trainee_seats=sorted(task.trainee_seats),
    )  # fmt: skip
    traj.game.CopyFrom(task.game)
    bound = {b.seat for b in task.seats}
    for seat in sorted(set(result.roles) | set(result.outcomes)):  # unlisted seats: the game's default bot
        if seat not in bound:
            traj.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_SCRIPTED)
    traj.seats.sort(key=lambda b: b.seat)
    traj.turns.extend(ordered_turns(game_id, records, result.events, policy_seats))
    for seat in sorted(result.roles or result.outcomes):
        role = result.roles.get(seat, "")
        outcome = traj.outcomes.add(seat=seat, role=role, team=team_of(game_id, role))
        outcome.outcome = (
            common_pb2.OUTCOME_KIND_ABORTED if truncated else result.outcomes.get(seat, 0)  # type: ignore[assignment]
        )
        if seat in result.alive and not is_scenario_game(game_id):
            outcome.alive = result.alive[seat]
    seen: set[tuple[str, int]] = set()
    for r in records:
        key = (r.policy.policy_id, r.policy.version)
        if r.policy.policy_id and key not in seen:
            seen.add(key)
            traj.policy_versions.add(policy_id=key[0], version=key[1])
    if trace is not None:
        traj.trace.CopyFrom(trace)
    traj.finished_at.CopyFrom(_timestamp(finished_at if finished_at is not None else time.time()))
    if started_at is not None:
        traj.started_at.CopyFrom(_timestamp(started_at))
    meta = traj.metadata
    meta["bucket"] = task.bucket
    meta["opponent_id"] = task.opponent_id
    meta["opponent_kind"] = curriculum_service_pb2.OpponentKind.Name(task.opponent_kind)
    meta["split"] = task.split or "train"
    if worker_id:
        meta["worker_id"] = worker_id
    if task.scenario_id:
        meta["scenario_id"] = task.scenario_id
    if is_scenario_game(game_id):
        traj.scenario.CopyFrom(scenario_to_pb(scenario_of(task)))
    if truncated:
        meta["truncated"] = truncated
    meta.update(extra_metadata or {})
    return traj


def _timestamp(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts
