#!/usr/bin/env bash
# SERL on WebShop with the launch interface of the original (recipe/serl/run_webshop.sh of
# OliverLeeXZ/SERL): the same environment variables (MODEL_PATH, SAMPLING_MODE,
# TRAJECTORY_FORMAT, OUTPUT_ROOT, GROUP_SIZE, ...) and trailing dotted overrides, mapped onto
# `serl train recipe=webshop key=value ...`. The mapping is shared with run_alfworld.sh; see
# the comments there.
#
#   MODEL_PATH=Qwen/Qwen2.5-7B-Instruct SAMPLING_MODE=judge_current_traj JUDGE_MODEL=qwen-judge \
#   JUDGE_API_URL=http://localhost:8000/v1 bash recipes/run_webshop.sh trainer.total_training_steps=150
set -euo pipefail
SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
SERL_RECIPE=${SERL_RECIPE:-webshop} exec bash "${SCRIPT_DIR}/run_alfworld.sh" "$@"
