#!/usr/bin/env bash
# One recipe in the three GPU layouts of docs/deploy.md on a 2-GPU host (after `. bench/trainer/gpu_env.sh`),
# one after another on the same machine, then one table (bench/trainer/layouts_table.py):
#
#   SMOL=/tmp/smol OUT=/tmp/out setsid nohup bash bench/trainer/gpu_layouts.sh > /tmp/layouts.log 2>&1 &
#
#   1gpu   CUDA_VISIBLE_DEVICES=0: vLLM (0.35 of the card) and the learner share one card
#   split  vLLM alone on card 0 (0.85), the learner alone on card 1 (policy device cuda:1)
#   fsdp2  the learner's FSDP ranks on both cards as verl Ray worker groups (extra.ray_gpus=2), vLLM beside rank 0
#
# CONFIG (default the bargaining recipe), UPDATES (default 6), LAYOUTS (default "1gpu split fsdp2") and
# LIMIT (seconds per layout, default 420) change what runs. Evaluation is cut to the first and last update on
# 16 episodes with no base-model engine: the table is about speed (per-update times and tokens/s after the
# first update), not learning. Every layout's log, metrics and curves go to $OUT as it finishes.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cfg=${CONFIG:-configs/gpu-bargaining-smollm2.yaml}
updates=${UPDATES:-6}
out=${OUT:-/tmp/out}
mkdir -p "$out"
common=("train.updates=$updates" "train.max_minutes=0" "eval.every=1000" "eval.episodes=16" "eval.base=false")
for layout in ${LAYOUTS:-1gpu split fsdp2}; do
  echo "== $(date +%T) $layout"
  case $layout in
    1gpu) CUDA_VISIBLE_DEVICES=0 RUN=layout-1gpu timeout "${LIMIT:-420}" \
            bash "$here/gpu_train.sh" recipe "$cfg" "${common[@]}" ;;
    split) RUN=layout-split timeout "${LIMIT:-420}" bash "$here/gpu_train.sh" recipe "$cfg" "${common[@]}" \
             policies.0.device=cuda:1 inference.gpu_memory_utilization=0.85 ;;
    fsdp2) RUN=layout-fsdp2 timeout "${LIMIT:-420}" bash "$here/gpu_train.sh" recipe "$cfg" "${common[@]}" \
             policies.0.extra.ray_gpus=2 ;;
    *) echo "unknown layout $layout" >&2; continue ;;
  esac
  echo "$layout exit $?"
  # gpu_train.sh copies these when the run ends; a layout stopped by LIMIT still has its finished updates
  run_dir=${WOLFPACK_RUN_DIR:-/tmp/wp}/train/layout-$layout
  [ -f "$out/layout-$layout-metrics.jsonl" ] || cp "$run_dir/metrics.jsonl" "$out/layout-$layout-metrics.jsonl" 2>/dev/null
done
python3 "$here/layouts_table.py" "$out" | tee "$out/layouts-table.md"
echo "== $(date +%T) layouts done"
