#!/usr/bin/env bash
# Install the package (and, when no torch is present, the pinned CPU build of torch first).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "no torch found: installing the CPU build torch==2.13.0 (GPU users: install your CUDA build first)" >&2
  "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".${1:-}"
