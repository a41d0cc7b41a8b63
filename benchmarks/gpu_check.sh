#!/usr/bin/env bash
# GPU check of the vLLM backend (issues 17, 29): HF `generate` vs vLLM in MAGRPO, same run, on one GPU, bf16; then
# trl_marl's MAGRPO (one agent) against TRL's GRPOTrainer, both on colocated vLLM, on the same model and work.
#
#   bash benchmarks/gpu_check.sh [results.json]       # default benchmarks/results/gpu_check.json
#                                                     # and benchmarks/results/gpu_check_trl_grpo.json
#
# Needs a Python environment with a CUDA torch, vLLM 0.22-0.31 (`pip install "trl-marl[vllm]"`) and trl_marl; no
# network (models are random weights built locally). Shapes: the Qwen2-0.5B shape (hidden 896, 24 layers, 14 heads /
# 2 KV heads, intermediate 4864, vocab 151936) and the tiny head_dim-64 Llama; 2 agents, 8 prompts x G=4, 16 and 128
# new tokens; 2 warm-up + 5 timed steps per configuration. Engine start-up and weight-sync cost are reported apart.
# The TRL comparison: the Qwen2-0.5B shape, 8 prompts x G=4, 128 new tokens, each library in its own process.
# Expected wall time: a few minutes (building the 0.5B folder once, then 10 runs).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
OUT="${1:-benchmarks/results/gpu_check.json}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
"$PY" - <<'PYEOF'
import torch
assert torch.cuda.is_available(), "gpu_check.sh needs a CUDA device"
from trl_marl.generation.vllm_backend import check_vllm_available
print("device:", torch.cuda.get_device_name(0), "| vLLM", check_vllm_available(), "| torch", torch.__version__)
PYEOF
"$PY" benchmarks/throughput.py --vllm --device cuda --dtype bfloat16 --models qwen0.5b tiny --tokens 16 128 \
    --steps 5 --warmup 2 --vllm_gpu_memory_utilization 0.25 --output "$OUT"
"$PY" benchmarks/trl_grpo_side_by_side.py --device cuda --dtype bfloat16 --models qwen0.5b --use_vllm --tokens 128 \
    --steps 5 --warmup 2 --vllm_gpu_memory_utilization 0.25 --output "${OUT%.json}_trl_grpo.json"
echo "results: $OUT ${OUT%.json}_trl_grpo.json"
