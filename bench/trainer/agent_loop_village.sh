#!/usr/bin/env bash
# 6-player Werewolf village PPO through the verl agent loop (issue 19 item 4): stock verl 0.9.1 `main_ppo`
# (GAE with verl's critic) trains SmolLM2-135M on the VILLAGE seats (villager, seer, witch) against the
# heuristic wolves through Wolfpack's agent loop, for a wall-clock budget, and the result is judged exactly
# as the `wolfpack train` recipe judges its policy: the same held-out seeds, opponents, prompts and
# references, printed as the trainer's `reference:` lines and `learning:` line.
#
# FIRST GPU RUNS (2026-11-27, 4 x H200, bench/results/2026-11-27-h200x4-hold-s18.md): the clone's start
# evaluation ran (64 games: clone 0.20, base 0.00, heuristic 0.41); main_ppo first died loading verl's critic
# (flash_attention_2 hard-coded; fixed below with a Ray worker setup hook); with START=base it then trained one
# GAE step with verl's critic (set-up 5 min, the step ~90 s, checkpoint saved, the watchdog stopped it); the
# final evaluation's stack exited (1): its `wolfpack up` inherited the WOLFPACK_ENVIRONMENT_ADDR this script
# exports for main_ppo and bound that taken address (reproduced on CPU; the trainer's stack no longer passes
# service addresses on, and the script unsets it).
# FIRST WHOLE RUN (2026-11-27, H200, bench/results/2026-11-27-h200x4-hold-s19.md; START=clone, MINUTES=10): every
# fix above held; set-up 4.9 min, then 17 GAE steps of ~34 s (16 games, ~46k tokens a step; actor update 16-23 s,
# critic 3-4 s, generation 4-8 s); the critic learned (explained variance -2.0 -> 0.78), the village did not:
# learning: win_rate 0.19 -> 0.11 on 64 held-out games (CIs overlap; base 0.00, heuristic 0.41). 25.4 minutes
# from start to the final evaluation's line, 10.6 of them training.
#
#   . bench/trainer/gpu_env.sh        # on a fresh machine staged by stage.sh; SMOL as for gpu_train.sh
#   SMOL=/tmp/smol OUT=/tmp/out setsid nohup bash bench/trainer/agent_loop_village.sh > /tmp/village.log 2>&1 &
#   sleep 500; tail -5 /tmp/village.log          # keep polling: a lent machine goes back when no call runs
#   DRY_RUN=1 bash bench/trainer/agent_loop_village.sh    # any host: the plan, dataset and main_ppo command
#
# What it does, in order:
#  1. START model. START=clone (default): the recipe's warm start, the clone of the heuristic village that
#     `wolfpack train -c $CONFIG` builds (warmstart.clone_bot, cached in $WOLFPACK_RUN_DIR/models under the
#     key of the config's warmstart section): built by step 2's run if no earlier run of the recipe on this
#     host cached it (~5 min on an H100, 283 s measured), else reused as is. START=base: the base model
#     (the config's model, SmolLM2 as converted by gpu_train.sh, or MODEL=<dir>), no warm start.
#  2. Evaluation of the start: `wolfpack train -c $CONFIG train.updates=0` (an evaluation-only run: the
#     update-0 evaluation on eval.episodes held-out seeds, with START=clone also the base model, eval.base,
#     and the in-process references constant/random/heuristic), run dir $WORK/eval-start.
#  3. Dataset: one row per (training seed, seat dealt a village role) from seed 0 (held-out seeds start at
#     eval.seed_offset), the config's reward spec (werewolf_role@1), opponents (game.bot), answer cap
#     (rollout.max_tokens) and no system prompt (the recipe's driver sends none; the chat template adds its
#     default, as for the recipe's prompts):
#     `python -m wolfpack_trainer.learners.verl.agent_loop --roles villager,seer,witch ...`. The rows' verl
#     prompt is then empty, which verl's over-long filter cannot template (it dropped every row when tried on
#     CPU): data.filter_overlong_prompts=False (the agent loop builds the prompt from the observation).
#  4. Training: `main_ppo`, adv_estimator=gae, critic on the start model, n=1, the recipe's PPO settings
#     from the config (lr, critic lr, PPO epochs, micro-batch and fused kernels of its policy: 3e-5, 5e-5, 2,
#     32 and on since s22, when the recipe's own run went 0.13 -> 0.32; the s19 run of this script used
#     1e-5 and micro-batch 8, the recipe's settings then; clip 0.2, value clip 0.2, entropy 0.001,
#     token-mean, gamma 1, temperature 1; no KL, as the recipe; GAE lambda 1.0 where the recipe has 0.95
#     (since s27, LAM below: one sequence a seat, its reward on the last token); verl's default gradient
#     checkpointing for actor and critic), vLLM async
#     rollout at gpu_memory_utilization 0.35. WALL-CLOCK BOUND: verl counts steps, not minutes, so the step
#     budget is left large and a watchdog (bench/trainer/stop_after_checkpoint.sh) ends the run: the clock
#     starts when verl's "Training Progress" bar (or its first step line)
#     appears (after set-up); once MINUTES have passed it waits for the next checkpoint verl completes
#     (save_freq=SAVE_FREQ, default every step; verl writes latest_checkpointed_iteration.txt only after
#     the whole save) and then stops main_ppo (SIGTERM to its process group, then `ray stop --force` when
#     this script started the Ray cluster). So training lasts at least MINUTES, plus at most one step.
#     Checkpoints: actor.checkpoint.save_contents=[hf_model] (only the HF model: verl's FSDP checkpoint
#     manager writes <ckpt>/global_step_N/actor/huggingface/ with config, tokenizer and safetensors; no
#     resumable shards), critic save_contents=[extra] (no critic weights), at most 2 actor checkpoints kept.
#  5. Evaluation of the final model: `wolfpack train -c $CONFIG train.updates=0 warmstart=null
#     policies.0.model=<ckpt>/global_step_N/actor/huggingface`, run dir $WORK/eval-final.
#  6. `python -m wolfpack_trainer.learning -c $CONFIG --start $WORK/eval-start --final $WORK/eval-final`:
#     the reference lines and `learning: win_rate <start> -> <final> on <n> held-out episodes (95% CI ..)`.
#  7. $OUT (when set): the logs of every step, both evaluation runs' metrics.jsonl/csv/curves.png and kept
#     episodes (<run>-eval.tar.gz), main_ppo's
#     curves (bench/trainer/main_ppo_curves.py: per-step CSV and PNG against the sum of timing_s/step, which
#     holds verl's time split: timing_s/gen, /update_actor, /update_critic, /values, /old_log_prob, ...),
#     the dataset summary and learning.txt.
#
# Env: SMOL (the SmolLM2 GGUF pieces, joined by `gpu_train.sh prepare`; not needed where an earlier run
# converted SmolLM2 into $WOLFPACK_RUN_DIR/models), CONFIG (default configs/gpu-werewolf-6p-ppo-heuristic-clone-smollm2.yaml), START (clone|base),
# MODEL (START=base only: a model dir instead of the config's), MINUTES (15), PROMPT (conversation|observation,
# the evaluations' and the clone's rollout.prompt, see PROMPTS below), WORK
# ($WOLFPACK_RUN_DIR/agent-loop-village), OUT, EVAL (extra key=value overrides for both evaluations, e.g.
# "eval.episodes=64"; the learning line is read with the same), BATCH (games per step, 32), MINI (PPO
# mini-batch in games, 8), LAM (GAE's lambda, 1.0; "recipe" for the config's, see below), SKIP_ACTIONS
# (answers masked out of training, see below), MICRO (micro-batch per GPU), EPOCHS, LR, CRITIC_LR, FUSED (True|False) (these
# four and FUSED default to the config's policy: micro_batch_size, ppo_epochs, lr, extra.critic_lr, extra.fused_kernels),
# RESPONSE_LEN (a seat's whole conversation after the first prompt, tokens, 2048: past it the seat is on
# autopilot; measured on CPU with SmolLM2's tokenizer, the heuristic village's answers in 40 games (160
# seats): median 577, p90 899, max 1401 tokens, at most 9 decisions a seat, so 64-token answers stay under
# ~2000), PROMPT_LEN (1024; the first observation is 410-474 tokens), ROWS (dataset rows, BATCH*400), SAVE_FREQ (1), GPU_UTIL (0.35), WORKERS
# (agent-loop workers, 4), SKIP_START_EVAL=1 (reuse $WORK/eval-start from an earlier call), DRY_RUN=1.
# Extra arguments are passed to main_ppo as Hydra overrides.
#
# Time on a lent machine (30 minutes held at most; estimates, none measured for this script): a fresh
# machine has no cached clone, so step 2 builds it (283 s on an H100 for this config, fp32) inside a
# `wolfpack train` start-up (stack + vLLM) and then plays 2 x eval.episodes games (base, clone); main_ppo's
# set-up (Ray, vLLM, FSDP actor + critic) ~1-2 min; MINUTES; the final evaluation another stack start-up +
# eval.episodes games. With MINUTES=15 and 128 evaluation games that is close to 30 minutes: run it in the
# background as above and poll; EVAL=eval.episodes=64 (wider intervals) saves a few minutes; SKIP_TRAIN=1
# (steps 1-2 only) then SKIP_START_EVAL=1 (the rest) splits it over two calls on the same warm machine.
# Untested (no GPU in the session that wrote it): the whole main_ppo part with adv_estimator=gae (only GRPO
# ran through the agent loop, 2026-11-26), the critic keys (critic.model.*, critic.optim.lr,
# critic.checkpoint.save_contents=[extra]), actor save_contents=[hf_model] without 'model', the watchdog's
# stop (Ray workers and vLLM freeing the card before the final evaluation), and evaluating a verl-saved
# bf16 HF directory through `wolfpack train` on vLLM. Tested on CPU: the dataset rows by role
# (services/trainer/tests/test_agent_loop.py), the two evaluation-only runs and their learning line with the
# tiny model (services/trainer/tests/test_learning_two_runs.py), this script's DRY_RUN (which composes
# verl's config from the command's overrides, runs verl's validate_config and loads the dataset through
# verl's RLHFDataset: bench/trainer/main_ppo_config_check.py) and `bash -n`.
# PROMPTS (since s24): the agent loop trains on one continuous conversation per seat (the first observation,
# then each decision's new lines, wolfpack_rollout.prompts.new_lines), so both evaluations and the clone now
# use the rollout driver's `conversation` mode (PROMPT, default conversation: the same user messages) instead
# of the recipe's memory prompts (rollout.prompt: observation), which the s19 run (0.19 -> 0.11) used while
# training on conversations: there, the clone learned on one prompt format, main_ppo trained it on another and
# the evaluation read the first. PROMPT=observation reproduces that. What follows describes that mismatch: A seat's first decision has the same prompt in both (one
# user message, the whole observation, no system message); from the second on, the agent loop's prompt is
# the conversation so far, the evaluation's one message (opening context + what is new). A policy that
# learns in the conversation format may not carry all of it to the evaluation's prompts. verl puts the seat's whole reward (outcome + per-turn role
# rewards) on its last token, so GAE sees the role rewards at the end, not at their turns.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
export WOLFPACK_RUN_DIR=${WOLFPACK_RUN_DIR:-/tmp/wp}
unset WOLFPACK_REDIS_URL
CONFIG=${CONFIG:-configs/gpu-werewolf-6p-ppo-heuristic-clone-smollm2.yaml}
START=${START:-clone}
MINUTES=${MINUTES:-15}
WORK=${WORK:-$WOLFPACK_RUN_DIR/agent-loop-village}
BATCH=${BATCH:-32}
MINI=${MINI:-8}
RESPONSE_LEN=${RESPONSE_LEN:-2048}
PROMPT_LEN=${PROMPT_LEN:-1024}
ROWS=${ROWS:-$((BATCH * 400))}
SAVE_FREQ=${SAVE_FREQ:-1}
GPU_UTIL=${GPU_UTIL:-0.35}
WORKERS=${WORKERS:-4}
read -r -a EVAL_OVR <<< "${EVAL:-}"
# The evaluations' (and so the clone's) prompts: the agent loop trains on one conversation per seat, so by
# default they are conversations too (PROMPT=observation: the memory prompts of the s19 run)
EVAL_OVR+=("rollout.prompt=${PROMPT:-conversation}")
CKPT=$WORK/ckpt
LOGS=$WORK/logs
[ -n "${DRY_RUN:-}" ] && WORK=${WORK}-dry-run && CKPT=$WORK/ckpt && LOGS=$WORK/logs
mkdir -p "$WORK" "$LOGS"
[ -n "${OUT:-}" ] && mkdir -p "$OUT"
export PYTHONPATH=$ROOT/libs:$ROOT/services/environment:$ROOT/services/reward:$ROOT/services/trainer:$ROOT/services/inference:$ROOT/services/rollout:$ROOT/services/curriculum:${PYTHONPATH:-}
export HYDRA_FULL_ERROR=1 PYTHONUNBUFFERED=1
PY=${PY:-python3}
say() { echo "== $(date +%T) $*"; }
ENV_PID="" PPO_PID=""
finish() {  # on every exit, a failed one too: stop what this script started, then copy what comes back
  local rc=$?
  [ -n "$PPO_PID" ] && { kill -TERM -- "-$PPO_PID" 2> /dev/null || true; }
  [ -n "$ENV_PID" ] && { kill "$ENV_PID" 2> /dev/null || true; }
  [ -n "${DRY_RUN:-}" ] && return
  [ -s "$LOGS/main_ppo.log" ] && { "$PY" bench/trainer/main_ppo_curves.py "$LOGS/main_ppo.log" "$LOGS/main_ppo-curves" || true; }
  if [ -n "${OUT:-}" ]; then
    cp "$LOGS"/* "$OUT/" 2> /dev/null || true
    for run in eval-start eval-final; do
      for f in metrics.jsonl metrics.csv curves.png; do
        cp "$WORK/$run/$f" "$OUT/$run-$f" 2> /dev/null || true
      done
      cp "$WORK/$run/stack/up.log" "$OUT/$run-up.log" 2> /dev/null || true
      # the few episodes each evaluation keeps (binary Trajectory files, as gpu_train.sh returns them): s26's
      # final evaluation took 3x the start's time an episode and its reward fell, and nothing came back to read
      tar -czf "$OUT/$run-eval.tar.gz" -C "$WORK/$run" eval 2> /dev/null || true
    done
    say "exit $rc; logs, metrics, curves and evaluation episodes in $OUT"
  fi
}
trap finish EXIT

# SMOL (as gpu_train.sh): the SmolLM2 GGUF pieces, joined where the model resolver converts them once
[ -n "${SMOL:-}" ] && [ -z "${DRY_RUN:-}" ] && bash "$ROOT/bench/trainer/gpu_train.sh" prepare

MODEL_SET=${MODEL:+1}
case "$START" in
  clone) START_OVR=() ;;
  base) START_OVR=(warmstart=null ${MODEL_SET:+"policies.0.model=$MODEL"}) ;;
  *) echo "START must be clone or base, not $START" >&2; exit 2 ;;
esac

evaluate() {  # evaluate RUN_NAME OVERRIDES...: an evaluation-only `wolfpack train` run
  local name=$1; shift
  "$PY" -m wolfpack.cli.main train -c "$CONFIG" --run-dir "$WORK/$name" --fresh train.updates=0 "$@" \
    "${EVAL_OVR[@]}" 2>&1 | tee "$LOGS/$name.log"
}

# 1 + 2: the start model (built or cached by the trainer's warm start) and its evaluation with the base.
if [ -z "${DRY_RUN:-}" ] && [ -z "${SKIP_START_EVAL:-}" ]; then
  say "evaluating the start model (START=$START; with the base model and the references) on the held-out seeds"
  evaluate eval-start "${START_OVR[@]}"
fi

# The recipe's settings, read from the config (one place: a changed recipe changes this run too), and the
# start model: the trainer's own clone directory (warmstart.clone_dir of the resolved base model in the
# job's model cache, $WOLFPACK_RUN_DIR/models: the directory the evaluation above built or found).
PLAN=$("$PY" - "$CONFIG" "$START" "${DRY_RUN:-}" "${START_OVR[@]}" "${EVAL_OVR[@]}" <<'PY'
import os, shlex, sys
from pathlib import Path
from wolfpack_trainer.config import load_config
from wolfpack_trainer.learners.cpu import resolve_model_path
from wolfpack_trainer.warmstart import clone_dir, warmstart_config
config, start, dry, *overrides = sys.argv[1:]
cfg = load_config(config, overrides)
(p,) = cfg.policies
if not p.roles:
    sys.exit(f"{config}: the policy trains seats {p.seats}, not roles: this script trains the village roles")
algo, loss = cfg.algo_config(), cfg.loss_config()
if algo.estimator != "gae":
    sys.exit(f"{config}: estimator {algo.estimator}: this script runs verl's GAE with a critic")
cache = Path(os.environ["WOLFPACK_RUN_DIR"]) / "models"
# a dry run on a host without the converted model: the path the resolver gives SmolLM2 there
base = str(cache / "smollm2-135m-instruct") if dry and p.model == "smollm2" else resolve_model_path(p.model, str(cache))
w = warmstart_config(cfg)
start_model = str(clone_dir(base, w, cache)) if start == "clone" and w else base
out = {
    "ROLES": ",".join(p.roles), "GAME": cfg.game.id, "VARIANT": cfg.game.variant, "BOT": cfg.game.bot,
    "REWARD_SPEC": cfg.rollout.reward_spec, "MAX_TURN_TOKENS": cfg.rollout.max_tokens,
    "TEMPERATURE": cfg.rollout.temperature, "GAMMA": algo.gamma, "CFG_LAM": algo.lam, "CLIP": loss.clip_ratio,
    "ENTROPY": loss.entropy_coeff, "LOSS_AGG": loss.loss_agg_mode, "CLIP_VALUE": loss.cliprange_value,
    "EVAL_EPISODES": cfg.eval.episodes,
    "EVAL_SEED0": cfg.eval.seed_offset, "START_MODEL": start_model, "BASE_MODEL": base,
    "WARM": f"{w.bot} bot, {w.episodes} games, {w.steps} steps, lr {w.lr}" if w and start == "clone" else "none",
    # the recipe's learner: main_ppo trains with the same step size, epochs, micro-batches and kernels
    "CFG_LR": p.lr, "CFG_CRITIC_LR": p.extra.get("critic_lr", 5.0e-5), "CFG_EPOCHS": p.ppo_epochs,
    "CFG_MICRO": p.micro_batch_size, "CFG_FUSED": bool(p.extra.get("fused_kernels", False)),
    "CFG_SKIP": ",".join(cfg.batch_config().skip_actions),
}
for k, v in out.items():
    print(f"{k}={shlex.quote(str(v))}")
PY
)
eval "$PLAN"
LR=${LR:-$CFG_LR}
CRITIC_LR=${CRITIC_LR:-$CFG_CRITIC_LR}
EPOCHS=${EPOCHS:-$CFG_EPOCHS}
MICRO=${MICRO:-$CFG_MICRO}
# GAE's lambda: 1.0 here, not the recipe's (0.95). Why: the recipe's lambda discounts within one turn's answer
# (its turn samples carry the seat's return-to-go on every answer's last token, so the outcome reaches every
# decision whole), while the agent loop trains one sequence a seat whose only reward, the seat's whole return,
# sits on the last of its ~600-900 answer tokens (verl's GAE skips the observation tokens between answers): at
# 0.95 the outcome's weight at a token k answer tokens before the end is 0.95^k (0.006 at k=100), so every
# decision but the last few learnt only from the critic's differences, a critic trained on targets made of its
# own values. s19 and s26 (0.19 -> 0.11, 0.09 -> 0.09) ran at 0.95; verl's own default is 1.0. s27 ran 1.0 (36
# steps, 10.9 minutes, bench/results/2026-11-28-h200x4-hold-s27.md): 0.16 -> 0.03, no better, so the credit's
# reach was not what held it back (the conversation's speeches, most of its answer tokens, were the next reading).
# LAM=<x> sets it, LAM=recipe takes the recipe's.
LAM=${LAM:-1.0}
[ "$LAM" = recipe ] && LAM=$CFG_LAM
# The answers masked out of training (kind or role:kind, as batch.skip_actions; default the recipe's): e.g.
# SKIP_ACTIONS=villager:speak,witch:speak, the 6p speeches that never change the result
# (bench/trainer/village_fidelity.py --variant 6p --by-kind ROLE; the seer's claims do). SKIP_ACTIONS= : none.
SKIP_ACTIONS=${SKIP_ACTIONS-$CFG_SKIP}
if [ $((MINI % MICRO)) -ne 0 ]; then  # verl's engine splits each mini-batch (MINI seats) into micro-batches and
  # asserts at the first update that they divide it (s25's run died there, micro 32 > mini 8): the largest
  # divisor of MINI not above the recipe's micro-batch
  m=$MICRO; while [ $((MINI % m)) -ne 0 ]; do m=$((m - 1)); done
  say "micro-batch $MICRO does not divide the PPO mini-batch of $MINI seats: $m"
  MICRO=$m
fi
FUSED=${FUSED:-$CFG_FUSED}
FUSED_OVR=()  # verl's fused-kernel forward for the actor (log-probs without full-vocabulary logits), as the recipe's learner
[ "$FUSED" = True ] && FUSED_OVR=(actor_rollout_ref.model.use_fused_kernels=True
  actor_rollout_ref.model.fused_kernel_options.impl_backend=torch)
say "plan: $CONFIG, start $START: $START_MODEL (base $BASE_MODEL; warm start: $WARM); $MINUTES training minutes"
say "prompts of both evaluations and the clone: rollout.prompt=${PROMPT:-conversation} (the agent loop trains on conversations)"
say "village roles $ROLES vs $BOT wolves on $GAME/$VARIANT, reward $REWARD_SPEC, eval $EVAL_EPISODES held-out seeds from $EVAL_SEED0"
say "learner: lr $LR, critic lr $CRITIC_LR, $EPOCHS PPO epochs, micro-batch $MICRO, fused kernels $FUSED, GAE gamma $GAMMA lambda $LAM (the recipe's lambda: $CFG_LAM)"
say "answers masked out of training: ${SKIP_ACTIONS:-none}"
evaluate() {  # evaluate RUN_NAME OVERRIDES...: an evaluation-only `wolfpack train` run
  local name=$1; shift
  "$PY" -m wolfpack.cli.main train -c "$CONFIG" --run-dir "$WORK/$name" --fresh train.updates=0 "$@" \
    "${EVAL_OVR[@]}" 2>&1 | tee "$LOGS/$name.log"
}

if [ -z "${DRY_RUN:-}" ] && [ ! -f "$START_MODEL/config.json" ]; then
  echo "the start model $START_MODEL is missing (START=$START; the start evaluation should have built it)" >&2
  exit 1
fi
[ -n "${SKIP_TRAIN:-}" ] && { say "SKIP_TRAIN: stop after the start evaluation"; exit 0; }

# 3: the dataset.
"$PY" -m wolfpack_trainer.learners.verl.agent_loop "$WORK/train.parquet" --rows "$ROWS" --game "$GAME" \
  --variant "$VARIANT" --roles "$ROLES" --default-bot "$BOT" --reward-spec "$REWARD_SPEC" \
  --max-turn-tokens "$MAX_TURN_TOKENS" --seed0 0 --system-prompt "" --skip-actions "$SKIP_ACTIONS" \
  | tee "$LOGS/dataset.log"

# 4: main_ppo.
CMD=("$PY" -m verl.trainer.main_ppo
  algorithm.adv_estimator=gae "algorithm.gamma=$GAMMA" "algorithm.lam=$LAM" algorithm.use_kl_in_reward=False
  data.train_files="$WORK/train.parquet" data.val_files="$WORK/train.parquet"
  data.train_batch_size="$BATCH" data.max_prompt_length="$PROMPT_LEN" data.max_response_length="$RESPONSE_LEN"
  data.return_raw_chat=True data.filter_overlong_prompts=False
  actor_rollout_ref.model.path="$START_MODEL"
  +actor_rollout_ref.model.override_config.attn_implementation=sdpa actor_rollout_ref.model.use_remove_padding=False
  actor_rollout_ref.actor.optim.lr="$LR" actor_rollout_ref.actor.ppo_mini_batch_size="$MINI"
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$MICRO" actor_rollout_ref.actor.ppo_epochs="$EPOCHS"
  actor_rollout_ref.actor.clip_ratio="$CLIP" actor_rollout_ref.actor.entropy_coeff="$ENTROPY"
  actor_rollout_ref.actor.loss_agg_mode="$LOSS_AGG" actor_rollout_ref.actor.use_kl_loss=False
  "actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]"
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.n=1
  actor_rollout_ref.rollout.temperature="$TEMPERATURE"
  actor_rollout_ref.rollout.gpu_memory_utilization="$GPU_UTIL" actor_rollout_ref.rollout.enforce_eager=True
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$MICRO"
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$ROOT/services/trainer/wolfpack_trainer/learners/verl/agent_loops.yaml"
  actor_rollout_ref.rollout.agent.default_agent_loop=wolfpack actor_rollout_ref.rollout.agent.num_workers="$WORKERS"
  critic.model.path="$START_MODEL" critic.optim.lr="$CRITIC_LR" critic.ppo_micro_batch_size_per_gpu="$MICRO"
  +critic.model.override_config.attn_implementation=sdpa critic.model.use_remove_padding=False
  critic.cliprange_value="$CLIP_VALUE" "critic.checkpoint.save_contents=[extra]"
  trainer.logger=console trainer.val_before_train=False trainer.test_freq=-1 trainer.critic_warmup=0
  trainer.save_freq="$SAVE_FREQ" trainer.max_actor_ckpt_to_keep=2 trainer.max_critic_ckpt_to_keep=1
  trainer.default_local_dir="$CKPT" trainer.resume_mode=disable
  trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.total_epochs=1
  trainer.project_name=wolfpack trainer.experiment_name=agent_loop_village
  # verl 0.9.1 loads the critic with flash_attention_2 hard-coded (no flash-attn wheel on these hosts: the first
  # GPU run died there); every Ray worker first runs the trainer's own sdpa loader patch, as `wolfpack train` does
  +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=wolfpack_trainer.learners.verl.learner.use_sdpa_value_model
  "${FUSED_OVR[@]}" "$@")
if [ -n "${DRY_RUN:-}" ]; then
  say "DRY_RUN: would evaluate the start: wolfpack train -c $CONFIG --run-dir $WORK/eval-start --fresh train.updates=0 ${START_OVR[*]} ${EVAL_OVR[*]}"
  say "DRY_RUN: would train for $MINUTES minutes (then stop after the next checkpoint):"
  printf '%q ' "${CMD[@]}"; echo
  say "DRY_RUN: verl's config composed from these overrides, validated, and the dataset through RLHFDataset:"
  "$PY" bench/trainer/main_ppo_config_check.py "${CMD[@]:3}"
  say "DRY_RUN: would evaluate the final model: wolfpack train -c $CONFIG --run-dir $WORK/eval-final --fresh train.updates=0 warmstart=null policies.0.model=$CKPT/global_step_<N>/actor/huggingface ${EVAL_OVR[*]}"
  say "DRY_RUN: would print: python -m wolfpack_trainer.learning -c $CONFIG --start $WORK/eval-start --final $WORK/eval-final ${EVAL_OVR[*]}"
  exit 0
fi

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ENV_ADDR=127.0.0.1:$(free_port)
"$PY" -m wolfpack.cli.main serve environment --address "$ENV_ADDR" > "$LOGS/environment.log" 2>&1 &
ENV_PID=$!
RAY_OURS=""
ray_cli() { if command -v ray > /dev/null; then ray "$@"; else "$PY" -m ray.scripts.scripts "$@"; fi; }
ray_cli status > /dev/null 2>&1 || RAY_OURS=1  # no Ray before us: main_ppo starts one, which we stop after
"$PY" - "$ENV_ADDR" <<'PY'
import asyncio, sys, time
from wolfpack.rpc import check_health
async def wait(target: str) -> None:
    deadline = time.monotonic() + 60
    while (status := await check_health(target)) != "SERVING":
        if time.monotonic() > deadline:
            sys.exit(f"{target} is not serving: {status}")
        await asyncio.sleep(0.5)
asyncio.run(wait(sys.argv[1]))
PY
export WOLFPACK_ENVIRONMENT_ADDR=$ENV_ADDR
rm -rf "$CKPT"
say "main_ppo (log $LOGS/main_ppo.log)"
printf '%q ' "${CMD[@]}" > "$LOGS/main_ppo.cmd"
setsid "${CMD[@]}" > "$LOGS/main_ppo.log" 2>&1 &
PPO_PID=$!
tracker=$CKPT/latest_checkpointed_iteration.txt
saved() { cat "$tracker" 2> /dev/null || echo 0; }
t0=$(date +%s)
bash "$ROOT/bench/trainer/stop_after_checkpoint.sh" "$PPO_PID" "$LOGS/main_ppo.log" "$tracker" "$((MINUTES * 60))" \
  | tee "$LOGS/watchdog.log"
wait "$PPO_PID" 2> /dev/null || true
PPO_PID=""
# main_ppo's environment server and its address go before the final evaluation: that run starts a stack of
# its own, which (before the trainer stopped passing these on) bound the exported, taken address and exited
kill "$ENV_PID" 2> /dev/null || true
ENV_PID=""
unset WOLFPACK_ENVIRONMENT_ADDR
[ -n "$RAY_OURS" ] && { ray_cli stop --force > "$LOGS/ray_stop.log" 2>&1 || true; }
trained_s=$(( $(date +%s) - t0 ))  # main_ppo from its start (set-up included); watchdog.log has the training time
STEP=$(saved)
FINAL=$CKPT/global_step_$STEP/actor/huggingface
if [ "$STEP" = 0 ] || ! ls "$FINAL"/*.safetensors > /dev/null 2>&1; then
  echo "no saved actor model (latest checkpoint step $STEP, $FINAL): see $LOGS/main_ppo.log" >&2
  tail -30 "$LOGS/main_ppo.log" >&2
  exit 1
fi
say "final model: $FINAL (step $STEP; main_ppo ran $trained_s s with its set-up, the training time is in watchdog.log)"
# vLLM and the FSDP workers must have let go of the card before the evaluation's stack (its vLLM sizes itself
# from the free memory). Judged by the card's used memory, not its process list: in a container nvidia-smi may
# list no processes while their memory is still held. Only this run's card: on a host shared with other
# recipes (one card each) the others never let go.
card=(${CUDA_VISIBLE_DEVICES:+-i "$CUDA_VISIBLE_DEVICES"})
for _ in $(seq 90); do
  used=$(nvidia-smi "${card[@]}" --query-gpu=memory.used --format=csv,noheader,nounits 2> /dev/null | head -1)
  [ -z "$used" ] || [ "$used" -lt 2048 ] && break
  sleep 2
done
say "card memory before the final evaluation: $(nvidia-smi "${card[@]}" --query-gpu=memory.used --format=csv,noheader 2> /dev/null)"

# 5 + 6: the final model's evaluation and the learning line.
evaluate eval-final warmstart=null "policies.0.model=$FINAL"
START_IS_BASE=()
[ "$START" = base ] && START_IS_BASE=(--start-is-base)
{
  echo "agent-loop village: start $START ($START_MODEL), final $FINAL after $STEP steps; main_ppo ran $trained_s s (set-up included)"
  tail -2 "$LOGS/watchdog.log"
  "$PY" -m wolfpack_trainer.learning -c "$CONFIG" --start "$WORK/eval-start" --final "$WORK/eval-final" \
    "${START_IS_BASE[@]}" "${EVAL_OVR[@]}"
} | tee "$LOGS/learning.txt"

say "done"  # 7: the EXIT trap (finish) copies what comes back
