#!/usr/bin/env bash
# A queue of GPU recipes for one lent machine (after `. bench/trainer/gpu_env.sh`), meant to be started in the
# background so that it outlives the call that starts it, then polled:
#
#   SMOL=/tmp/smol OUT=/tmp/out setsid nohup bash bench/trainer/gpu_queue.sh \
#       configs/gpu-bargaining-smollm2.yaml:15 configs/gpu-werewolf-6p-ppo-smollm2.yaml:10 > /tmp/queue.log 2>&1 &
#   sleep 500; tail -5 /tmp/queue.log; ls /tmp/out          # repeat, back to back: see the note below
#
# Each argument is CONFIG[:MINUTES] (MINUTES: train.max_minutes, default the config's own); every recipe runs
# through gpu_train.sh (its log, metrics and curves are copied to $OUT as they finish) and the queue goes on
# after a failure. /tmp/queue.done lists each recipe's exit status.
# Why the polling matters: a lent machine is given back 30 s after a call ends, and everything started on it
# (this queue too) goes with it; so keep one call running (`sleep` + `tail`) until the queue is done.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: > /tmp/queue.done
for item in "$@"; do
  cfg=${item%%:*}
  minutes=${item#*:}
  [ "$minutes" = "$item" ] && minutes=""
  name=$(basename "$cfg" .yaml)
  echo "== $(date +%T) $name ${minutes:+($minutes min)}"
  if [ -n "$minutes" ]; then
    RUN=$name bash "$here/gpu_train.sh" recipe "$cfg" "train.max_minutes=$minutes"
  else
    RUN=$name bash "$here/gpu_train.sh" recipe "$cfg"
  fi
  echo "$name $?" >> /tmp/queue.done
done
echo "== $(date +%T) queue done"
