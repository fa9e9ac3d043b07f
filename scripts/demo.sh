#!/usr/bin/env bash
# Install, then run the offline researcher on the bundled workload: a few short iterations on any machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec harness run --agent mutate --iterations "${ITERATIONS:-6}" --time-budget "${TIME_BUDGET:-10}" \
  --tag "demo-$(date +%Y%m%d-%H%M%S)" "$@"
