"""Task scheduling as pure functions: which bucket, which seed (fresh or an AIW-weighted replay), who sits
where, and the group of ``group_size`` identical tasks. The service feeds it state read from Redis and a
seeded RNG; tests feed it plain dicts.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from wolfpack.v1 import common_pb2
from wolfpack.v1 import curriculum_service_pb2 as pb
from wolfpack_curriculum.config import Bucket, CurriculumConfig
from wolfpack_curriculum.league import Entry, LeagueConfig, pfsp_weights

KIND_PB = {
    "self": pb.OPPONENT_KIND_SELF,
    "scripted": pb.OPPONENT_KIND_SCRIPTED,
    "external": pb.OPPONENT_KIND_EXTERNAL,
    "checkpoint": pb.OPPONENT_KIND_CHECKPOINT,
}


def task_key(bucket: str, seed: int, scenario_id: str = "") -> str:
    """The identity AIW weights a task by: bucket plus seed (or scenario id)."""
    return f"{bucket}#{scenario_id or seed}"


def pick_bucket(cfg: CurriculumConfig, rng: random.Random) -> Bucket:
    return rng.choices(cfg.buckets, weights=[b.weight for b in cfg.buckets], k=1)[0]


def pick_replay(weights: Mapping[str, float], rng: random.Random) -> str | None:
    """A past task key drawn proportionally to its AIW weight; None when there is none."""
    if not weights:
        return None
    keys = sorted(weights)
    return rng.choices(keys, weights=[weights[k] for k in keys], k=1)[0]


def seed_of(key: str) -> int:
    tail = key.rpartition("#")[2]
    return int(tail) if tail.isascii() and tail.isdigit() else 0


@dataclass
class LeagueView:
    """The league as the scheduler needs it: the trainee and every opponent with its proto.

    Each PFSP pool (every opponent for ``league``, the checkpoints for ``checkpoint``) and its cumulative
    weights are built once per view, i.e. once per NextTasks call: a draw is then a binary search, not a
    pass over the league per seat (12-seat groups against 1,000 opponents took 15 ms a group before)."""

    trainee: Entry
    opponents: Sequence[tuple[Entry, pb.Opponent]]
    _pools: dict[tuple[str, float], tuple[list[tuple[Entry, pb.Opponent]], list[float] | None]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def pool(
        self, kind: str, cfg: LeagueConfig
    ) -> tuple[list[tuple[Entry, pb.Opponent]], list[float] | None]:
        """The opponents ``kind`` draws from and their cumulative PFSP weights (None: all weights are 0,
        draw uniformly, as ``league.sample_opponent`` does)."""
        key = (kind, cfg.pfsp_power)
        if key not in self._pools:
            pool = [
                (e, o) for e, o in self.opponents if kind == "league" or o.kind == pb.OPPONENT_KIND_CHECKPOINT
            ]
            weights = pfsp_weights(self.trainee, [e for e, _ in pool], cfg)
            self._pools[key] = (pool, list(accumulate(weights)) if sum(weights) > 0 else None)
        return self._pools[key]


def _draw_kind(mix: Mapping[Any, float], rng: random.Random) -> str:
    kinds = sorted(mix)
    return str(rng.choices(kinds, weights=[mix[k] for k in kinds], k=1)[0])


def _league_pick(
    kind: str, league: LeagueView, cfg: LeagueConfig, rng: random.Random
) -> tuple[Entry, pb.Opponent] | None:
    """A PFSP draw from ``kind``'s pool; the same draw as ``league.sample_opponent`` with this ``rng``."""
    pool, cum_weights = league.pool(kind, cfg)
    if not pool:
        return None
    if cum_weights is None:
        return rng.choice(pool)
    return rng.choices(pool, cum_weights=cum_weights, k=1)[0]


def _binding(
    seat: int, kind: str, bucket: Bucket, policy_id: str, opponent: pb.Opponent | None
) -> common_pb2.SeatBinding:
    b = common_pb2.SeatBinding(seat=seat)
    if kind == "scripted" or (opponent is not None and opponent.kind == pb.OPPONENT_KIND_SCRIPTED):
        b.controller = common_pb2.SEAT_CONTROLLER_SCRIPTED
        b.bot = opponent.bot if opponent is not None and opponent.bot else bucket.seats.bot
        return b
    b.controller = common_pb2.SEAT_CONTROLLER_POLICY
    if opponent is not None:
        b.policy.CopyFrom(opponent.policy)
    elif kind == "external":
        b.policy.policy_id = bucket.seats.external_policy or policy_id
    else:
        b.policy.policy_id = policy_id
    return b


def seat_plan(
    bucket: Bucket, num_seats: int, cfg: CurriculumConfig, league: LeagueView, rng: random.Random
) -> tuple[list[common_pb2.SeatBinding], list[int], int, str]:
    """Seat bindings, trainee seats, opponent kind (proto enum) and opponent id for one group."""
    plan = bucket.seats
    if isinstance(plan.trainee_seats, list):
        trainees = sorted(plan.trainee_seats)
    else:
        trainees = sorted(rng.sample(range(num_seats), min(plan.trainee_seats, num_seats)))
    bindings = [_binding(s, "self", bucket, cfg.policy_id, None) for s in trainees]
    others = [s for s in range(num_seats) if s not in trainees]
    trainee_set = list(trainees)
    if plan.mix_per == "task":
        kind = _draw_kind(plan.mix, rng)
        opponent: pb.Opponent | None = None
        if kind in ("checkpoint", "league"):
            picked = _league_pick(kind, league, cfg.league, rng)
            if picked is None:
                kind = "self"  # no checkpoint registered yet: self-play
            else:
                opponent = picked[1]
        for s in others:
            bindings.append(_binding(s, kind, bucket, cfg.policy_id, opponent))
        if kind == "self":
            trainee_set.extend(others)
        opp_kind = opponent.kind if opponent is not None else KIND_PB[kind]
        opp_id = opponent.opponent_id if opponent is not None else _default_id(kind, bucket, cfg.policy_id)
        return sorted(bindings, key=lambda b: b.seat), sorted(trainee_set), opp_kind, opp_id
    kinds: Counter[str] = Counter()
    for s in others:
        kind = _draw_kind(plan.mix, rng)
        opponent = None
        if kind in ("checkpoint", "league"):
            picked = _league_pick(kind, league, cfg.league, rng)
            kind, opponent = ("self", None) if picked is None else (kind, picked[1])
        bindings.append(_binding(s, kind, bucket, cfg.policy_id, opponent))
        if kind == "self":
            trainee_set.append(s)
        kinds[
            kind
            if opponent is None
            else pb.OpponentKind.Name(opponent.kind).removeprefix("OPPONENT_KIND_").lower()
        ] += 1
    main = kinds.most_common(1)[0][0] if kinds else "self"
    opp_id = "mix:" + ",".join(f"{k}={n}" for k, n in sorted(kinds.items()))
    return sorted(bindings, key=lambda b: b.seat), sorted(trainee_set), KIND_PB.get(main, 0), opp_id


def _default_id(kind: str, bucket: Bucket, policy_id: str) -> str:
    if kind == "scripted":
        return f"scripted:{bucket.seats.bot}"
    if kind == "external":
        return f"external:{bucket.seats.external_policy or policy_id}"
    return f"self:{policy_id}"


def make_group(
    bucket: Bucket,
    seed: int,
    split: str,
    bindings: Sequence[common_pb2.SeatBinding],
    trainees: Sequence[int],
    opponent_kind: int,
    opponent_id: str,
    group_size: int,
    scenario_id: str = "",
) -> list[pb.Task]:
    """``group_size`` tasks with the same task id, seed and seats: one GRPO group."""
    group_id = uuid.uuid4().hex
    task = pb.Task(
        task_id=f"{task_key(bucket.key, seed, scenario_id)}/{group_id[:12]}", seed=seed, scenario_id=scenario_id,
        seats=list(bindings), bucket=bucket.key, options=dict(bucket.options), trainee_seats=list(trainees),
        group_id=group_id, group_size=group_size, opponent_kind=opponent_kind,  # type: ignore[arg-type]
        opponent_id=opponent_id, split=split,
    )  # fmt: skip
    task.game.game_id, task.game.variant = bucket.game_id, bucket.variant
    return [pb.Task.FromString(task.SerializeToString()) for _ in range(group_size)]
