#!/usr/bin/env bash
# A wall-clock bound for a trainer that counts steps (stock verl `main_ppo`): waits until PID's LOG shows that
# training began (verl's "Training Progress" bar, or its first "step:1 - " metrics line), lets it train for
# SECONDS, then waits for the next checkpoint it completes (TRACKER, verl's latest_checkpointed_iteration.txt,
# changes: verl writes it only after the whole save) and stops PID's process group (SIGTERM, SIGKILL after 60 s).
# Returns when PID is gone, whether it was stopped here or ended by itself; prints what it did.
#
#   setsid python3 -m verl.trainer.main_ppo ... > LOG 2>&1 &
#   bash bench/trainer/stop_after_checkpoint.sh $! LOG CKPT_DIR/latest_checkpointed_iteration.txt 900
#
# PID must lead its process group (setsid), so the group stop reaches its children. Used by agent_loop_village.sh.
# SIGUSR1 to this script means "finish now", as it does to `wolfpack train`: the budget counts as spent (once
# training began), so the run stops after its next checkpoint. Why: a hold's timer (gpu_hold_x4.sh's
# FINISH_AFTER_S) ends every run in time for its results to come back; without it the agent loop's budget had
# to be guessed short (9 minutes in s26) to fit the hold.
set -uo pipefail
pid=$1 log=$2 tracker=$3 limit=$4
saved() { cat "$tracker" 2> /dev/null || echo 0; }
alive() {  # a zombie (exited, not yet reaped by its parent) is gone too
  local stat
  stat=$(ps -o stat= -p "$pid" 2> /dev/null) && [ "${stat#Z}" = "$stat" ]
}
say() { echo "== $(date +%T) $*"; }
finish=""
trap 'finish=1; say "SIGUSR1: finishing at the next checkpoint"' USR1
started=""
while alive; do
  # the clock starts at verl's progress bar (tqdm's carriage returns may keep it from the log until a
  # newline), else at the first step's metrics line (then a step late: training lasts longer, never shorter)
  if [ -z "$started" ] && grep -qE "Training Progress|step:1 - " "$log" 2> /dev/null; then
    started=$(date +%s)
    say "training started; stopping after the first checkpoint past $limit s"
  fi
  if [ -n "$started" ] && { [ -n "$finish" ] || [ $(($(date +%s) - started)) -ge "$limit" ]; }; then
    at=$(saved)
    if [ -n "$finish" ]; then
      say "told to finish after $(($(date +%s) - started)) s of training, at checkpoint step $at; waiting for the next checkpoint"
    else
      say "$limit s of training done at checkpoint step $at; waiting for the next checkpoint"
    fi
    while alive && [ "$(saved)" = "$at" ]; do sleep 1; done
    step=$(saved)
    say "checkpoint step $step saved after $(($(date +%s) - started)) s of training"
    # verl logs a step's metrics after its checkpoint: stopping at the checkpoint lost them (seen on the
    # first GPU run: a step trained, saved, and no 'step:1 - ' line to read its time split from)
    for _ in $(seq 120); do
      { ! alive || grep -qE "(^|[ )])step:$step - " "$log" 2> /dev/null; } && break
      sleep 1
    done
    say "stopping $pid"
    kill -TERM -- "-$pid" 2> /dev/null || true
    for _ in $(seq 60); do alive || break; sleep 1; done
    kill -KILL -- "-$pid" 2> /dev/null || true
    break
  fi
  sleep 1
done
say "trainer $pid gone; last checkpoint step $(saved); trained $((${started:+$(date +%s) - started}+0)) s"
