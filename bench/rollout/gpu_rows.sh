#!/usr/bin/env bash
# The GPU rows of bench/rollout (vLLM backend), two layouts in one run on the same card and engine settings:
#   1. every service in the bench process (environment, inference, reward, the rollout driver);
#   2. environment and reward as their own processes (`wolfpack serve`, as `wolfpack up` runs them), the
#      inference service and the driver in the bench process (the raw-engine row needs the backend object);
#   3. as 2, with the rollout driver in its own process too (`--driver-process`): the production shape.
# LAYOUTS picks which (default "1 2 3").
# Run from the repository root on the GPU machine after `. bench/trainer/gpu_env.sh`. Env: C (concurrency
# list), E (episodes per row), MAXTOK, OUT (where logs and JSON rows go).
set -u
OUT=${OUT:-/tmp/rollout-rows}
mkdir -p "$OUT"
C=${C:-64,256}
E=${E:-512}
MAXTOK=${MAXTOK:-64}
common=(--backend vllm --model random-qwen2.5-0.5b --device cuda --dtype bfloat16 --max-tokens "$MAXTOK"
  --concurrency "$C" --episodes "$E" --progress-s 20 --cache-dir /tmp/wpcache)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

LAYOUTS=${LAYOUTS:-1 2 3}
if [[ " $LAYOUTS " == *" 1 "* ]]; then
echo "== layout 1: all services in the bench process"
timeout -s ABRT 330 python3 -X faulthandler bench/rollout/bench_rollout.py "${common[@]}" \
  --json "$OUT/inprocess.json" > "$OUT/inprocess.log" 2>&1
echo "rc=$?"; grep -E "^ +[0-9]+ |Traceback|Error" "$OUT/inprocess.log" | head -20
fi

if [[ " $LAYOUTS " == *" 2 "* || " $LAYOUTS " == *" 3 "* ]]; then
python3 -m wolfpack.cli.main serve environment --address 127.0.0.1:50071 > "$OUT/environment.log" 2>&1 &
env_pid=$!
python3 -m wolfpack.cli.main serve reward --address 127.0.0.1:50072 > "$OUT/reward.log" 2>&1 &
reward_pid=$!
sleep 8
for layout in 2 3; do
  [[ " $LAYOUTS " == *" $layout "* ]] || continue
  extra=()
  [[ $layout == 3 ]] && extra=(--driver-process)
  echo "== layout $layout: environment and reward in their own processes${extra:+, the driver too}"
  timeout -s ABRT 330 python3 -X faulthandler bench/rollout/bench_rollout.py "${common[@]}" "${extra[@]}" \
    --environment 127.0.0.1:50071 --reward 127.0.0.1:50072 --json "$OUT/layout$layout.json" \
    > "$OUT/layout$layout.log" 2>&1
  echo "rc=$?"; grep -E "^ +[0-9]+ |Traceback|Error" "$OUT/layout$layout.log" | head -20
done
kill "$env_pid" "$reward_pid" 2>/dev/null
wait
fi
