#!/usr/bin/env bash
# Stock verl 0.9.1 `main_ppo` (V1 trainer, Ray, GRPO, vLLM async rollout, FSDP actor with sdpa) training on
# Werewolf through Wolfpack's agent loop: every sample plays one seat of a 6-player game on the environment
# service (the other seats are heuristic bots), which runs here as a process on a free port, and is scored in
# process by the reward specs library (wolfpack_rewards). The policy is a random-weight tiny Qwen2 with a ChatML tokenizer (no weights reach
# the GPU machine), so this checks the plumbing and measures time, not learning.
#
#   . /tmp/site/env.sh && bash bench/trainer/verl_agent_loop_ppo.sh        # on the GPU machine (1 GPU)
#   NGPU=2 STEPS=3 bash bench/trainer/verl_agent_loop_ppo.sh               # 2 GPUs, 3 steps
#
#   MODEL=/tmp/wp/models/smollm2-135m-instruct STEPS=6 bash bench/trainer/verl_agent_loop_ppo.sh   # SmolLM2
#       (converted there by a `gpu_train.sh` run); then, against a `wolfpack train` run on the same card:
#       python3 bench/trainer/vs_main_ppo.py $WORK/main_ppo.log <run_dir>/metrics.jsonl
#
# Env: WORK (scratch dir), NGPU, STEPS, ROWS (dataset rows), LOG (main_ppo log file), MODEL (a checkpoint
# directory instead of the random tiny Qwen2), BATCH (prompts per step, default 8), N (samples per prompt,
# default 2), MICRO (micro-batch per GPU, default 8).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/tmp/wolfpack-verl}
NGPU=${NGPU:-1}
STEPS=${STEPS:-3}
ROWS=${ROWS:-64}
LOG=${LOG:-$WORK/main_ppo.log}
mkdir -p "$WORK"
export PYTHONPATH=$ROOT/libs:$ROOT/services/environment:$ROOT/services/trainer:$ROOT/services/inference:$ROOT/services/rollout:$ROOT/services/curriculum:${PYTHONPATH:-}
export HYDRA_FULL_ERROR=1 PYTHONUNBUFFERED=1

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ENV_ADDR=127.0.0.1:$(free_port)
python3 -m wolfpack.cli.main serve environment --address "$ENV_ADDR" >"$WORK/environment.log" 2>&1 &
ENV_PID=$!
trap 'kill $ENV_PID 2>/dev/null || true' EXIT
python3 - "$ENV_ADDR" <<'PY'
import asyncio, sys, time
from wolfpack.rpc import check_health
async def wait(target: str) -> None:
    deadline = time.monotonic() + 60  # a cold Python start on the GPU host takes a few seconds
    while (status := await check_health(target)) != "SERVING":
        if time.monotonic() > deadline:
            sys.exit(f"{target} is not serving: {status}")
        await asyncio.sleep(0.5)
    print(f"{target} SERVING")
async def main() -> None:
    await asyncio.gather(*(wait(t) for t in sys.argv[1:]))
asyncio.run(main())
PY
export WOLFPACK_ENVIRONMENT_ADDR=$ENV_ADDR

MODEL=${MODEL:-$(python3 -c "from pathlib import Path; from wolfpack_inference.models import tiny_model; print(tiny_model(Path('$WORK'), hidden_size=256, layers=2, max_positions=4096))" | tail -1)}
BATCH=${BATCH:-8}
N=${N:-2}
MICRO=${MICRO:-8}
python3 -m wolfpack_trainer.learners.verl.agent_loop "$WORK/train.parquet" --rows "$ROWS" --game werewolf_v1 --variant 6p \
  --seats 0,1,2,3,4,5 --max-turn-tokens 48

set -x
python3 -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=False \
  data.train_files="$WORK/train.parquet" data.val_files="$WORK/train.parquet" \
  data.train_batch_size="$BATCH" data.max_prompt_length=1024 data.max_response_length=2048 data.return_raw_chat=True \
  actor_rollout_ref.model.path="$MODEL" \
  +actor_rollout_ref.model.override_config.attn_implementation=sdpa actor_rollout_ref.model.use_remove_padding=False \
  actor_rollout_ref.actor.optim.lr=1e-5 actor_rollout_ref.actor.ppo_mini_batch_size="$BATCH" \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$MICRO" actor_rollout_ref.actor.use_kl_loss=False \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.n="$N" \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.3 actor_rollout_ref.rollout.enforce_eager=True \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$MICRO" \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$ROOT/services/trainer/wolfpack_trainer/learners/verl/agent_loops.yaml" \
  actor_rollout_ref.rollout.agent.default_agent_loop=wolfpack actor_rollout_ref.rollout.agent.num_workers=1 \
  trainer.logger=console trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=-1 \
  trainer.n_gpus_per_node="$NGPU" trainer.nnodes=1 trainer.total_training_steps="$STEPS" trainer.total_epochs=1 \
  trainer.project_name=wolfpack trainer.experiment_name=werewolf_agent_loop "$@" 2>&1 | tee "$LOG"
