#!/usr/bin/env bash
# Trainer tokens/s per GPU against stock verl `main_ppo` (issue 19 item 6, goal >= 0.9x), in one run on one
# GPU machine (after `. bench/trainer/gpu_env.sh`): `wolfpack train -c configs/bench-vs-main-ppo-smollm2.yaml`
# and `main_ppo` + Wolfpack's agent loop (bench/trainer/verl_agent_loop_ppo.sh) on SmolLM2-135M at the same
# batch shapes (the config's header lists them and what still differs), then the table
# (bench/trainer/vs_main_ppo.py: actor update and whole step, medians over the steps after the first).
#
#   SMOL=/tmp/smol OUT=/tmp/out setsid nohup bash bench/trainer/vs_main_ppo.sh > /tmp/vs.log 2>&1 < /dev/null &
#   sleep 240; tail -8 /tmp/vs.log          # keep polling back to back: a lent machine goes back when no call runs
#
# CARDS="0 1" (default where the host has two GPUs or more): the two runs side by side, each on a card of its
# own (same card kind, same host, same time: the fairest pairing a lent machine allows); CARDS=0: one after
# the other on card 0. STEPS (8): steps of each side. Not yet run on a GPU.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
export WOLFPACK_RUN_DIR=${WOLFPACK_RUN_DIR:-/tmp/wp}
unset WOLFPACK_REDIS_URL
OUT=${OUT:-/tmp/out}
STEPS=${STEPS:-8}
CONFIG=configs/bench-vs-main-ppo-smollm2.yaml
WORK=$WOLFPACK_RUN_DIR/vs-main-ppo
mkdir -p "$OUT" "$WORK"
say() { echo "== $(date +%T) $*"; }
if [ -z "${CARDS:-}" ]; then
  n=$(nvidia-smi --query-gpu=index --format=csv,noheader 2> /dev/null | wc -l)
  if [ "$n" -ge 2 ]; then CARDS="0 1"; else CARDS=0; fi
fi
read -r -a cards <<< "$CARDS"
# SmolLM2 from the carried GGUF pieces, converted once into the model cache both sides read
[ -n "${SMOL:-}" ] && bash bench/trainer/gpu_train.sh prepare > /dev/null
MODEL=$(python3 -c "
from wolfpack_trainer.learners.cpu import resolve_model_path
print(resolve_model_path('smollm2', '$WOLFPACK_RUN_DIR/models'))" | tail -1)
say "model $MODEL; cards: ${cards[*]}; $STEPS steps a side"

ours() {
  CUDA_VISIBLE_DEVICES=${cards[0]} python3 -m wolfpack.cli.main train -c "$CONFIG" --run-dir "$WORK/wolfpack" \
    --fresh "train.updates=$STEPS" > "$OUT/vs-wolfpack.log" 2>&1
  say "wolfpack train exit $?"
}
theirs() {
  # fsdp2 as our learner (main_ppo's default actor strategy is fsdp); the rest as the config's header says
  CUDA_VISIBLE_DEVICES=${cards[$((${#cards[@]} - 1))]} WORK=$WORK/main_ppo LOG=$OUT/vs-main_ppo.log \
    MODEL=$MODEL STEPS=$STEPS ROWS=$((STEPS * 8 * 2)) BATCH=8 N=2 MICRO=8 \
    bash bench/trainer/verl_agent_loop_ppo.sh actor_rollout_ref.actor.strategy=fsdp2 > "$OUT/vs-main_ppo.out" 2>&1
  say "main_ppo exit $?"
}
if [ "${#cards[@]}" -ge 2 ]; then
  ours & a=$!
  theirs & b=$!
  wait "$a" "$b"
else
  ours
  theirs
fi
cp "$WORK/wolfpack/metrics.jsonl" "$OUT/vs-wolfpack-metrics.jsonl" 2> /dev/null || true
python3 bench/trainer/vs_main_ppo.py "$OUT/vs-main_ppo.log" "$WORK/wolfpack/metrics.jsonl" | tee "$OUT/vs-table.md"
