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
PLAN_OUT=${PLAN_OUT:-/tmp/out}  # where the hold plan's runs write (gpu_hold_x4.sh's OUT)
OUT=${OUT:-$PLAN_OUT}           # this call's folder on a lent machine (the run tool sets it): what comes back
mkdir -p "$OUT/poll"
date +%T
for log in /tmp/*.queue.log /tmp/village.log /tmp/vs.log "$PLAN_OUT"/gpu-test.log; do
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
# The plan's results so far (logs, metrics, curves, evaluation archives; no checkpoints): a run's files reach
# $PLAN_OUT only as it finishes, and $PLAN_OUT itself never comes back on its own.
if [ "$PLAN_OUT" != "$OUT" ] && [ -d "$PLAN_OUT" ]; then
  (cd "$PLAN_OUT" && find . -type f -size -20M ! -name "*.safetensors" ! -name "*.pt" ! -name "*.bin" \
    -exec cp --parents {} "$OUT/poll/" \; 2> /dev/null)
fi
true
