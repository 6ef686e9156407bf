"""Seat plans, mixing ratios and groups from the pure scheduler."""

from __future__ import annotations

import random
from collections import Counter

from wolfpack.v1 import common_pb2
from wolfpack.v1 import curriculum_service_pb2 as pb
from wolfpack_curriculum.config import Bucket, CurriculumConfig, SeatPlan
from wolfpack_curriculum.league import Entry
from wolfpack_curriculum.scheduler import LeagueView, make_group, pick_replay, seat_plan, seed_of, task_key

CFG = CurriculumConfig(policy_id="learner")
EMPTY = LeagueView(Entry("trainee", 1000), [])


def test_scripted_plan_binds_trainees_to_the_policy_and_others_to_the_bot() -> None:
    bucket = Bucket(game_id="werewolf_v1", variant="6p", seats=SeatPlan(trainee_seats=[2], bot="random"))
    seats, trainees, kind, opp = seat_plan(bucket, 6, CFG, EMPTY, random.Random(0))
    assert trainees == [2]
    assert [s.seat for s in seats] == list(range(6))
    assert seats[2].controller == common_pb2.SEAT_CONTROLLER_POLICY and seats[2].policy.policy_id == "learner"
    assert all(
        s.controller == common_pb2.SEAT_CONTROLLER_SCRIPTED and s.bot == "random"
        for s in seats
        if s.seat != 2
    )
    assert (kind, opp) == (pb.OPPONENT_KIND_SCRIPTED, "scripted:random")


def test_self_play_seats_are_trainee_seats() -> None:
    bucket = Bucket(game_id="werewolf_v1", variant="6p", seats=SeatPlan(trainee_seats=1, mix={"self": 1.0}))
    seats, trainees, kind, _ = seat_plan(bucket, 6, CFG, EMPTY, random.Random(1))
    assert trainees == list(range(6)) and kind == pb.OPPONENT_KIND_SELF
    assert all(s.policy.policy_id == "learner" for s in seats)


def test_per_seat_mix_follows_the_ratios() -> None:
    """80% current policy / 20% strong external model, drawn per seat (the 12-player recipe)."""
    plan = SeatPlan(
        trainee_seats=1, mix={"self": 0.8, "external": 0.2}, mix_per="seat", external_policy="strong"
    )
    bucket = Bucket(game_id="werewolf_v1", variant="12p", seats=plan)
    rng = random.Random(7)
    policies: Counter[str] = Counter()
    for _ in range(200):
        seats, trainees, _, opp = seat_plan(bucket, 12, CFG, EMPTY, rng)
        assert len(seats) == 12 and opp.startswith("mix:")
        for s in seats:
            if s.seat not in trainees or s.policy.policy_id == "strong":
                policies[s.policy.policy_id] += 1
            assert (s.policy.policy_id == "strong") == (s.seat not in trainees)
    share = policies["strong"] / (200 * 11)
    assert 0.17 < share < 0.23, share  # 2200 seeded draws of p = 0.2


def test_checkpoint_opponents_come_from_the_league_else_self_play() -> None:
    bucket = Bucket(
        game_id="werewolf_v1", variant="6p", seats=SeatPlan(trainee_seats=[0], mix={"checkpoint": 1.0})
    )
    _, trainees, kind, _ = seat_plan(bucket, 6, CFG, EMPTY, random.Random(0))
    assert kind == pb.OPPONENT_KIND_SELF and trainees == list(range(6))
    ckpt = pb.Opponent(opponent_id="checkpoint:learner@3", kind=pb.OPPONENT_KIND_CHECKPOINT)
    ckpt.policy.policy_id, ckpt.policy.version = "learner-v3", 3
    league = LeagueView(Entry("trainee", 1000), [(Entry("checkpoint:learner@3", 1000), ckpt)])
    seats, trainees, kind, opp = seat_plan(bucket, 6, CFG, league, random.Random(0))
    assert (kind, opp, trainees) == (pb.OPPONENT_KIND_CHECKPOINT, "checkpoint:learner@3", [0])
    assert {s.policy.policy_id for s in seats if s.seat} == {"learner-v3"}


def test_a_group_is_n_identical_tasks() -> None:
    bucket = CFG.buckets[0]
    seats, trainees, kind, opp = seat_plan(bucket, 6, CFG, EMPTY, random.Random(0))
    group = make_group(bucket, 42, "train", seats, trainees, kind, opp, 4)
    assert len(group) == 4
    assert len({t.SerializeToString() for t in group}) == 1
    assert group[0].group_size == 4 and group[0].seed == 42
    assert group[0].task_id.startswith(task_key(bucket.key, 42) + "/")
    other = make_group(bucket, 42, "train", seats, trainees, kind, opp, 4)
    assert other[0].group_id != group[0].group_id


def test_replay_draws_by_weight_and_keys_round_trip() -> None:
    rng = random.Random(3)
    draws = Counter(pick_replay({"b#1": 9.0, "b#2": 1.0}, rng) for _ in range(1000))
    assert draws["b#1"] > 850
    assert pick_replay({}, rng) is None
    assert seed_of(task_key("werewolf_v1/6p", 17)) == 17


def test_task_mode_opponent_ids_name_who_was_played() -> None:
    """One kind for every non-trainee seat: the opponent id says which (``self:``, ``external:``)."""
    self_play = Bucket(
        game_id="werewolf_v1", variant="6p", seats=SeatPlan(trainee_seats=[0], mix={"self": 1.0})
    )
    _, trainees, kind, opp = seat_plan(self_play, 6, CFG, EMPTY, random.Random(0))
    assert (kind, opp, trainees) == (pb.OPPONENT_KIND_SELF, "self:learner", list(range(6)))
    plan = SeatPlan(trainee_seats=[0], mix={"external": 1.0}, external_policy="strong")
    external = Bucket(game_id="werewolf_v1", variant="6p", seats=plan)
    seats, trainees, kind, opp = seat_plan(external, 6, CFG, EMPTY, random.Random(0))
    assert (kind, opp, trainees) == (pb.OPPONENT_KIND_EXTERNAL, "external:strong", [0])
    assert [s.policy.policy_id for s in seats] == ["learner"] + ["strong"] * 5
    # no external_policy: the external seats fall back to the trainee policy id
    bare = Bucket(
        game_id="werewolf_v1", variant="6p", seats=SeatPlan(trainee_seats=[0], mix={"external": 1.0})
    )
    _, _, _, opp = seat_plan(bare, 6, CFG, EMPTY, random.Random(0))
    assert opp == "external:learner"


def test_league_mix_draws_any_registered_opponent_and_checkpoint_mix_only_checkpoints() -> None:
    """``league`` may pick a scripted opponent of the league (its seats get its bot); ``checkpoint`` may not."""
    bot = pb.Opponent(opponent_id="scripted:random", kind=pb.OPPONENT_KIND_SCRIPTED, bot="random")
    league = LeagueView(Entry("trainee", 1000), [(Entry("scripted:random", 1000), bot)])
    for kind_name in ("league", "checkpoint"):
        plan = SeatPlan.model_validate({"trainee_seats": [0], "mix": {kind_name: 1.0}, "bot": "heuristic"})
        bucket = Bucket(game_id="werewolf_v1", variant="6p", seats=plan)
        seats, trainees, kind, opp = seat_plan(bucket, 6, CFG, league, random.Random(0))
        if kind_name == "league":
            assert (kind, opp, trainees) == (pb.OPPONENT_KIND_SCRIPTED, "scripted:random", [0])
            assert all(
                s.controller == common_pb2.SEAT_CONTROLLER_SCRIPTED and s.bot == "random" for s in seats[1:]
            )
        else:  # no checkpoint in the league: self-play
            assert (kind, opp, trainees) == (pb.OPPONENT_KIND_SELF, "self:learner", list(range(6)))


def test_per_seat_league_picks_bind_each_seat_and_the_mix_id_counts_them() -> None:
    """Per seat: each non-trainee seat draws its own opponent; the id counts seats per kind."""
    plan = SeatPlan.model_validate({"trainee_seats": [0], "mix": {"checkpoint": 1.0}, "mix_per": "seat"})
    bucket = Bucket(game_id="werewolf_v1", variant="6p", seats=plan)
    ckpt = pb.Opponent(opponent_id="checkpoint:learner@2", kind=pb.OPPONENT_KIND_CHECKPOINT)
    ckpt.policy.policy_id = "learner-v2"
    league = LeagueView(Entry("trainee", 1000), [(Entry("checkpoint:learner@2", 1000), ckpt)])
    seats, trainees, kind, opp = seat_plan(bucket, 6, CFG, league, random.Random(0))
    assert (kind, opp, trainees) == (pb.OPPONENT_KIND_CHECKPOINT, "mix:checkpoint=5", [0])
    assert [s.policy.policy_id for s in seats] == ["learner"] + ["learner-v2"] * 5
    # an empty league: every such seat is self-play, so a trainee seat
    seats, trainees, kind, opp = seat_plan(bucket, 6, CFG, EMPTY, random.Random(0))
    assert (kind, opp, trainees) == (pb.OPPONENT_KIND_SELF, "mix:self=5", list(range(6)))
    assert {s.policy.policy_id for s in seats} == {"learner"}
