"""The run's metrics outputs: the console's line per update, the plot's panels and eval CIs, transcripts as
TensorBoard text (read back from the event files), and verl's ``Tracking`` as an extra backend that leaves
the JSONL/CSV/TensorBoard files as they are."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from wolfpack.v1 import trajectory_pb2
from wolfpack_trainer.metrics import (
    TRAIN_MINUTES,
    MetricsWriter,
    answer_metrics,
    episode_time_split,
    eval_time_line,
    time_split_line,
    transcript,
    update_line,
    wall_clock_evals,
)


def test_update_line_names_every_number_and_marks_missing_ones() -> None:
    line = update_line(
        3,
        20,
        {
            "charts/reward_mean": 0.4123,
            "charts/win_rate": 0.625,
            "actor/pg_loss": -0.0132,
            "actor/ppo_kl": 0.00041,
            "actor/entropy": 1.2345,
            "perf/collect_s": 7.5,
            "perf/update_s": 2.25,
        },
    )
    assert line == "update 3/20  reward +0.41  win 0.62  loss -0.0132  kl 0.00041  entropy 1.23  9.8 s"
    # The KL to the reference first (when the loss has one); nothing at all: a dash, not a made-up 0.
    assert "kl 0.02" in update_line(1, 2, {"actor/kl_loss": 0.02, "actor/ppo_kl": 0.0})
    assert update_line(1, 2, {}) == "update 1/2  reward -  win -  loss -  kl -  entropy -  0.0 s"


def test_transcript_shows_each_turn_and_the_outcome(
    trajectory_factory: Callable[..., trajectory_pb2.Trajectory],
) -> None:
    traj = trajectory_factory("t-1", [(1, [1, 2], [3, 4], 1.0, "offer: 40 of 100")], roles={1: "responder"})
    traj.turns[0].response_text = "ACCEPT"
    traj.seats.add(seat=1).policy.policy_id = "responder"
    text = transcript(traj)
    assert "seat 1 (responder)" in text and "'offer: 40 of 100'" in text and "`'ACCEPT'`" in text
    assert "outcome seat 1 responder: win, reward +1.00" in text
    # No response text (a trajectory from the token path only): decoded from the ids.
    traj.turns[0].response_text = ""
    assert "`'<3 4>'`" in transcript(traj, lambda ids: f"<{' '.join(map(str, ids))}>")
    traj.turns[0].valid = False
    traj.turns[0].invalid_reason = "no decision"
    assert "invalid: no decision" in transcript(traj)


def _rows(writer: MetricsWriter) -> None:
    for step in range(1, 5):
        writer.log(
            step,
            {
                "charts/reward_mean": step / 4,
                "charts/win_rate": step / 5,
                "actor/pg_loss": 0.1 / step,
                "actor/ppo_kl": 0.01 * step,
                "actor/entropy": 2.0 - step / 10,
                "charts/invalid_rate": 0.5 / step,
                "perf/collect_s": 2.0,
                "perf/train_s": 10.0 + step,
                "perf/publish_s": 1.0,
                TRAIN_MINUTES: 0.25 * step,
            },
        )
    for step in (0, 4):
        writer.log(
            step,
            {
                "eval/reward_mean": step / 8,
                "eval/reward_lo": step / 8 - 0.1,
                "eval/reward_hi": step / 8 + 0.1,
                "eval/win_rate": step / 8,
                "eval/win_rate_lo": 0.0,
                "eval/win_rate_hi": step / 8 + 0.2,
            },
        )


def test_plot_draws_eval_cis_and_loss_kl_entropy_panels(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    writer = MetricsWriter(tmp_path, tensorboard=False)
    _rows(writer)
    figures: list[Any] = []
    close = plt.close
    plt.close = lambda fig=None: figures.append(fig)  # type: ignore[assignment]
    try:
        path = writer.plot()
    finally:
        plt.close = close
    assert path.stat().st_size > 0
    (fig,) = figures
    titles = {ax.get_title(): ax for ax in fig.axes}
    assert {"mean reward", "win rate", "loss", "KL", "entropy", "invalid-answer rate"} <= set(titles)
    for name in ("mean reward", "win rate"):
        (band,) = titles[name].collections  # the shaded 95% CI of the held-out evaluations
        assert band.get_label() == "eval 95% CI"
    lo_hi = titles["mean reward"].collections[0].get_paths()[0].vertices[:, 1]
    assert min(lo_hi) == pytest.approx(-0.1) and max(lo_hi) == pytest.approx(0.6)
    assert [ln.get_label() for ln in titles["KL"].lines] == ["actor/ppo_kl"]
    assert list(titles["entropy"].lines[0].get_ydata()) == pytest.approx([1.9, 1.8, 1.7, 1.6])
    # against the training clock: the evaluations at the minutes their updates ended, and the time split
    clock = titles["held-out win rate vs training time"]
    (points,) = clock.lines
    assert list(points.get_xdata()) == [0.0, 1.0] and list(points.get_ydata()) == [0.0, 0.5]
    assert clock.get_xlabel() == "training minutes"
    split = titles["seconds per update"]
    assert [ln.get_label() for ln in split.lines] == ["collect_s", "train_s", "publish_s"]
    assert list(split.lines[1].get_ydata()) == [11.0, 12.0, 13.0, 14.0]
    close(fig)


def test_plot_draws_each_policy_against_the_bot(tmp_path: Path) -> None:
    """``eval.vs_bot``'s scores beside the held-out evaluation in the reward and win-rate panels, one line a
    policy at the updates that evaluated it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    writer = MetricsWriter(tmp_path, tensorboard=False)
    _rows(writer)
    for step, p, r in ((0, 0.1, 0.2), (2, 0.4, 0.7)):
        writer.log(step, {"eval_vs_bot/proposer/win_rate": p, "eval_vs_bot/responder/win_rate": r,
                          "eval_vs_bot/proposer/reward_mean": -p})  # fmt: skip
    figures: list[Any] = []
    close = plt.close
    plt.close = lambda fig=None: figures.append(fig)  # type: ignore[assignment]
    try:
        writer.plot()
    finally:
        plt.close = close
    (fig,) = figures
    titles = {ax.get_title(): ax for ax in fig.axes}
    lines = {ln.get_label(): ln for ln in titles["win rate"].lines}
    assert list(lines["held-out vs bot: proposer"].get_ydata()) == [0.1, 0.4]
    assert list(lines["held-out vs bot: responder"].get_xdata()) == [0, 2]
    reward = [ln.get_label() for ln in titles["mean reward"].lines]
    assert "held-out vs bot: proposer" in reward and "held-out vs bot: responder" not in reward
    close(fig)


def test_wall_clock_evals_place_each_evaluation_at_its_update_s_minute() -> None:
    rows = [
        {"step": 0, "eval/win_rate": 0.1, "eval/win_rate_lo": 0.0, "eval/win_rate_hi": 0.2},
        {"step": 1, TRAIN_MINUTES: 1.5},
        {
            "step": 2,
            TRAIN_MINUTES: 3.0,
            "eval/win_rate": 0.4,
            "eval/win_rate_lo": 0.3,
            "eval/win_rate_hi": 0.5,
        },
        {"step": 3, "eval/win_rate": 0.9},  # no clock (a run from before the clock existed): left out
    ]
    assert wall_clock_evals(rows, "win_rate") == [(0.0, 0.1, 0.0, 0.2), (3.0, 0.4, 0.3, 0.5)]


def test_transcripts_go_to_tensorboard_text(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
        EventAccumulator,
    )

    writer = MetricsWriter(tmp_path)
    writer.log(1, {"charts/win_rate": 0.5})
    writer.text("transcripts/eval/0", "**ultimatum_v1/easy** seed 7", 1)
    writer.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    (entry,) = events.Tensors("transcripts/eval/0/text_summary")
    assert entry.step == 1
    assert b"seed 7" in entry.tensor_proto.string_val[0]
    assert [s.value for s in events.Scalars("charts/win_rate")] == [0.5]


@pytest.mark.slow
def test_verl_tracking_is_an_extra_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's ``file`` backend gets the rows too; our JSONL, CSV and TensorBoard files stay as they are."""
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "verl.jsonl"))
    writer = MetricsWriter(tmp_path / "run", tracking=["file"], experiment="demo")
    writer.log(1, {"charts/win_rate": 0.5, "actor/pg_loss": -0.1})
    writer.close()
    (row,) = [json.loads(line) for line in (tmp_path / "verl.jsonl").read_text().splitlines()]
    assert row == {"step": 1, "data": {"charts/win_rate": 0.5, "actor/pg_loss": -0.1}}
    assert writer.rows() == [{"step": 1, "charts/win_rate": 0.5, "actor/pg_loss": -0.1}]
    assert any((tmp_path / "run" / "tb").iterdir())
    with pytest.raises(ValueError, match="already written"):
        MetricsWriter(tmp_path / "other", tracking=["console"])


def _timed(
    begin: float, end: float, calls: list[tuple[float, float]], score_ms: float
) -> trajectory_pb2.Trajectory:
    """A trajectory begun at ``begin`` and finished at ``end`` (seconds) whose turns asked at each
    ``(started, generate_ms)``."""
    traj = trajectory_pb2.Trajectory(score_ms=score_ms)
    traj.started_at.FromNanoseconds(int(begin * 1e9))
    traj.finished_at.FromNanoseconds(int(end * 1e9))
    for started, ms in calls:
        turn = traj.turns.add(generate_ms=ms)
        turn.started_at.FromNanoseconds(int(started * 1e9))
    traj.turns.add()  # a scripted turn: no timing
    return traj


def test_episode_time_split_counts_overlapping_answers_once() -> None:
    # episode 1: 10 s; answers 1-3 s and 2-4 s (two seats at once: 3 s of waiting, not 4) and 6-7 s -> 4 s
    # episode 2: 6 s; one answer 1-3 s -> 2 s. Scoring 0.5 s and 0.1 s.
    one = _timed(100.0, 110.0, [(101.0, 2000.0), (102.0, 2000.0), (106.0, 1000.0)], 500.0)
    two = _timed(200.0, 206.0, [(201.0, 2000.0)], 100.0)
    untimed = trajectory_pb2.Trajectory()  # built elsewhere, no driver timing: left out
    split = episode_time_split([one, two, untimed])
    assert split == pytest.approx(
        {
            "perf/episode_s": 8.0,
            "perf/episode_generate_s": 3.0,
            "perf/episode_env_s": 5.0,
            "perf/episode_score_s": 0.3,
        }
    )
    assert episode_time_split([untimed]) == {}


def test_time_split_line_gives_medians_and_leaves_out_what_was_not_reported() -> None:
    rows = [
        {"step": 0, "eval/win_rate": 0.1},  # an evaluation row: not an update
        {"perf/update_s": 9.0, "perf/collect_s": 20.0, "perf/train_s": 8.0, "perf/publish_s": 0.5,
         "perf/commit_s": 0.5, "perf/episode_s": 10.0, "perf/episode_generate_s": 6.0,
         "perf/episode_env_s": 4.0, "perf/episode_score_s": 0.01},
        {"perf/update_s": 11.0, "perf/collect_s": 30.0, "perf/train_s": 10.0, "perf/publish_s": 0.7,
         "perf/commit_s": 0.3, "perf/episode_s": 12.0, "perf/episode_generate_s": 7.0,
         "perf/episode_env_s": 5.0, "perf/episode_score_s": 0.03},
        {"perf/update_s": 10.0, "perf/collect_s": 25.0, "perf/train_s": 9.0, "perf/publish_s": 0.6,
         "perf/commit_s": 0.4, "perf/episode_s": 11.0, "perf/episode_generate_s": 6.5,
         "perf/episode_env_s": 4.5, "perf/episode_score_s": 0.02},
    ]  # fmt: skip
    assert time_split_line(rows) == (
        "time per update (median of 3): collect 25.0 s (an episode: 11.0 s, waiting for answers 6.5 s, "
        "environment 4.5 s, scoring 0.02 s) · train 9.0 s · publish 0.6 s · commit 0.4 s"
    )
    learner = [
        {"perf/update_s": 3.0, "perf/train_s": 2.0, "perf/learner_infer_s": 0.5, "perf/learner_train_s": 1.2}
    ]
    assert time_split_line(learner) == (
        "time per update (median of 1): train 2.0 s (learner forward-only 0.5 s, update 1.2 s)"
    )
    assert time_split_line([{"step": 0}]) == ""


def test_eval_time_line_gives_medians_of_the_timed_evaluations() -> None:
    rows = [
        {"step": 0, "perf/eval_s": 30.0, "perf/eval_episode_s": 20.0, "perf/eval_episode_generate_s": 19.0,
         "perf/eval_episode_env_s": 1.0, "perf/eval_base_s": 99.0},
        {"step": 5, "perf/update_s": 3.0},  # an update row
        {"step": 5, "perf/eval_s": 26.0, "perf/eval_episode_s": 21.0, "perf/eval_episode_generate_s": 20.5,
         "perf/eval_episode_env_s": 0.5},
        {"step": 10, "perf/eval_s": 28.0, "perf/eval_episode_s": 22.0, "perf/eval_episode_generate_s": 21.0,
         "perf/eval_episode_env_s": 0.8},
    ]  # fmt: skip
    assert eval_time_line(rows) == (
        "evaluation (median of 3): 28.0 s (an episode: 21.0 s, waiting for answers 20.5 s, environment 0.8 s)"
    )
    assert eval_time_line([{"step": 0, "perf/eval_s": 2.0}]) == "evaluation (median of 1): 2.0 s"
    assert eval_time_line([{"step": 1, "perf/update_s": 1.0}]) == ""


def test_answer_metrics_split_each_policys_answers_by_action_and_average_components() -> None:
    traj = trajectory_pb2.Trajectory()

    def turn(policy: str, kind: str, tokens: int, valid: bool = True, **components: float) -> None:
        t = traj.turns.add(valid=valid)
        t.policy.policy_id = policy
        t.action.kind = kind
        t.response_token_ids.extend(range(tokens))
        t.reward_components.update(components)

    turn("v", "speak", 20)
    turn("v", "speak", 20)
    turn("v", "vote", 5, role_vote=0.2)
    turn("v", "vote", 5, role_vote=-0.2, outcome=-1.0)
    # refused by the rules: "invalid", whatever it tried
    turn("v", "vote", 3, valid=False, invalid_penalty=-0.1)
    turn("w", "vote", 4)
    traj.turns.add().action.kind = "vote"  # a scripted seat: no policy, no tokens
    out = answer_metrics([traj], "eval_answers")
    assert out == pytest.approx(
        {
            "eval_answers/v/speak/share": 0.4, "eval_answers/v/speak/token_share": 40 / 53,
            "eval_answers/v/vote/share": 0.4, "eval_answers/v/vote/token_share": 10 / 53,
            "eval_answers/v/invalid/share": 0.2, "eval_answers/v/invalid/token_share": 3 / 53,
            "eval_answers/v/component/role_vote": 0.0, "eval_answers/v/component/outcome": -1.0,
            "eval_answers/v/component/invalid_penalty": -0.1,
            "eval_answers/w/vote/share": 1.0, "eval_answers/w/vote/token_share": 1.0,
        }
    )  # fmt: skip
    assert answer_metrics([]) == {}
