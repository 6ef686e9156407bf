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
# after a failure. /tmp/queue.done lists each recipe's exit status. To end a recipe early and still get its
# final evaluation and learning line (e.g. to free the card): pkill -USR1 -f "wolfpack[.]cli[.]main train -c CONFIG"
# (SIGTERM is a polite stop: a checkpoint, no evaluation).
# Why the polling matters: a lent machine is given back 30 s after a call ends, and everything started on it
# (this queue too) goes with it; so keep one call running (`sleep` + `tail`) until the queue is done.
#
# PARALLEL=SECONDS runs the recipes side by side on the one card instead, each started SECONDS after the
# previous (vLLM profiles the card's free memory at start-up; staggering keeps one start from seeing another's
# allocations). Give each recipe a smaller vLLM share then (e.g. `EXTRA=inference.gpu_memory_utilization=0.1`,
# applied to every recipe). With CARDS="0 1" (a host with several GPUs) recipe i runs on card CARDS[i mod n]
# alone (its CUDA_VISIBLE_DEVICES), so two one-GPU recipes take one lent 2-GPU machine's hold together, each
# with a card to itself (stagger them anyway: the first one converts the carried SmolLM2 into the shared
# model cache):
#   CARDS="0 1" PARALLEL=60 SMOL=/tmp/smol OUT=/tmp/out setsid nohup bash bench/trainer/gpu_queue.sh A.yaml:15 B.yaml:15 ...
# Either way a sampler writes each card's utilisation and memory and the host's load average every 10 s to
# $OUT/gpu-samples.csv (one row per card), which is what says whether the recipes were waiting on a card.
# EXTRA applies to every recipe; EXTRA_1, EXTRA_2, ... to the first, second, ... recipe only (e.g. a faster
# learner for one of two recipes sharing a hold: EXTRA_2="policies.0.extra.fused_kernels=true ...").
# NAME_1, NAME_2, ... name that recipe's run (its run directory, log and files in $OUT; default the config's
# file name): needed when one config runs twice in a queue, e.g. two seeds side by side.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: > /tmp/queue.done
out=${OUT:-/tmp}
mkdir -p "$out"  # else the sampler and every recipe's tee fail (and pipefail turns a finished run into exit 1)
( echo "time,gpu_util_pct,mem_used_mib,load1,gpu_index"
  while true; do
    now=$(date +%T) load=$(cut -d' ' -f1 /proc/loadavg)
    nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits 2>/dev/null \
      | tr -d ' ' | while IFS=, read -r idx util mem; do echo "$now,$util,$mem,$load,$idx"; done
    sleep 10
  done ) > "$out/gpu-samples.csv" 2>/dev/null &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT
run_name() {  # CONFIG POSITION: NAME_<POSITION>, else the config's file name
  local own="NAME_$2"
  echo "${!own:-$(basename "$1" .yaml)}"
}
run_one() {  # CONFIG MINUTES POSITION (1-based: EXTRA_<POSITION> adds overrides for that recipe only)
  local cfg=$1 minutes=$2 own="EXTRA_$3" name
  name=$(run_name "$cfg" "$3")
  echo "== $(date +%T) $name ${minutes:+($minutes min)}"
  # shellcheck disable=SC2086  # EXTRA and EXTRA_<n> are lists of key=value overrides
  if [ -n "$minutes" ]; then
    RUN=$name bash "$here/gpu_train.sh" recipe "$cfg" "train.max_minutes=$minutes" ${EXTRA:-} ${!own:-}
  else
    RUN=$name bash "$here/gpu_train.sh" recipe "$cfg" ${EXTRA:-} ${!own:-}
  fi
  echo "$name $?" >> /tmp/queue.done
}
read -r -a cards <<< "${CARDS:-}"
if [ -n "${PARALLEL:-}" ]; then
  i=0 pids=()
  for item in "$@"; do
    cfg=${item%%:*}; minutes=${item#*:}; [ "$minutes" = "$item" ] && minutes=""
    (
      if [ "${#cards[@]}" -gt 0 ]; then
        export CUDA_VISIBLE_DEVICES=${cards[$((i % ${#cards[@]}))]}
        echo "== $(run_name "$cfg" $((i + 1))) on card $CUDA_VISIBLE_DEVICES"
      fi
      run_one "$cfg" "$minutes" $((i + 1))
    ) > "/tmp/$(run_name "$cfg" $((i + 1))).queue.log" 2>&1 &
    pids+=($!)
    i=$((i + 1))
    sleep "$PARALLEL"
  done
  wait "${pids[@]}"  # not a bare wait: that would wait for the sampler too, i.e. forever
  echo "== $(date +%T) queue done"
  exit 0
fi
n=0
for item in "$@"; do
  cfg=${item%%:*}
  minutes=${item#*:}
  [ "$minutes" = "$item" ] && minutes=""
  n=$((n + 1))
  run_one "$cfg" "$minutes" "$n"
done
echo "== $(date +%T) queue done"
