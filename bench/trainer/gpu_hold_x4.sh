#!/usr/bin/env bash
# One hold of a lent 4-GPU machine (`nvidia-h100-x4`), after staging (stage.sh) and `. bench/trainer/gpu_env.sh`:
# the GPU end-to-end test and four of issue 19's recipes, each on a card of its own, started together in the
# background so that they outlive the call that starts them (poll with `sleep` calls, back to back: a lent
# machine goes back 30 s after the last call ends, with everything started on it).
#
#   SMOL=/tmp/smol OUT=/tmp/out setsid nohup bash bench/trainer/gpu_hold_x4.sh > /tmp/hold.log 2>&1 < /dev/null &
#   bash bench/trainer/poll.sh 270       # every polling call, back to back (it copies the logs to $OUT)
# First use (2026-11-27, 4 x H200, bench/results/2026-11-27-h200x4-hold-s18.md): all four runs were training by
# minute 6; the machine was lost at minute 15 to a gap of more than 30 s between two polling calls.
#
# Why one 4-card hold: a session's device time counts a multi-GPU machine's held time once, not per card, so
# four one-card runs side by side cost what one costs; each run has its card to itself (CUDA_VISIBLE_DEVICES),
# none shares memory or compute with another (the host's 64 cores and 512 GB are far from the bound).
#   card 0: 12-player Chinese Werewolf, GRPO (the recipe as it is: micro-batch 8, no fused kernels)
#   card 1: WIA + AIW with GiGPO (the recipe's learner has the fused kernels since session 19; the s18 and s19
#           holds passed them as overrides)
#   card 2: 6p village PPO through the verl agent loop (agent_loop_village.sh: clone, evaluation, main_ppo, evaluation)
#   card 3: the GPU end-to-end test (tests/test_train_gpu.py), then IPPO (two co-trained policies)
# Minutes (MIN_12P, MIN_AIW, MIN_IPPO 15 each, MIN_VILLAGE 10) are what fits a 30-minute hold after ~3 minutes of staging:
# each recipe's warm start and first evaluation (policy, base model, references) come before its training clock.
# The four logs: /tmp/gpu-werewolf-12p-zh-grpo-smollm2.queue.log, /tmp/gpu-werewolf-gigpo-aiw-smollm2.queue.log,
# $OUT/village/ (agent_loop_village.sh's logs), $OUT/gpu-test.log and $OUT/gpu-ippo-smollm2.log; curves and
# metrics land in $OUT as each recipe finishes.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export SMOL=${SMOL:-/tmp/smol} OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/village"
say() { echo "== $(date +%T) $*"; }
bash "$here/gpu_train.sh" prepare  # the carried SmolLM2 pieces joined once, before anything reads them
# cards 0 and 1: the queue (its sampler writes every card's utilisation to $OUT/gpu-samples.csv)
CARDS="0 1" PARALLEL=20 \
  bash "$here/gpu_queue.sh" "configs/gpu-werewolf-12p-zh-grpo-smollm2.yaml:${MIN_12P:-15}" \
  "configs/gpu-werewolf-gigpo-aiw-smollm2.yaml:${MIN_AIW:-15}" > /tmp/queue.log 2>&1 &
queue=$!
(
  export CUDA_VISIBLE_DEVICES=2
  OUT=$OUT/village MINUTES=${MIN_VILLAGE:-10} EVAL=${VILLAGE_EVAL:-eval.episodes=64} \
    bash "$here/agent_loop_village.sh" > /tmp/village.log 2>&1
  say "village agent loop exit $?"
) &
village=$!
(
  export CUDA_VISIBLE_DEVICES=3
  bash "$here/gpu_train.sh" test > "$OUT/gpu-test.log" 2>&1
  say "gpu test exit $?" | tee -a "$OUT/gpu-test.log"
  RUN=gpu-ippo-smollm2 bash "$here/gpu_train.sh" recipe configs/gpu-ippo-smollm2.yaml \
    "train.max_minutes=${MIN_IPPO:-15}" > /tmp/gpu-ippo-smollm2.queue.log 2>&1
  say "ippo exit $?"
) &
card3=$!
wait "$queue" "$village" "$card3"
say "hold plan done"
