"""The pure trajectory builder on hand-made records and event logs."""

from __future__ import annotations

import pytest

from wolfpack.v1 import common_pb2
from wolfpack.v1 import curriculum_service_pb2 as cur_pb
from wolfpack.v1 import environment_service_pb2 as env_pb
from wolfpack_rollout.config import RolloutConfig
from wolfpack_rollout.summary import summarize
from wolfpack_rollout.trajectory import EpisodeResult, TurnRecord, build_trajectory, message_events


def record(seat: int, turn_id: int, text: str, **kw: object) -> TurnRecord:
    return TurnRecord(
        seat=seat, turn_id=turn_id, phase="bargaining", round=1, observation_text=f"obs {turn_id}",
        prompt_token_ids=[1, 2, 3], response_token_ids=[7, 8], response_logprobs=[-0.5, -1.25],
        response_text=text, finish_reason=common_pb2.FINISH_REASON_STOP,
        policy=common_pb2.PolicyRef(policy_id="learner", version=3),
        sampling=common_pb2.SamplingParams(max_tokens=8, temperature=1.0, logprobs=True), **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def task(game: str, variant: str, seat: int) -> cur_pb.Task:
    t = cur_pb.Task(task_id="t", seed=3, bucket="b", trainee_seats=[seat], group_id="g", group_size=2,
                    opponent_kind=cur_pb.OPPONENT_KIND_SCRIPTED, opponent_id="scripted:heuristic")  # fmt: skip
    t.game.game_id, t.game.variant = game, variant
    b = t.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_POLICY)
    b.policy.policy_id = "learner"
    return t


def ev(kind: str, channel: str, actor: int, text: str) -> env_pb.GameEvent:
    return env_pb.GameEvent(kind=kind, channel=channel, actor=actor, text=text, phase="bargaining", round=1)


def test_scenario_turns_interleave_scripted_messages_and_attempts() -> None:
    events = [
        ev("start", "public", -1, "s"),
        ev("say", "public", 1, "hello"),
        ev("invalid", "seat:0", 0, "bad"),
        ev("final", "public", 0, "FINAL_BID: 5"),
        ev("final", "public", 1, "[sealed]"),
        ev("final", "seat:1", 1, "FINAL_BID: 6"),  # a sealed message: its full copy counts
        ev("say", "public", 0, "(pass)"),
    ]
    assert [e.text for e in message_events(events)] == ["hello", "FINAL_BID: 5", "FINAL_BID: 6", "(pass)"]
    records = [
        record(0, 5, "garbage", valid=False, invalid_reason="malformed"),
        record(0, 5, "FINAL_BID: 5", attempt=1),
        record(0, 9, "???", valid=False, defaulted=True, invalid_reason="malformed"),
    ]
    traj = build_trajectory(
        task("bargaining_v1", "easy", 0), trajectory_id="tr", episode_id="ep", records=records,
        result=EpisodeResult(roles={0: "buyer", 1: "seller"}, outcomes={0: 3, 1: 3}, events=events),
    )  # fmt: skip
    assert [(t.seat, t.response_text, t.valid, t.attempt) for t in traj.turns] == [
        (1, "hello", True, 0),
        (0, "garbage", False, 0),
        (0, "FINAL_BID: 5", True, 1),
        (1, "FINAL_BID: 6", True, 0),
        (0, "???", False, 0),
    ]
    assert [t.index for t in traj.turns] == list(range(5))
    assert traj.turns[4].defaulted and traj.turns[4].action.text == "(pass)", "the default the engine applied"
    scripted = traj.turns[0]
    assert not scripted.response_token_ids and not scripted.policy.policy_id
    policy = traj.turns[2]
    assert list(policy.response_token_ids) == [7, 8] and list(policy.response_logprobs) == [-0.5, -1.25]
    assert policy.policy.version == 3 and policy.finish_reason == common_pb2.FINISH_REASON_STOP
    assert [b.seat for b in traj.seats] == [0, 1] and traj.seats[
        1
    ].controller == common_pb2.SEAT_CONTROLLER_SCRIPTED
    assert (traj.group_id, traj.group_size) == ("g", 2)
    assert [(p.policy_id, p.version) for p in traj.policy_versions] == [("learner", 3)]
    assert traj.HasField("scenario") and traj.scenario.family == "bargaining"


def test_werewolf_keeps_policy_turns_and_truncation_aborts() -> None:
    records = [record(3, 1, "vote 2"), record(3, 4, "speak hi")]
    result = EpisodeResult(
        winner="wolves", roles={i: r for i, r in enumerate(["werewolf", "werewolf", "seer", "witch", "villager", "villager"])},
        outcomes={i: 1 if i < 2 else 2 for i in range(6)}, alive={i: i != 3 for i in range(6)},
    )  # fmt: skip
    traj = build_trajectory(
        task("werewolf_v1", "6p", 3), trajectory_id="tr", episode_id="ep", records=records, result=result
    )
    assert [t.response_text for t in traj.turns] == ["vote 2", "speak hi"]
    assert (
        traj.winner == "wolves" and traj.outcomes[3].team == "village" and traj.outcomes[0].team == "wolves"
    )
    assert not traj.outcomes[3].alive and traj.outcomes[2].alive
    assert list(traj.trainee_seats) == [3] and "trainee_seats" not in traj.metadata
    cut = build_trajectory(task("werewolf_v1", "6p", 3), trajectory_id="tr", episode_id="ep", records=records,
                           result=result, truncated="turn_cap")  # fmt: skip
    assert cut.winner == "" and cut.metadata["truncated"] == "turn_cap"
    assert {o.outcome for o in cut.outcomes} == {common_pb2.OUTCOME_KIND_ABORTED}


def test_summary_rates_by_role_and_opponent() -> None:
    records = [
        record(3, 1, "x", valid=False, invalid_reason="r"),
        record(3, 1, "y", defaulted=True, valid=False),
    ]
    result = EpisodeResult(winner="village", roles={3: "seer", 0: "werewolf"}, outcomes={3: 1, 0: 2})
    won = build_trajectory(
        task("werewolf_v1", "6p", 3), trajectory_id="a", episode_id="a", records=records, result=result
    )
    lost = build_trajectory(
        task("werewolf_v1", "6p", 3), trajectory_id="b", episode_id="b", records=records[:1],
        result=EpisodeResult(winner="wolves", roles={3: "seer", 0: "werewolf"}, outcomes={3: 2, 0: 1}),
    )  # fmt: skip
    s = summarize([won, lost], {"context_overflow": 1}, 30.0)
    assert (s.episodes, s.failed, s.trainee_turns, s.invalid_moves, s.defaulted_moves) == (2, 1, 3, 2, 1)
    assert s.win_rate_by_role == {"seer": (0.5, 2)}
    assert s.win_rate_by_opponent == {"scripted": (0.5, 2)}
    assert s.episodes_per_min == pytest.approx(4.0)


def test_config_validates_and_reads_mappings() -> None:
    cfg = RolloutConfig.from_mapping({"concurrency": 4, "sampling": {"max_tokens": 9, "stop": ["\n"]}})
    assert cfg.sampling.max_tokens == 9 and cfg.sampling.stop == ("\n",)
    assert cfg.sampling.to_pb().logprobs
    with pytest.raises(ValueError, match="unknown rollout option"):
        RolloutConfig.from_mapping({"concurency": 4})
    with pytest.raises(ValueError, match="prompt_mode"):
        RolloutConfig(prompt_mode="partial")  # type: ignore[arg-type]


def test_episode_result_reads_the_environment_account() -> None:
    state = env_pb.GetEpisodeResponse(winner="village", done=True, events=[ev("say", "public", 1, "hi")])
    state.seats.add(seat=0, alive=False, role="werewolf", outcome=common_pb2.OUTCOME_KIND_LOSS)
    state.seats.add(seat=1, alive=True, role="seer", outcome=common_pb2.OUTCOME_KIND_WIN)
    result = EpisodeResult.from_pb(state)
    assert result.winner == "village"
    assert result.roles == {0: "werewolf", 1: "seer"}
    assert result.outcomes == {0: 2, 1: 1} and result.alive == {0: False, 1: True}
    assert [e.text for e in result.events] == ["hi"]


def test_timestamps_and_metadata() -> None:
    timed = record(3, 1, "vote 2", started_at=1_700_000_000.5, generate_ms=12.5)
    untimed = record(3, 2, "vote 4")  # hand-made: no timing known
    t = task("werewolf_v1", "6p", 3)
    t.scenario_id, t.split = "sc-7", "eval"
    traj = build_trajectory(
        t, trajectory_id="tr", episode_id="ep", records=[timed, untimed], worker_id="w1",
        result=EpisodeResult(winner="wolves", roles={3: "seer"}, outcomes={3: 2}), finished_at=1_700_000_100.25,
    )  # fmt: skip
    first, second = traj.turns
    assert (first.started_at.seconds, first.started_at.nanos, first.generate_ms) == (
        1_700_000_000,
        500_000_000,
        12.5,
    )
    assert not second.HasField("started_at") and second.generate_ms == 0.0, "unknown timing stays unset"
    # a float of seconds near 1.7e9 resolves ~0.24 µs: compare within 1 µs
    assert traj.finished_at.seconds == 1_700_000_100 and abs(traj.finished_at.nanos - 250_000_000) < 1000
    assert not traj.HasField("started_at"), "not given: unset"
    begun = build_trajectory(
        t, trajectory_id="tr", episode_id="ep", records=[timed], started_at=1_699_999_999.75,
        result=EpisodeResult(winner="wolves", roles={3: "seer"}, outcomes={3: 2}), finished_at=1_700_000_100.25,
    )  # fmt: skip
    assert begun.started_at.seconds == 1_699_999_999 and abs(begun.started_at.nanos - 750_000_000) < 1000
    meta = dict(traj.metadata)
    assert meta == {
        "bucket": "b", "opponent_id": "scripted:heuristic", "opponent_kind": "OPPONENT_KIND_SCRIPTED",
        "split": "eval", "worker_id": "w1", "scenario_id": "sc-7",
    }  # fmt: skip
    plain = build_trajectory(
        task("werewolf_v1", "6p", 3), trajectory_id="tr", episode_id="ep", records=[untimed],
        result=EpisodeResult(roles={3: "seer"}, outcomes={3: 2}),
    )  # fmt: skip
    assert dict(plain.metadata) == {
        "bucket": "b", "opponent_id": "scripted:heuristic", "opponent_kind": "OPPONENT_KIND_SCRIPTED",
        "split": "train",
    }, "no worker, no scenario id: no keys for them; the split defaults to train"  # fmt: skip
