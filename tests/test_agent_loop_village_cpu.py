"""``bench/trainer/agent_loop_village.sh`` on a CPU: what can run without the GPU.

* The wall-clock bound (``stop_after_checkpoint.sh``) against a stand-in trainer process that behaves as
  verl's ``main_ppo`` does towards it (a progress line, then a checkpoint tracker written after each step's
  save, then the step's metrics line): it lets the trainer run for the budget, stops it only after a
  checkpoint completed past the budget and its step's metrics were logged, and stops the whole process group.
* ``DRY_RUN=1``: the plan from the recipe's config, the dataset of village rows, and verl's own config
  composed from the command's overrides, validated and the dataset loaded through verl's ``RLHFDataset``
  (``main_ppo_config_check.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WATCHDOG = ROOT / "bench" / "trainer" / "stop_after_checkpoint.sh"

FAKE_TRAINER = r"""
import os, signal, sys, time
ckpt, out = sys.argv[1], sys.argv[2]
def stop(signum, frame):
    open(out, "w").write(f"SIGTERM after step {step}, logged {logged}\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
child = os.fork()
if child == 0:  # a worker in the same process group (as verl's Ray workers started by the driver are not)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(600)
    os._exit(0)
print("Training Progress:   0%|", flush=True)
step = logged = 0
while True:
    time.sleep(2.0)  # one step (the watchdog polls every second; verl steps take 10+ s)
    step += 1
    os.makedirs(f"{ckpt}/global_step_{step}", exist_ok=True)
    open(f"{ckpt}/latest_checkpointed_iteration.txt", "w").write(str(step))  # after the save
    time.sleep(2.5)  # verl logs the step's metrics after its checkpoint
    print(f"(TaskRunner pid=1) step:{step} - critic/score/mean:0.0", flush=True)
    logged = step
"""


def _fake_trainer(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path, Path, Path]:
    """The stand-in trainer started in a session of its own: (process, its log, the file its SIGTERM handler
    writes, its checkpoint directory)."""
    script = tmp_path / "fake.py"
    script.write_text(FAKE_TRAINER)
    log, out, ckpt = tmp_path / "main_ppo.log", tmp_path / "stopped", tmp_path / "ckpt"
    with log.open("w") as f:
        trainer = subprocess.Popen(
            [sys.executable, str(script), str(ckpt), str(out)], stdout=f, stderr=f, start_new_session=True
        )
    return trainer, log, out, ckpt


def test_watchdog_stops_after_the_first_checkpoint_past_the_budget(tmp_path: Path) -> None:
    trainer, log, out, ckpt = _fake_trainer(tmp_path)
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            ["bash", str(WATCHDOG), str(trainer.pid), str(log), str(ckpt / "latest_checkpointed_iteration.txt"), "3"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        elapsed = time.monotonic() - t0
        assert trainer.wait(timeout=10) == 0, done.stdout
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, 9)
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout
    assert "training started" in said and "waiting for the next checkpoint" in said, said
    at = int(said.split("done at checkpoint step ")[1].split(";")[0])
    last = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
    assert last == at + 1  # one more checkpoint completed after the budget, then the stop
    # stopped by SIGTERM after that save and after the step's metrics line, which verl prints after the save
    assert out.read_text() == f"SIGTERM after step {last}, logged {last}\n"
    assert elapsed >= 3  # never before the budget
    assert f"last checkpoint step {last}" in said
    # the group stop reached the trainer's child too (same process group)
    for _ in range(50):  # a signalled process takes a moment to go
        alive = subprocess.run(
            ["pgrep", "-g", str(trainer.pid)], capture_output=True, text=True
        ).stdout.split()
        if not alive:
            break
        time.sleep(0.1)
    assert alive == []


def test_watchdog_finishes_at_the_next_checkpoint_on_sigusr1(tmp_path: Path) -> None:
    """SIGUSR1 (a hold's timer, ``gpu_hold_x4.sh``'s FINISH_AFTER_S) spends the budget at once: the trainer
    is stopped after its next checkpoint, long before its 600 s."""
    trainer, log, out, ckpt = _fake_trainer(tmp_path)
    watchdog: subprocess.Popen[str] | None = None
    try:
        watchdog = subprocess.Popen(
            ["bash", str(WATCHDOG), str(trainer.pid), str(log), str(ckpt / "latest_checkpointed_iteration.txt"), "600"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        for _ in range(100):  # until the watchdog has seen training begin and a step has been saved
            if (ckpt / "latest_checkpointed_iteration.txt").exists():
                break
            time.sleep(0.1)
        time.sleep(1.5)  # the watchdog polls every second: it has seen the progress line by now
        watchdog.send_signal(signal.SIGUSR1)
        said, _ = watchdog.communicate(timeout=60)
        assert trainer.wait(timeout=10) == 0, said
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, 9)
        if watchdog is not None and watchdog.poll() is None:
            watchdog.kill()
    assert watchdog.returncode == 0, said
    assert "SIGUSR1: finishing at the next checkpoint" in said and "told to finish after" in said, said
    at = int(said.split("at checkpoint step ")[1].split(";")[0])
    last = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
    assert last == at + 1 and out.read_text() == f"SIGTERM after step {last}, logged {last}\n", said


def test_watchdog_returns_when_the_trainer_ends_by_itself(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("")
    trainer = subprocess.Popen(["sleep", "1"], start_new_session=True)
    done = subprocess.run(
        ["bash", str(WATCHDOG), str(trainer.pid), str(log), str(tmp_path / "none.txt"), "600"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    trainer.wait()
    assert done.returncode == 0 and "last checkpoint step 0" in done.stdout, done.stdout


@pytest.mark.slow
def test_dry_run_plans_the_recipe_and_checks_verls_config(tmp_path: Path) -> None:
    pytest.importorskip("verl")
    pd = pytest.importorskip("pandas")
    env = {**os.environ, "DRY_RUN": "1", "PY": sys.executable, "WOLFPACK_RUN_DIR": str(tmp_path / "wp"),
           "ROWS": "64", "EVAL": "eval.episodes=16", "SKIP_ACTIONS": "villager:speak,witch:speak"}  # fmt: skip
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "trainer" / "agent_loop_village.sh")],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert f"start clone: {tmp_path}/wp/models/warm-smollm2-135m-instruct-" in out
    assert "village roles villager,seer,witch vs heuristic wolves" in out and "eval 16 held-out seeds" in out
    assert "prompts of both evaluations and the clone: rollout.prompt=conversation" in out
    assert "wrote 64 rows (werewolf_v1/6p, roles ['villager', 'seer', 'witch'])" in out
    # main_ppo trains with the recipe's own learner settings, read from its config, not a copy of them
    # ... but micro-batches that divide the mini-batch of 8 seats (verl's engine asserts it at the first
    # update; s25's run died there with the recipe's 32), and the config check holds verl to it
    assert "micro-batch 32 does not divide the PPO mini-batch of 8 seats: 8" in out
    assert "learner: lr 3e-05, critic lr 5e-05, 2 PPO epochs, micro-batch 8, fused kernels True" in out
    assert "actor_rollout_ref.actor.optim.lr=3e-05 " in out
    assert "critic.ppo_micro_batch_size_per_gpu=8 " in out
    assert "actor_rollout_ref.actor: mini-batch 8 samples a GPU in micro-batches of 8" in out
    assert "critic: mini-batch 8 samples a GPU in micro-batches of 8" in out
    assert "actor_rollout_ref.model.use_fused_kernels=True" in out
    assert "adv_estimator gae: critic True, reference policy False" in out
    # GAE's lambda is 1.0 for one sequence a seat with its reward on the last token, not the recipe's 0.95
    # (tuned for turn samples), and verl's composed config holds it
    assert "GAE gamma 1.0 lambda 1.0 (the recipe's lambda: 0.95)" in out
    assert "algorithm gamma 1.0, lam 1.0" in out
    # the answers masked out of training reach every dataset row (the agent loop reads them per seat's role)
    assert "answers masked out of training: villager:speak,witch:speak" in out
    rows = pd.read_parquet(tmp_path / "wp" / "agent-loop-village-dry-run" / "train.parquet")
    assert {tuple(json.loads(x["wolfpack"])["skip_actions"]) for x in rows["extra_info"]} == {
        ("villager:speak", "witch:speak")
    }
    assert "actor checkpoint save_contents ['hf_model']" in out
    assert "training rows verl keeps: 64" in out and "main_ppo config check: ok" in out
    assert "policies.0.model=" in out and "--start" in out
