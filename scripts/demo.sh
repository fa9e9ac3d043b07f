#!/usr/bin/env bash
# Install, then run the offline researcher on the bundled workload: a few short iterations on any machine.
# Each training run is step-bounded (HARNESS_MAX_STEPS), so the demo repeats exactly on any machine: its
# time budget (30 min) cannot bind, however loaded the machine, and --kill-after still ends a hung job.
# Real runs train for a fixed time budget instead (--time-budget, 300 s by default).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh "[workload]"  # the supervisor and torch for the bundled train.py
exec harness run --agent mutate --iterations "${ITERATIONS:-6}" --max-steps "${MAX_STEPS:-60}" \
  --time-budget "${TIME_BUDGET:-1800}" --kill-after "${KILL_AFTER:-1800}" --baseline-runs 1 --tag "demo-$(date +%Y%m%d-%H%M%S)" "$@"
