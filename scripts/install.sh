#!/usr/bin/env bash
# Install the package, optionally with extras:
#   bash scripts/install.sh               the supervisor alone (what `harness` imports: no torch)
#   bash scripts/install.sh "[workload]"  + torch, for the bundled train.py (scripts/demo.sh)
#   bash scripts/install.sh "[track]"     + mlflow, for --track mlflow;  "[report]": + matplotlib plots
#   bash scripts/install.sh "[ray]"       + ray, for --executor ray (docs/cluster.md)
#   bash scripts/install.sh "[test]"      everything the test suite needs (scripts/test.sh)
# Extras that need torch get the pinned CPU build torch==2.13.0 first when no torch is present
# (GPU users: install your CUDA build of torch first).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=${1:-}
case "$extras" in
  *workload*|*test*)
    if ! "$PY" -c "import torch" 2>/dev/null; then
      echo "no torch found: installing the CPU build torch==2.13.0 (GPU users: install your CUDA build first)" >&2
      "$PY" -m pip install -q "torch==2.13.0"
    fi
    ;;
esac
"$PY" -m pip install -q -e ".$extras"
