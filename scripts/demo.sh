#!/usr/bin/env bash
# Install, then run the offline researcher on the bundled workload: a few short iterations on any machine.
# Each training run is step-bounded (HARNESS_MAX_STEPS), so the demo repeats exactly on a machine; real
# runs train for a fixed time budget instead (--time-budget, 300 s by default).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh "[workload]"  # the supervisor and torch for the bundled train.py
exec harness run --agent mutate --iterations "${ITERATIONS:-6}" --max-steps "${MAX_STEPS:-60}" \
  --baseline-runs 1 --tag "demo-$(date +%Y%m%d-%H%M%S)" "$@"
