#!/usr/bin/env bash
# One polling call on a lent GPU machine while recipes run in the background (gpu_hold_x4.sh, gpu_queue.sh,
# agent_loop_village.sh, vs_main_ppo.sh): wait, then print every run's progress, the cards, and copy the logs
# to $OUT so that they come back with this call even if the machine is lost before the next one.
#
#   bash bench/trainer/poll.sh 270        # the whole command of each polling call; make the next call at once
#
# Why a script: a lent machine goes back 30 s after the last call ends, with everything running on it (seen:
# four recipes lost at minute 15 of a 4-GPU hold while a failure was being read between two calls). Read
# failures in what this prints, or in the next call, never between calls.
set -uo pipefail
sleep "${1:-270}"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/poll"
date +%T
for log in /tmp/*.queue.log /tmp/village.log /tmp/vs.log "$OUT"/gpu-test.log; do
  [ -f "$log" ] || continue
  echo "## $log"
  grep -aE "^(update|learning|reference)|passed|failed|exit [0-9]|Error|error:" "$log" | tail -n 4 | cut -c1-300
done
village=${WOLFPACK_RUN_DIR:-/tmp/wp}/agent-loop-village/logs
if [ -d "$village" ]; then
  echo "## $village"
  tail -n 2 "$village/watchdog.log" 2> /dev/null
  grep -aE "step:[0-9]+ - " "$village/main_ppo.log" 2> /dev/null | tail -n 1 | cut -c1-300
  grep -aE "Error|error:" "$village/main_ppo.log" 2> /dev/null | tail -n 2 | cut -c1-300
  cp "$village"/*.log "$OUT/poll/" 2> /dev/null
fi
nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader 2> /dev/null
cp /tmp/*.queue.log /tmp/village.log /tmp/vs.log /tmp/hold.log "$OUT/poll/" 2> /dev/null
true
