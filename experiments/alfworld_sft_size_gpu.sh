#!/usr/bin/env bash
# The ALFWorld cold start's curve of expert games vs panel wins, on one CUDA GPU in one short lease.
# `serl sft` with the recipe of the shipped `smollm2-135m-alfworld-sft` (recipe cpu_learn, LoRA r = 8,
# lr 5e-4, 4-row steps, 3 warm-up steps, cosine, 1 epoch) from SmolLM2-135M-Instruct on the expert
# rows of the first N games of a pool, for each N in GAMES, all side by side, one process each.
# Then, for each of them and the shipped cold start, the panel: every game of the recipe's two task
# types on valid_seen and valid_unseen, greedy, and as far as the time allows sampled at the
# recipe's rollout.val_temperature (0.4, seed 1000), with env.max_steps=MAX_STEPS.
#
#   bash experiments/alfworld_sft_size_gpu.sh GGUF POOL DATA WORKDIR BUDGET_SECONDS [OUT]
#
# GGUF: SmolLM2-135M-Instruct.Q4_1.gguf (see gpu_env.sh). POOL: the expert rows, e.g.
#   serl data expert alfworld "env.task_types=[look_at_obj_in_light,pick_and_place_simple]" recipe=cpu_learn \
#       --split train --num-tasks -1 --data-dir DIR_WITH_THE_WHOLE_TRAIN_SPLIT --out pool.jsonl
# (its games come in the seeded order of --seed, so "the first N games" is a seeded sample).
# DATA: an ALFWorld data folder holding json_2.1.1/valid_seen and valid_unseen. BUDGET_SECONDS caps
# the whole script: what has not finished by then is stopped and left out; the SFT runs get
# SFT_SECONDS of it (default half). OUT, if given, receives results.tar.gz (logs, SFT metrics, panels)
# and adapters/<run>/ (each finished SFT's LoRA adapter).
# Environment: GAMES (default "60 200 all"; empty: no SFT, the shipped cold start alone), MAX_STEPS
# (default 8, the recipe's), DEVICE (default cuda), WORKERS (env worker processes per panel, default
# 4), PANEL_TASKS (games per split, default -1: all), DECODINGS (default "greedy sampled"), EXTRA
# (overrides appended to every command, e.g. a smoke test's sft.max_steps=2).
# experiments/alfworld_sft_size_report.py makes the table. On one H200 the all-games run (1,099 steps)
# took 0.45 s per step beside two other runs and did not finish in SFT_SECONDS=250; alone, try
# GAMES=all DECODINGS=greedy SFT_SECONDS=470 with a BUDGET of 580 (not measured yet).
set -u
GGUF=$(realpath "$1"); POOL=$(realpath "$2"); DATA=$(realpath "$3"); W=$4; BUDGET=$5; OUT=${6:-}
deadline=$(( $(date +%s) + BUDGET ))
left() { local t=$(( deadline - $(date +%s) )); echo $(( t > 1 ? t : 1 )); }
sft_deadline=$(( $(date +%s) + ${SFT_SECONDS:-$(( BUDGET / 2 ))} ))
sft_left() { local t=$(( sft_deadline - $(date +%s) )); echo $(( t > 1 ? t : 1 )); }
source "$(dirname "$0")/gpu_env.sh"
GAMES=${GAMES-"60 200 all"}; MAX_STEPS=${MAX_STEPS:-8}; DEVICE=${DEVICE:-cuda}; WORKERS=${WORKERS:-4}
PANEL_TASKS=${PANEL_TASKS:--1}
mkdir -p "$W/data"
# convert the GGUF and merge the shipped cold start once, before several processes want them
python3 -c "from serl.models.loading import resolve_model_path as r; print(r('smollm2-135m-instruct')); print(r('smollm2-135m-alfworld-sft'))" || exit 1
BASE=(recipe=cpu_learn trainer.device=$DEVICE trainer.progress=false)
SFT=("${BASE[@]}" model.path=smollm2-135m-instruct model.lora.r=8 sft.epochs=1 sft.batch_size=4
     sft.micro_batch_size=4 sft.lr=5e-4 sft.warmup_steps=3 sft.save_freq=0 trainer.logger=[jsonl]
     trainer.output_dir=$W/sft trainer.overwrite=true)
start=$(date +%s)
declare -A MODEL=([shipped]=smollm2-135m-alfworld-sft)
for n in $GAMES; do
  # the rows of the first n games of the pool (all: every game), in the pool's order
  python3 - "$POOL" "$n" "$W/data/games_$n.jsonl" <<'EOF' || exit 1
import json, sys
pool, n, out = sys.argv[1], sys.argv[2], sys.argv[3]
games, kept = [], []
for line in open(pool):
    row = json.loads(line)
    if row["task_id"] not in games:
        games.append(row["task_id"])
    if n == "all" or len(games) <= int(n):
        kept.append(line)
if n != "all" and len(games) < int(n):
    sys.exit(f"the pool has {len(games)} games, fewer than {n}")
open(out, "w").writelines(kept)
print(f"games {n}: {len(games) if n == 'all' else int(n)} of the pool's {len(games)} games, {len(kept)} rows")
EOF
  # shellcheck disable=SC2086
  timeout -s TERM -k 20 "$(sft_left)" $SERL sft --data "$W/data/games_$n.jsonl" "${SFT[@]}" \
    trainer.run_name=games_$n ${EXTRA:-} > "$W/logs/sft_games_$n.txt" 2>&1 &
  MODEL[games_$n]=$W/sft/games_$n/model
done
wait
echo "sft wall: $(( $(date +%s) - start )) s" | tee -a "$W/logs/gpu.txt"
panel() {  # panel LABEL FLAGS...: both panel splits of every model whose SFT finished
  local label=$1; shift
  for m in "${!MODEL[@]}"; do
    [ "$m" = shipped ] || [ -f "${MODEL[$m]}/config.json" ] || { echo "$m: no model (SFT unfinished)" | tee -a "$W/logs/gpu.txt"; continue; }
    for split in valid_seen valid_unseen; do
      # shellcheck disable=SC2086
      timeout -s TERM -k 20 "$(left)" $SERL eval "${BASE[@]}" "model.path=${MODEL[$m]}" env.max_steps="$MAX_STEPS" \
        env.num_workers="$WORKERS" rollout.micro_batch_size=64 ${EXTRA:-} --data-dir "$DATA" --split $split \
        --num-tasks "$PANEL_TASKS" "$@" --seed 1000 --out "$W/eval/${m}_${label}_$split" > "$W/logs/eval_${m}_${label}_$split.txt" 2>&1 &
    done
  done
  wait
  echo "$label panels done at $(( $(date +%s) - start )) s" | tee -a "$W/logs/gpu.txt"
}
for d in ${DECODINGS:-greedy sampled}; do
  case $d in greedy) panel greedy --greedy ;; sampled) panel sampled ;; *) echo "unknown decoding $d" >&2 ;; esac
done
for f in "$W"/eval/*/metrics.json; do
  printf '%s: ' "$(basename "$(dirname "$f")")"
  python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print({k: round(v, 4) for k, v in m.items() if isinstance(v, (int, float))})" "$f"
done
# the actions of every episode (actions.jsonl), without the prompts and token ids of trajectories.jsonl
python3 - "$W"/eval/*/ <<'EOF'
import json, sys
for d in sys.argv[1:]:
    try:
        trajs = [json.loads(line) for line in open(d + "trajectories.jsonl")]
    except FileNotFoundError:
        continue
    with open(d + "actions.jsonl", "w") as f:
        for t in trajs:
            f.write(json.dumps({"task_id": t["task"]["task_id"], "won": any(s["won"] for s in t["steps"]),
                                "actions": [s["action"] for s in t["steps"]],
                                "admissible": [s["action"] in s["admissible_actions"] for s in t["steps"]]}) + "\n")
EOF
if [ -n "$OUT" ]; then
  (cd "$W" && tar czf "$OUT/results.tar.gz" --exclude=trajectories.jsonl logs eval sft/*/metrics.jsonl sft/*/config.yaml sft/*/model/serl_sft.json 2>/dev/null)
  # the adapters themselves (PEFT, float32, 9.8 MB each), so that the best one can be shipped
  for a in "$W"/sft/*/adapter; do
    [ -d "$a" ] && mkdir -p "$OUT/adapters/$(basename "$(dirname "$a")")" && cp "$a"/adapter_* "$OUT/adapters/$(basename "$(dirname "$a")")/"
  done
fi
