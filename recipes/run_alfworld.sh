#!/usr/bin/env bash
# SERL on ALFWorld with the launch interface of the original (recipe/serl/run_alfworld.sh of
# OliverLeeXZ/SERL): the same environment variables and trailing dotted overrides, mapped onto
# `serl train recipe=<recipe> key=value ...` (our keys: serl/config/; docs/concepts/serl-modes.md).
#
#   MODEL_PATH=Qwen/Qwen2.5-7B-Instruct SAMPLING_MODE=anchor_successful_sample_immediate_feedback \
#   GROUP_SIZE=8 OUTPUT_ROOT=outputs/alfworld bash recipes/run_alfworld.sh trainer.total_training_steps=150
#
# A first argument without '=' selects the rollout engine (hf | vllm), as in the original.
# Variables that are unset keep the recipe's value (SERL_RECIPE, default: cpu for this script,
# webshop for run_webshop.sh). JUDGE_API_KEY is exported as SERL_JUDGE_API_KEY, never put on the
# command line, so it stays out of `ps`, logs and the run's config.yaml.
# SERL_DRY_RUN=1 prints the command instead of running it.
set -euo pipefail

SERL_RECIPE=${SERL_RECIPE:-cpu}

ARGS=("recipe=${SERL_RECIPE}")
if [ $# -gt 0 ] && [[ "$1" != *=* ]]; then
    ARGS+=("rollout.engine=$1")
    shift
elif [ -n "${ENGINE:-}" ]; then
    ARGS+=("rollout.engine=${ENGINE}")
fi

# opt VAR key: pass key=$VAR when VAR is set and non-empty
opt() {
    local val="${!1:-}"
    if [ -n "$val" ]; then ARGS+=("$2=$val"); fi
}
# the original's -1 ("never") is our 0
freq() {
    local val="${!1:-}"
    if [ -n "$val" ]; then
        if [ "$val" -lt 0 ]; then val=0; fi
        ARGS+=("$2=$val")
    fi
}

# The original always passes these two (defaults immediate_feedback / response).
ARGS+=("algorithm.serl.sampling_mode=${SAMPLING_MODE:-immediate_feedback}")
ARGS+=("algorithm.serl.trajectory_format=${TRAJECTORY_FORMAT:-response}")
opt MODEL_PATH model.path
opt OUTPUT_ROOT trainer.output_dir
opt GROUP_SIZE env.rollout.n
opt TRAIN_BATCH_SIZE data.train_batch_size
opt MAX_PROMPT_LENGTH data.max_prompt_length
opt MAX_RESPONSE_LENGTH data.max_response_length
opt LR actor.lr
opt PPO_MINI_BATCH_SIZE actor.ppo_mini_batch_size
opt PPO_MICRO_BATCH_SIZE_PER_GPU actor.ppo_micro_batch_size
opt INVALID_ACTION_PENALTY_COEF actor.invalid_action_penalty_coef
opt MIXING_LAMBDA algorithm.serl.mixing_lambda
opt LAMBDA_DECAY_STEPS algorithm.serl.lambda_decay_steps
opt WEIGHT_CLIP algorithm.serl.weight_clip
opt TEACHER_SYNC_INTERVAL algorithm.serl.teacher_sync_interval
opt DONT_REPROMPT_ON_SELF_SUCCESS algorithm.serl.dont_reprompt_on_self_success
opt MAX_REPROMPT_LEN algorithm.serl.max_reprompt_len
opt JUDGE_API_URL algorithm.serl.judge_api_url
opt JUDGE_MODEL algorithm.serl.judge_model
opt GPU_MEMORY_UTILIZATION rollout.gpu_memory_utilization
opt VAL_TEMPERATURE rollout.val_temperature
opt SEED seed
opt MAX_STEPS env.max_steps
opt HISTORY_LENGTH env.history_length
opt EXPERIMENT_NAME trainer.run_name
opt TOTAL_TRAINING_STEPS trainer.total_training_steps
opt VAL_BEFORE_TRAIN trainer.val_before_train
freq SAVE_FREQ trainer.save_freq
freq TEST_FREQ trainer.test_freq

if [ -n "${JUDGE_API_KEY:-}" ]; then
    export SERL_JUDGE_API_KEY="${JUDGE_API_KEY}"
fi

# Variables of the original with no counterpart here (multi-GPU/FSDP/vLLM layout, parquet files,
# legacy-mode switches, epochs): say so instead of silently dropping them.
for v in TRAIN_FILE VAL_FILE VAL_BATCH_SIZE TRUNCATION PARAM_OFFLOAD OPTIMIZER_OFFLOAD \
         INCLUDE_IMMEDIATE_FEEDBACK IMMEDIATE_FEEDBACK_ONLY_WITHOUT_SOLUTION \
         ROLLOUT_LOG_PROB_MICRO_BATCH_SIZE_PER_GPU TENSOR_MODEL_PARALLEL_SIZE ENFORCE_EAGER \
         NUM_CPUS_PER_ENV_WORKER CRITIC_WARMUP LOGGER PROJECT_NAME N_GPUS_PER_NODE NNODES TOTAL_EPOCHS; do
    if [ -n "${!v:-}" ]; then
        echo "recipes/run_*.sh: ignoring ${v} (no equivalent in serl; see serl/config/)" >&2
    fi
done

if command -v serl >/dev/null 2>&1; then
    CMD=(serl train)
else
    CMD=("${PYTHON:-python3}" -c 'import sys; from serl.cli import main; sys.exit(main())' train)
fi
CMD+=("${ARGS[@]}" "$@")

if [ -n "${SERL_DRY_RUN:-}" ]; then
    printf '%q ' "${CMD[@]}"
    echo
    exit 0
fi
echo "+ ${CMD[*]}" >&2
exec "${CMD[@]}"
