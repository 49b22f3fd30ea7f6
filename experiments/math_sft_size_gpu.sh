#!/usr/bin/env bash
# The math cold start's curve of SFT size vs panel accuracy, on one CUDA GPU in one short lease.
# `serl sft` (the recipe of the shipped `smollm2-135m-math-sft`: LoRA r = 8, alpha 32, lr 5e-4,
# 8-row steps, cosine, 1 epoch) from SmolLM2-135M-Instruct on the first N rows of an expert pool
# (`serl data expert math --split gsm8k:train`), for each N in SIZES, plus one full fine-tuning on
# the largest N (lr 5e-5, the full-FT default of experiments/learning.py); all side by side, one
# process each. Then, for each of them and the shipped cold start, the greedy panel (first PANEL of
# GSM8K test, one chunk) and, as far as the time allows, the sampled panel at the training
# rollout's distribution (first AVG_PANEL of GSM8K test, temperature 1, top-p 1, SAMPLES per
# problem: avg@k, pass@k and how often a group of SAMPLES has a non-zero GRPO advantage).
#
#   bash experiments/math_sft_size_gpu.sh GGUF POOL WORKDIR BUDGET_SECONDS [OUT]
#
# GGUF: SmolLM2-135M-Instruct.Q4_1.gguf (see gpu_env.sh). POOL: the expert rows (JSONL, in the
# order the subsets are taken from). BUDGET_SECONDS caps the whole script: what has not finished by
# then is stopped and left out; the SFT runs get SFT_SECONDS of it (default half). OUT, if given,
# receives results.tar.gz (logs, SFT metrics, panels).
# Environment: SIZES (default "640 2048 4716"; empty: no SFT, the shipped cold start alone), FULL
# (1, the default: add the full fine-tuning), PANEL (default 128), AVG_PANEL (default 64), SAMPLES
# (default 4), DEVICE (default cuda), EXTRA (overrides appended to every command, e.g. a smoke
# test's sft.max_steps=2 or the turn-limit check's env.math.max_turns=8).
set -u
GGUF=$(realpath "$1"); POOL=$(realpath "$2"); W=$3; BUDGET=$4; OUT=${5:-}
deadline=$(( $(date +%s) + BUDGET ))
left() { local t=$(( deadline - $(date +%s) )); echo $(( t > 1 ? t : 1 )); }
sft_deadline=$(( $(date +%s) + ${SFT_SECONDS:-$(( BUDGET / 2 ))} ))
sft_left() { local t=$(( sft_deadline - $(date +%s) )); echo $(( t > 1 ? t : 1 )); }
source "$(dirname "$0")/gpu_env.sh"
SIZES=${SIZES-"640 2048 4716"}; FULL=${FULL:-1}; PANEL=${PANEL:-128}; SAMPLES=${SAMPLES:-4}; AVG_PANEL=${AVG_PANEL:-64}; DEVICE=${DEVICE:-cuda}
mkdir -p "$W/data"
# convert the GGUF and merge the shipped cold start once, before several processes want them
python3 -c "from serl.models.loading import resolve_model_path as r; print(r('smollm2-135m-instruct')); print(r('smollm2-135m-math-sft'))" || exit 1
BASE=(recipe=cpu_math trainer.device=$DEVICE trainer.progress=false)
SFT=("${BASE[@]}" model.path=smollm2-135m-instruct sft.epochs=1 sft.batch_size=8 sft.micro_batch_size=8
     sft.save_freq=0 trainer.logger=[jsonl] trainer.output_dir=$W/sft trainer.overwrite=true)
start=$(date +%s)
declare -A MODEL=([shipped]=smollm2-135m-math-sft)
largest=0
for n in $SIZES; do
  head -n "$n" "$POOL" > "$W/data/rows_$n.jsonl"
  [ "$n" -gt "$largest" ] && largest=$n
  # shellcheck disable=SC2086
  timeout -s TERM -k 20 "$(sft_left)" $SERL sft --data "$W/data/rows_$n.jsonl" "${SFT[@]}" model.lora.r=8 sft.lr=5e-4 \
    trainer.run_name=lora_$n ${EXTRA:-} > "$W/logs/sft_lora_$n.txt" 2>&1 &
  MODEL[lora_$n]=$W/sft/lora_$n/model
done
if [ "$FULL" = 1 ] && [ "$largest" -gt 0 ]; then
  # shellcheck disable=SC2086
  timeout -s TERM -k 20 "$(sft_left)" $SERL sft --data "$W/data/rows_$largest.jsonl" "${SFT[@]}" model.lora.r=0 sft.lr=5e-5 \
    trainer.run_name=full_$largest ${EXTRA:-} > "$W/logs/sft_full_$largest.txt" 2>&1 &
  MODEL[full_$largest]=$W/sft/full_$largest/model
fi
wait
echo "sft wall: $(( $(date +%s) - start )) s" | tee -a "$W/logs/gpu.txt"
panel() {  # panel LABEL "FLAGS" OVERRIDES...: one panel of every model whose SFT finished
  local label=$1 flags=$2; shift 2
  for m in "${!MODEL[@]}"; do
    [ "$m" = shipped ] || [ -f "${MODEL[$m]}/config.json" ] || { echo "$m: no model (SFT unfinished)" | tee -a "$W/logs/gpu.txt"; continue; }
    # shellcheck disable=SC2086
    timeout -s TERM -k 20 "$(left)" $SERL eval "${BASE[@]}" "model.path=${MODEL[$m]}" "$@" ${EXTRA:-} \
      --split gsm8k:test $flags --seed 1000 --out "$W/eval/${m}_$label" > "$W/logs/eval_${m}_$label.txt" 2>&1 &
  done
  wait
  echo "$label panels done at $(( $(date +%s) - start )) s" | tee -a "$W/logs/gpu.txt"
}
panel greedy "--num-tasks $PANEL --greedy" rollout.micro_batch_size="$PANEL"
panel avg"$SAMPLES" "--num-tasks $AVG_PANEL" rollout.val_n="$SAMPLES" rollout.val_temperature=1.0 rollout.val_top_p=1.0 \
  rollout.micro_batch_size=$(( AVG_PANEL * SAMPLES ))
for f in "$W"/eval/*/metrics.json; do
  printf '%s: ' "$(basename "$(dirname "$f")")"
  python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print({k: round(m[k], 4) for k in m if k in ('success_rate', 'tool_call_rate') or k.startswith('acc/pass')})" "$f"
done
if [ -n "$OUT" ]; then
  (cd "$W" && tar czf "$OUT/results.tar.gz" logs eval sft/*/metrics.jsonl sft/*/config.yaml sft/*/model/serl_sft.json 2>/dev/null)
fi
