#!/usr/bin/env bash
# One hold of a lent GPU machine (4 GPUs: `nvidia-h100-x4` / `nvidia-h200-x4`; the x2 and x1 plans for 2 and 1), after staging (stage.sh) and `. bench/trainer/gpu_env.sh`:
# the GPU end-to-end test and issue 19's runs, each on a card of its own, started together in the
# background so that they outlive the call that starts them (poll with `sleep` calls, back to back: a lent
# machine goes back 30 s after the last call ends, with everything started on it).
#
#   bash bench/trainer/hold_start.sh     # the last staging call: starts this script from a snapshot, as
#   # SMOL=/tmp/smol OUT=/tmp/out setsid nohup bash bench/trainer/gpu_hold_x4.sh > /tmp/hold.log 2>&1 < /dev/null &
#   bash bench/trainer/poll.sh 270       # every polling call, back to back (it copies the logs to $OUT)
# Uses: s18 (bench/results/2026-11-27-h200x4-hold-s18.md): all four runs training by minute 6, the machine lost
# at minute 15 to a gap of more than 30 s between two polling calls. s19 (2026-11-27-h200x4-hold-s19.md, PLAN=s19):
# all five runs finished within the 30 minutes; poll.sh's copies, tarred into each call's $OUT (a call returns at
# most 8 files), brought every log, metric and curve back.
#
# Why one 4-card hold: a session's device time counts a multi-GPU machine's held time once, not per card, so
# four one-card runs side by side cost what one costs; each run has its card to itself (CUDA_VISIBLE_DEVICES),
# none shares memory or compute with another (the host's 64 cores and 512 GB are far from the bound).
# PLAN=s19: card 0 12p ZH GRPO, card 1 AIW GiGPO, card 2 the village through the verl agent loop
#   (agent_loop_village.sh, MIN_VILLAGE 10), card 3 the GPU end-to-end test then IPPO.
# PLAN=s22 (run in s22, 2026-11-28-h200x4-hold-s22.md): see its case below. PLAN=s22x2: its GPU test, AIW and
#   12p on a lent 2-GPU machine (unrun). PLAN=s23 (not yet run): see its case below; s23x2 its
#   GPU test, bargaining seed 2 and village seed 1 on a lent 2-GPU machine; s23x1 the village's seed 1 for 15+
#   training minutes beside the GPU test on one lent H200 (run in s23: bench/results/2026-11-28-h200-hold-s23.md).
# PLAN=s28 (the default; not yet run): see its case below (12p villagers whose speeches give no sample on two
#   training seeds, the same hold's control with speeches trained beside the GPU test, the agent-loop village
#   with its villagers' and witch's speeches masked out); s28x2 two of its cards on a lent 2-GPU machine, s28x1
#   one on one H200.
# PLAN=s27 (run in s27, bench/results/2026-11-28-h200x4-hold-s27.md): see its case below (the GPU test beside 12p
#   villagers in groups of 4, the agent-loop village at GAE lambda 1.0, 12p villagers without the role rewards
#   and at temperature 0.7); s27x2 its first two cards on a lent 2-GPU machine, s27x1 its first card on one H200.
# PLAN=s26 (run in s26, bench/results/2026-11-28-h200x4-hold-s26.md): see its case below (12p villagers with ~4x the optimiser steps an
#   update, the agent-loop village mended, AIW's and bargaining's third seeds, the GPU test beside the latter);
#   s26x2 its first two (the GPU test beside 12p) on a lent 2-GPU machine, s26x1 12p beside the GPU test on one
#   H200 and s26x1b the agent-loop village on a second one.
# PLAN=s25 (run in s25, bench/results/2026-11-28-h200x4-hold-s25.md): see its case below (the 12p villagers recipe, the village through the
#   agent loop, IPPO with eval.vs_bot, the GPU test then the village's third seed at micro-batch 64); s25x2 its
#   first two beside the GPU test on a lent 2-GPU machine, s25x1 the 12p villagers recipe beside the GPU test
#   on one H200.
# PLAN=s24 (not yet run; s24x2 ran in s24, bench/results/2026-11-28-h200x2-hold-s24.md): see its case below (12p heuristic clone, AIW seed 1, IPPO with eval.vs_bot,
#   the GPU test then village seed 2); s24x1 its 12p recipe beside the GPU test on one H200; s24x2 that on card 0
#   and AIW's seed 1 on card 1 of a lent 2-GPU machine.
# PLAN=next (run in s21, bench/results/2026-11-28-h200x4-hold-s21.md: the 12p warm start ran out of
#   memory then, mended since; the rest finished): card 0 AIW in its new shape (half its groups against the heuristic wolves,
#   heuristic clone), card 1 12p with a seat's turns as one sequence (TWELVE_P overrides: the conversation prompt
#   mode and the episode layout), card 2 a second training seed of the bargaining recipe, card 3 the GPU test then
#   the trainer against main_ppo one side after the other (vs_main_ppo.sh, CARDS=3, VS_STEPS a side).
# Minutes (MIN_12P, MIN_AIW, MIN_IPPO, MIN_BARGAIN: 15 each) are what fits a 30-minute hold after ~3 minutes of
# staging: each recipe's warm start and first evaluation come before its training clock.
# Logs: /tmp/<recipe>.queue.log for the queue's and the one-card runs, /tmp/vs.log, $OUT/gpu-test.log; curves
# and metrics land in $OUT as each run finishes (poll.sh copies them back on every call).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export SMOL=${SMOL:-/tmp/smol} OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/village"
say() { echo "== $(date +%T) $*"; }
PLANS="s19, next, s22, s22x2, s23, s23x2, s23x1, s24, s24x1, s24x2, s25, s25x2, s25x1, s26, s26x2, s26x1, s26x1b, s27, s27x2, s27x1, s28, s28x2 or s28x1"
case "${PLAN:-s28}" in s19 | next | s22 | s22x2 | s23 | s23x2 | s23x1 | s24 | s24x1 | s24x2 | s25 | s25x2 | s25x1 | s26 | s26x2 | s26x1 | s26x1b | s27 | s27x2 | s27x1 | s28 | s28x2 | s28x1) ;; *) echo "PLAN: $PLANS" >&2; exit 2 ;; esac  # before starting anything
bash "$here/gpu_train.sh" prepare  # the carried SmolLM2 pieces joined once, before anything reads them
# FINISH_AFTER_S after this start (default 1,260 s: the hold's minute ~24 after ~3 minutes of staging), every
# `wolfpack train` still training is told to finish (SIGUSR1: the running update is its last, then its final
# evaluation and learning line), so that every result is back before the 30 minutes end. In s21 this was done
# by hand at minute 24 for two runs; 0 turns it off. Set it from the reply of the call that starts the plan:
# its lease's budget_left_s less ~200-250 s (s27: the runs were all done 136 s after the timer, the last
# polling call's copies and margin the rest; earlier plans' final evaluations took up to ~190 s). In s22 the machine's start counted ~385 s of the budget before the first call
# ran, and a refused request another 120 s: 1,140 s then. (A run still in its set-up then would be ended, not
# finished: its signal handler is not yet installed.)
if [ "${FINISH_AFTER_S:-1260}" -gt 0 ]; then
  ( sleep "${FINISH_AFTER_S:-1260}"; say "finishing every wolfpack train and agent-loop watchdog (SIGUSR1)"
    pkill -USR1 -f "wolfpack[.]cli[.]main train"
    pkill -USR1 -f "stop_after_checkpoint[.]sh" ) &  # the agent loop: stops main_ppo at its next checkpoint
fi
# 12p as conversations (the 12p recipe's header; PLAN=next and s22): SmolLM2's context less the answer, long
# sequences in small micro-batches with the fused kernels (no full-vocabulary logits). TWELVE_P replaces it.
CONVERSATION_12P="rollout.prompt=conversation batch.layout=episode rollout.max_prompt_tokens=8000
  batch.max_prompt_len=8192 batch.max_response_len=8192 policies.0.micro_batch_size=4
  policies.0.extra.infer_micro_batch_size=8 policies.0.extra.fused_kernels=true
  policies.0.extra.gradient_checkpointing=true"
gpu_test() {  # the GPU end-to-end test on this subshell's card, its log in $OUT
  bash "$here/gpu_train.sh" test > "$OUT/gpu-test.log" 2>&1
  say "gpu test exit $?" | tee -a "$OUT/gpu-test.log"
}
one_run() {  # RUN CONFIG [key=value ...]: one recipe on this subshell's card, its log /tmp/RUN.queue.log
  local run=$1 cfg=$2
  shift 2
  RUN=$run bash "$here/gpu_train.sh" recipe "$cfg" "$@" > "/tmp/$run.queue.log" 2>&1
  say "$run exit $?"
}
beside_test() {  # RUN_FUNCTION: a recipe (one of the functions below) at a vLLM share of 0.15 with the GPU test
  # beside it on this subshell's card, from second 90 (after the run's vLLM has taken its memory: vLLM profiles
  # the free memory)
  "$1" inference.gpu_memory_utilization=0.15 &
  local job=$!
  sleep 90
  gpu_test
  wait "$job"
}
twelve_clone() {  # [key=value ...]: 12p from a clone of the heuristic village on all nine village seats (s24)
  one_run gpu-werewolf-12p-zh-grpo-heuristic-clone-smollm2 configs/gpu-werewolf-12p-zh-grpo-heuristic-clone-smollm2.yaml \
    "train.max_minutes=${MIN_12P:-15}" "$@"
}
twelve_villagers() {  # [key=value ...]: 12p with the policy on the villagers among heuristic teammates (s25)
  one_run "gpu-werewolf-12p-zh-grpo-villagers-smollm2${RUN_SUFFIX:-}" configs/gpu-werewolf-12p-zh-grpo-villagers-smollm2.yaml \
    "train.max_minutes=${MIN_12P:-15}" "$@"
}
twelve_villagers_seed1() {  # [key=value ...]: the 12p villagers recipe's second training seed (seed 0: s25
  # 0.20 -> 0.15, s26 0.17 -> 0.11: both down, both inside the noise)
  RUN_SUFFIX=-seed1 twelve_villagers seed=1 "$@"
}
twelve_villagers_speech() {  # [key=value ...]: 12p villagers with the speeches trained as before s28
  # (batch.skip_actions=[]): the same hold's control for the recipe's skip_actions (five runs of it in s25-s27,
  # all down)
  RUN_SUFFIX=-speech twelve_villagers "batch.skip_actions=[]" "$@"
}
twelve_villagers_g4() {  # [key=value ...]: 12p villagers in GRPO groups of 4 games instead of 8: 8 deals an
  # update of 32 games instead of 4 (s26: the training win rate swung 0.00-0.31 from update to update with the
  # 4 deals drawn), the same games and optimiser steps an update
  RUN_SUFFIX=-g4 twelve_villagers rollout.group_size=4 "$@"
}
twelve_villagers_outcome() {  # 12p villagers without the per-turn role rewards (werewolf_shaped@1: the win,
  # the invalid-turn penalty): does the vote reward pull the policy away from winning?
  RUN_SUFFIX=-outcome twelve_villagers rollout.reward_spec=werewolf_shaped@1
}
twelve_villagers_t07() {  # 12p villagers sampled (and evaluated) at temperature 0.7 instead of 1.0: a 12-seat
  # village tolerates little noise (bench/trainer/village_fidelity.py), and at 1.0 the clone (0.40 of held-out
  # moves as the bot's, greedily) samples further from the bot on every turn: a start nearer the greedy clone
  # gives GRPO's groups more wins to learn from
  RUN_SUFFIX=-t07 twelve_villagers rollout.temperature=0.7 eval.temperature=0.7
}
village_agent_loop_quiet() {  # the agent-loop village with the villagers' and the witch's speeches masked out
  # of training (SKIP_ACTIONS; in 6p they never change the result, the seer's claims do:
  # village_fidelity.py --variant 6p --by-kind ROLE), MIN_LOOP training minutes
  SKIP_ACTIONS=villager:speak,witch:speak village_agent_loop
}
village_agent_loop() {  # the 6p village through stock main_ppo + the agent loop, MIN_LOOP training minutes
  # (default 9: ~25 minutes from start to its learning line in s19 with 10), 64 held-out games, logs in
  # /tmp/village.log and $OUT/village (poll.sh reads both)
  OUT=$OUT/village MINUTES=${MIN_LOOP:-9} EVAL=${VILLAGE_EVAL:-eval.episodes=64} \
    bash "$here/agent_loop_village.sh" > /tmp/village.log 2>&1
  say "village agent loop exit $?"
}
village_seed2_micro64() {  # MINUTES: the village's third training seed at micro-batches of 64 (s24 / s25)
  one_run gpu-werewolf-6p-ppo-heuristic-clone-smollm2-seed2 configs/gpu-werewolf-6p-ppo-heuristic-clone-smollm2.yaml \
    seed=2 policies.0.micro_batch_size=64 policies.0.extra.infer_micro_batch_size=64 "train.max_minutes=$1"
}
ippo_vs_bot() {  # IPPO with eval.vs_bot (the recipe's): each co-trained policy also against the heuristic bot
  one_run gpu-ippo-smollm2-vs-bot configs/gpu-ippo-smollm2.yaml "train.max_minutes=${MIN_IPPO:-15}"
}
bargaining_seed2() {  # [key=value ...]: a third training seed of the bargaining recipe (seeds 0 and 1: 0.75, 0.80)
  one_run gpu-bargaining-smollm2-seed2 configs/gpu-bargaining-smollm2.yaml seed=2 "train.max_minutes=${MIN_BARGAIN:-15}" "$@"
}
aiw_seed2() {  # a third training seed of WIA + AIW GiGPO (seeds 0 and 1: 0.14 -> 0.27, 0.16 -> 0.22)
  one_run gpu-werewolf-gigpo-aiw-smollm2-seed2 configs/gpu-werewolf-gigpo-aiw-smollm2.yaml seed=2 "train.max_minutes=${MIN_AIW:-15}"
}
cards() {  # COMMAND ...: the first on card 0, the next on card 1, ..., each started 20 s after the one before
  # (as gpu_queue.sh's PARALLEL: the first start fills the shared model cache), in the background; waits for all
  local pids=() card=0 command
  for command in "$@"; do
    ( export CUDA_VISIBLE_DEVICES=$card; sleep $((20 * card)); eval "$command" ) &
    pids+=("$!")
    card=$((card + 1))
  done
  wait "${pids[@]}"
}
# AIW with more optimiser steps an update (PLAN=s22 and s22x2; why: s22's card 1 below)
AIW_FAST="policies.0.mini_batch_size=256 policies.1.mini_batch_size=256 policies.0.lr=3.0e-4
  policies.1.lr=3.0e-4"
case "${PLAN:-s28}" in
  s19)  # the session-19 hold's cards (bench/results/2026-11-27-h200x4-hold-s19.md; the AIW recipe has changed since)
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
    card2=$!
    (
      export CUDA_VISIBLE_DEVICES=3
      bash "$here/gpu_train.sh" test > "$OUT/gpu-test.log" 2>&1
      say "gpu test exit $?" | tee -a "$OUT/gpu-test.log"
      RUN=gpu-ippo-smollm2 bash "$here/gpu_train.sh" recipe configs/gpu-ippo-smollm2.yaml \
        "train.max_minutes=${MIN_IPPO:-15}" > /tmp/gpu-ippo-smollm2.queue.log 2>&1
      say "ippo exit $?"
    ) &
    card3=$! ;;
  next)  # what the s19 hold left open (its results file, "What the three Werewolf results say")
    # 12p as conversations (CONVERSATION_12P above), an experiment: 2.7x fewer learner tokens, yet 1.5x the
    # update time on the CPU learner (bench/results/2026-11-27-conversation-layout-s19.md)
    # cards 0 and 1: the AIW recipe's new shape (half its groups against the heuristic wolves, heuristic clone),
    # and 12p with a seat's turns as one sequence (TWELVE_P: the conversation prompt mode and the episode layout)
    CARDS="0 1" PARALLEL=20 EXTRA_2="${TWELVE_P:-$CONVERSATION_12P}" \
      bash "$here/gpu_queue.sh" "configs/gpu-werewolf-gigpo-aiw-smollm2.yaml:${MIN_AIW:-15}" \
      "configs/gpu-werewolf-12p-zh-grpo-smollm2.yaml:${MIN_12P:-15}" > /tmp/queue.log 2>&1 &
    queue=$!
    (  # card 2: a second training seed of the bargaining recipe (the held-out seeds stay those of seed 0)
      export CUDA_VISIBLE_DEVICES=2
      RUN=gpu-bargaining-smollm2-seed1 bash "$here/gpu_train.sh" recipe configs/gpu-bargaining-smollm2.yaml \
        seed=1 "train.max_minutes=${MIN_BARGAIN:-15}" > /tmp/gpu-bargaining-smollm2-seed1.queue.log 2>&1
      say "bargaining seed 1 exit $?"
    ) &
    card2=$!
    (  # card 3: the GPU test, then the trainer against main_ppo (item 6), one side after the other on this card
      export CUDA_VISIBLE_DEVICES=3
      bash "$here/gpu_train.sh" test > "$OUT/gpu-test.log" 2>&1
      say "gpu test exit $?" | tee -a "$OUT/gpu-test.log"
      CARDS=3 STEPS=${VS_STEPS:-8} bash "$here/vs_main_ppo.sh" > /tmp/vs.log 2>&1
      say "vs main_ppo exit $?"
    ) &
    card3=$! ;;
  s22)  # what the s21 hold left open (bench/results/2026-11-28-h200x4-hold-s21.md): all four cards one queue
    # card 0: 12p as conversations, now that its warm start trains in passes (the s21 run died in it)
    # card 1: AIW with more optimiser steps an update: in s21 one step of ~1,700 turn samples at LoRA lr 1e-4
    #   moved the policy by ppo_kl ~1e-4 an update (clipfrac ~0), 11 updates in 15 minutes: mini-batches of 256
    #   (~7 steps an update) at 3e-4, both ids alike (share_policy)
    # card 2: the village from the heuristic clone with the faster learner (fused kernels and gradient
    #   checkpointing let micro-batches of 32 fit, as they did AIW's) and lr 3e-5: in s21 its update took 73 s of
    #   ~120, six updates in 12 minutes, ppo_kl ~0.001-0.003 at 1e-5
    # card 3: the GPU end-to-end test first (the trainer changed after s21's pass: warm start in passes, version
    #   directories written off the loop, tokenizer files cached), then IPPO with train.parallel_learners (off by
    #   default until this run): the two learners' updates and publishes side by side; s19's IPPO on an H200
    #   took 27.1 s an update (15.0 training the two one after the other, 10.4 publishing them), the number to
    #   compare with, and its learning line (-0.45 -> +0.80)
    VILLAGE_FAST="policies.0.micro_batch_size=32 policies.0.extra.fused_kernels=true
      policies.0.extra.gradient_checkpointing=true policies.0.extra.infer_micro_batch_size=32 policies.0.lr=3.0e-5"
    CARDS="0 1 2" PARALLEL=20 EXTRA_1="${TWELVE_P:-$CONVERSATION_12P}" EXTRA_2="$AIW_FAST" \
      EXTRA_3="$VILLAGE_FAST" \
      bash "$here/gpu_queue.sh" "configs/gpu-werewolf-12p-zh-grpo-smollm2.yaml:${MIN_12P:-15}" \
      "configs/gpu-werewolf-gigpo-aiw-smollm2.yaml:${MIN_AIW:-15}" \
      "configs/gpu-werewolf-6p-ppo-heuristic-clone-smollm2.yaml:${MIN_VILLAGE:-15}" > /tmp/queue.log 2>&1 &
    queue=$!
    (
      export CUDA_VISIBLE_DEVICES=3
      bash "$here/gpu_train.sh" test > "$OUT/gpu-test.log" 2>&1
      say "gpu test exit $?" | tee -a "$OUT/gpu-test.log"
      RUN=gpu-ippo-smollm2-parallel bash "$here/gpu_train.sh" recipe configs/gpu-ippo-smollm2.yaml \
        train.parallel_learners=true "train.max_minutes=${MIN_IPPO:-12}" > /tmp/gpu-ippo-smollm2-parallel.queue.log 2>&1
      say "ippo (parallel learners) exit $?"
    ) &
    card3=$!
    wait "$queue" "$card3"
    say "hold plan done"
    exit 0 ;;
  s22x2)  # s22 on a lent 2-GPU machine (when no 4-GPU one comes): the village and IPPO wait for a later hold
    # card 0: the GPU test, then AIW as in s22; card 1: 12p as conversations as in s22
    # shellcheck disable=SC2086  # AIW_FAST, TWELVE_P and CONVERSATION_12P are lists of key=value overrides
    ( export CUDA_VISIBLE_DEVICES=0; gpu_test
      one_run gpu-werewolf-gigpo-aiw-smollm2 configs/gpu-werewolf-gigpo-aiw-smollm2.yaml \
        "train.max_minutes=${MIN_AIW:-15}" $AIW_FAST ) &
    card0=$!
    # shellcheck disable=SC2086
    ( export CUDA_VISIBLE_DEVICES=1
      sleep 20  # staggered as gpu_queue.sh's PARALLEL does (the first start fills the shared model cache)
      one_run gpu-werewolf-12p-zh-grpo-smollm2 configs/gpu-werewolf-12p-zh-grpo-smollm2.yaml \
        "train.max_minutes=${MIN_12P:-15}" ${TWELVE_P:-$CONVERSATION_12P} ) &
    card1=$!
    wait "$card0" "$card1"
    say "hold plan done"
    exit 0 ;;
  s23)  # what the s22 hold left open (bench/results/2026-11-28-h200x4-hold-s22.md)
    # cards 0-2: second training seeds of the two Werewolf recipes that moved in s22, in their new settings
    #   (the village from the heuristic clone 0.13 -> 0.32, AIW 0.14 -> 0.27: one seed each), and the village's
    #   seed 0 again with the clone under bf16 autocast (warmstart.precision=bf16): the fp32 clone took ~290 s
    #   of every Werewolf run's hold in s22; against s22's seed 0 (clone at 0.13, 0.08..0.20) this measures what
    #   bf16 saves and whether the clone is as good
    # card 3: the GPU end-to-end test (s22's died in the harness, not the product), then a third training seed
    #   of the bargaining recipe
    CARDS="0 1 2" PARALLEL=20 \
      NAME_1=gpu-werewolf-6p-ppo-heuristic-clone-smollm2-seed1 EXTRA_1="seed=1" \
      NAME_2=gpu-werewolf-gigpo-aiw-smollm2-seed1 EXTRA_2="seed=1" \
      NAME_3=gpu-werewolf-6p-ppo-heuristic-clone-smollm2-bf16clone EXTRA_3="warmstart.precision=bf16" \
      bash "$here/gpu_queue.sh" "configs/gpu-werewolf-6p-ppo-heuristic-clone-smollm2.yaml:${MIN_VILLAGE:-15}" \
      "configs/gpu-werewolf-gigpo-aiw-smollm2.yaml:${MIN_AIW:-15}" \
      "configs/gpu-werewolf-6p-ppo-heuristic-clone-smollm2.yaml:${MIN_VILLAGE:-15}" > /tmp/queue.log 2>&1 &
    queue=$!
    ( export CUDA_VISIBLE_DEVICES=3; gpu_test; bargaining_seed2 ) &
    card3=$!
    wait "$queue" "$card3"
    say "hold plan done"
    exit 0 ;;
  s23x2)  # s23 on a lent 2-GPU machine: the GPU test then bargaining seed 2 (card 0), the village's seed 1 (card 1)
    ( export CUDA_VISIBLE_DEVICES=0; gpu_test; bargaining_seed2 ) &
    card0=$!
    ( export CUDA_VISIBLE_DEVICES=1
      sleep 20  # staggered as gpu_queue.sh's PARALLEL does (the first start fills the shared model cache)
      one_run gpu-werewolf-6p-ppo-heuristic-clone-smollm2-seed1 configs/gpu-werewolf-6p-ppo-heuristic-clone-smollm2.yaml \
        seed=1 "train.max_minutes=${MIN_VILLAGE:-15}" ) &
    card1=$!
    wait "$card0" "$card1"
    say "hold plan done"
    exit 0 ;;
  s23x1)  # one lent H200 (a one-GPU machine's held time counts half, so a hold can last its full 30 minutes plus
    # the call in flight then): the village's seed 1 for 15+ training minutes, which no Werewolf recipe has had
    # (s22's seed 0: 8.2 minutes), its clone under bf16 autocast (s22's fp32 clone: ~290 s); the GPU test beside
    # it during the village's set-up (evaluations and clone; 322 s in s21). vLLM's share 0.2 of the H200 (28.6 GB,
    # what 0.35 gives on an H100) so that the two fit the card together: a KV-cache size, not a learning setting.
    ( one_run gpu-werewolf-6p-ppo-heuristic-clone-smollm2-seed1 configs/gpu-werewolf-6p-ppo-heuristic-clone-smollm2.yaml \
        seed=1 warmstart.precision=bf16 inference.gpu_memory_utilization=0.2 "train.max_minutes=${MIN_VILLAGE:-16}" ) &
    village=$!
    ( sleep 90; gpu_test ) &  # after the village's vLLM has taken its memory (vLLM profiles the free memory)
    test=$!
    wait "$village" "$test"
    say "hold plan done"
    exit 0 ;;
  s24)  # what the s23 hold left open (bench/results/2026-11-28-h200-hold-s23.md), on a lent 4-GPU machine
    # card 0: 12p from a clone of the heuristic village (its new recipe; no 12p run has won a game yet)
    # card 1: AIW's second training seed in its s22 settings (seed 0: 0.14 -> 0.27, overlapping intervals)
    # card 2: IPPO with eval.vs_bot (now the recipe's): each co-trained policy alone against the heuristic bot
    #   at every evaluation, the claim the pair's own line cannot make (s19: the pair -0.45 -> +0.80); a third
    #   bargaining seed (seeds 0 and 1: 0.75 and 0.80) waits, bargaining_seed2
    # card 3: the GPU test (the trainer changed after s23's pass: step-0 set-up metrics), then the village's
    #   third training seed (seeds 0 and 1: 0.13 -> 0.32 and 0.18 -> 0.23) at micro-batches of 64 instead of
    #   32: the same gradients (accumulated over a mini-batch of 128), half the micro-batches. Why: the learner
    #   was 26 of s23's 30 s update, ~72 forward/backward micro-batch passes (2 epochs, actor and critic) at a
    #   fixed host cost of ~0.1-0.25 s each whatever their size (bench/results/2026-11-27-learner-microbatch-cpu.md;
    #   8 -> 32 took the learner from 73 to 34 s in s22), and micro 32 allocated only 12.5 GB. The run measures
    #   the update time against s23's 30.1 s
    CARDS="0 1" PARALLEL=20 NAME_2=gpu-werewolf-gigpo-aiw-smollm2-seed1 EXTRA_2="seed=1" \
      bash "$here/gpu_queue.sh" "configs/gpu-werewolf-12p-zh-grpo-heuristic-clone-smollm2.yaml:${MIN_12P:-15}" \
      "configs/gpu-werewolf-gigpo-aiw-smollm2.yaml:${MIN_AIW:-15}" > /tmp/queue.log 2>&1 &
    queue=$!
    ( export CUDA_VISIBLE_DEVICES=2; sleep 40; ippo_vs_bot ) &
    card2=$!
    ( export CUDA_VISIBLE_DEVICES=3; sleep 60; gpu_test; village_seed2_micro64 "${MIN_VILLAGE:-15}" ) &
    card3=$!
    wait "$queue" "$card2" "$card3"
    say "hold plan done"
    exit 0 ;;
  s24x1)  # s24 on one lent H200: the GPU test beside the 12p heuristic-clone recipe (s23x1's pattern: the run's
    # vLLM share lowered so that both fit the card; the job's engines split it evenly: policy, frozen opponent,
    # base model, ~7 GB each at 0.15 of an H200). Expect ~8 minutes of set-up before its training clock (the
    # base model's 64-game evaluation ~70 s, the clone of ~15k pairs of ~1,500 tokens, the first evaluation)
    # and ~70 s for each evaluation: 15 training minutes need FINISH_AFTER_S of ~26 minutes from the start
    beside_test twelve_clone
    say "hold plan done"
    exit 0 ;;
  s24x2)  # s24 on a lent 2-GPU machine (no 4-GPU one lent in s24): card 0 as s24x1 (the 12p heuristic-clone
    # recipe beside the GPU test), card 1 AIW's second training seed, its clone under bf16 autocast (the
    # village's bf16 clone matched the fp32 one's update-0 win in half the time, s23; AIW's fp32 clone took 294
    # s of s22's hold): IPPO's vs-bot run and the village's third seed wait for a 4-GPU hold
    ( export CUDA_VISIBLE_DEVICES=0; beside_test twelve_clone ) &
    card0=$!
    ( export CUDA_VISIBLE_DEVICES=1
      sleep 20  # staggered as gpu_queue.sh's PARALLEL does (the first start fills the shared model cache)
      one_run gpu-werewolf-gigpo-aiw-smollm2-seed1 configs/gpu-werewolf-gigpo-aiw-smollm2.yaml \
        seed=1 warmstart.precision=bf16 "train.max_minutes=${MIN_AIW:-15}" ) &
    aiw=$!
    wait "$card0" "$aiw"
    say "hold plan done"
    exit 0 ;;
  s25)  # what the s24 hold left open (bench/results/2026-11-28-h200x2-hold-s24.md), on a lent 4-GPU machine
    # card 0: 12p with the policy on the villagers among the heuristic seer, witch, guard and hunter (its new
    #   recipe; village_fidelity.py: villagers span 0.01 random .. 0.51 heuristic), the clone's agreement with
    #   the bot now in the summary's warm-start line
    # card 1: the village through stock main_ppo + the agent loop (agent_loop_village.sh), its evaluations and
    #   clone now in the conversation prompts it trains on (s19's run, 0.19 -> 0.11, trained on conversations
    #   and was judged on memory prompts), with the recipe's learner settings since s22
    # card 2: IPPO with eval.vs_bot (each co-trained policy against the heuristic bot), s24's card 2
    # card 3: the GPU test, then the village's third training seed at micro-batches of 64 (s24's card 3: the
    #   learner was 26 of s23's 30 s update at micro 32), for what is left of the hold
    cards twelve_villagers village_agent_loop ippo_vs_bot "gpu_test; village_seed2_micro64 ${MIN_VILLAGE:-12}"
    say "hold plan done"
    exit 0 ;;
  s28)  # answers that never change the result left out of training (bench/results/2026-11-28-h200x4-hold-s27.md:
    # 12p villagers went down in five runs of five with their speeches, 78 % of their tokens, trained), on a lent
    # 4-GPU machine
    # cards 0, 1: the 12p villagers recipe (batch.skip_actions [speak] since s27) on training seeds 0 and 1
    # card 2: the same hold's control, the speeches trained as before (batch.skip_actions=[]), with the GPU test
    #   beside it at a vLLM share of 0.15 (as s27's card 0: 3 passed there; the trainer changed since)
    # card 3: the agent-loop village with the villagers' and witch's speeches masked out (three runs with them
    #   trained, none up: s19, s26, s27)
    MIN_LOOP=${MIN_LOOP:-15} cards twelve_villagers twelve_villagers_seed1 "beside_test twelve_villagers_speech" \
      village_agent_loop_quiet
    say "hold plan done"
    exit 0 ;;
  s28x2)  # s28 on a lent 2-GPU machine: seed 0 and, beside the GPU test, seed 1
    cards twelve_villagers "beside_test twelve_villagers_seed1"
    say "hold plan done"
    exit 0 ;;
  s28x1)  # s28 on one lent H200: seed 0 beside the GPU test
    beside_test twelve_villagers
    say "hold plan done"
    exit 0 ;;
  s27)  # what the s26 hold left open (bench/results/2026-11-28-h200x4-hold-s26.md), on a lent 4-GPU machine
    # card 0: the GPU test beside 12p villagers in groups of 4 (s26's test beside the bargaining run found 34 GiB
    #   free where its vLLM asks 42; s26's 12p run held 45-61 GB of its card at a vLLM share of 0.25, and s24x2
    #   ran the 12p clone recipe beside the test this way). Groups of 4 rather than a second seed of the recipe
    #   as it is (s26's plan): two runs of it went down inside the noise, and a third says less than a change
    #   that gives each update twice the deals
    # card 1: the village through stock main_ppo + the agent loop for up to 15 training minutes (s26: 9.3
    #   minutes, 32 steps, 0.09 -> 0.09; its first run past the first update); the hold's timer now finishes it
    #   too (its watchdog takes SIGUSR1), so its budget need not be guessed short; and GAE's lambda 1.0 instead
    #   of the recipe's 0.95 (agent_loop_village.sh's LAM: at 0.95 the seat's reward, on the last of ~700 answer
    #   tokens, hardly reached its earlier decisions)
    # card 2: 12p villagers without the role rewards; card 3: 12p villagers at temperature 0.7 (why: their
    #   functions)
    # The Werewolf recipes now evaluate the base model beside the first updates (eval.base_overlap): the first
    # GPU run of it; 12p should gain ~170 s of training (s26: 10.9 training minutes in the hold)
    MIN_LOOP=${MIN_LOOP:-15} cards "beside_test twelve_villagers_g4" village_agent_loop twelve_villagers_outcome \
      twelve_villagers_t07
    say "hold plan done"
    exit 0 ;;
  s27x2)  # s27's first two cards on a lent 2-GPU machine
    MIN_LOOP=${MIN_LOOP:-15} cards "beside_test twelve_villagers_g4" village_agent_loop
    say "hold plan done"
    exit 0 ;;
  s27x1)  # s27's first card on one lent H200
    beside_test twelve_villagers_g4
    say "hold plan done"
    exit 0 ;;
  s26)  # what the s25 hold left open (bench/results/2026-11-28-h200x4-hold-s25.md), on a lent 4-GPU machine
    # card 0: 12p villagers with mini-batches of 64 (~20 optimiser steps an update; s25's 256 gave ~5, ppo_kl
    #   ~1e-3, and the clone's 0.20 did not move) and an evaluation every 10 updates (the recipe's, since s25)
    # card 1: the village through stock main_ppo + the agent loop, its micro-batch now dividing the mini-batch
    #   (s25's run died at its first update on micro 32 against 8 seats)
    # card 2: AIW GiGPO's third training seed (seeds 0 and 1: +27 and +22 over the base, GiGPO's own share +13
    #   and +6, inside the noise)
    # card 3: the bargaining recipe's third training seed (seeds 0 and 1: 0.75 and 0.80) with the GPU test
    #   beside it from second 90
    cards twelve_villagers village_agent_loop aiw_seed2 "beside_test bargaining_seed2"
    say "hold plan done"
    exit 0 ;;
  s25x2 | s26x2)  # s25 / s26 on a lent 2-GPU machine (the same cards; the recipes changed between them: s26's
    # 12p takes ~4x the optimiser steps an update, its agent-loop village a micro-batch verl accepts): card 0
    # the 12p villagers recipe beside the GPU test (s24x2's card 0 pattern: the run's vLLM share lowered to 0.15
    # so that both fit), card 1 the village through the agent loop (the two items of issue 19 without a
    # learning line; the 4-GPU plans' other cards wait)
    cards "beside_test twelve_villagers" village_agent_loop
    say "hold plan done"
    exit 0 ;;
  s25x1 | s26x1)  # on one lent H200: the 12p villagers recipe beside the GPU test (a one-GPU hold may count
    # half its held time: then a second hold, s26x1b, fits the session)
    beside_test twelve_villagers
    say "hold plan done"
    exit 0 ;;
  s26x1b)  # a second one-GPU hold: the village through the agent loop
    village_agent_loop
    say "hold plan done"
    exit 0 ;;
  *) echo "PLAN: $PLANS" >&2; exit 2 ;;
esac
wait "$queue" "$card2" "$card3"
say "hold plan done"
