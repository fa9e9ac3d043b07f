#!/usr/bin/env bash
# A GPU night, checked before one is run (one command, under 10 minutes on an H100/H200):
#   bash scripts/gpu_check.sh            # or TIME_BUDGET=300 OUT=/tmp/gpu-check bash scripts/gpu_check.sh
# 1. the bundled workload's baseline at the default budget, as a night runs it: under the sandbox
#    with GPU passthrough (/dev/nvidia*) and the separate evaluation (the exported model scored,
#    with the causality probe, in its own sandboxed process); prints tokens/s, MFU, val_bpb, peak
#    memory, the evaluation's outcome and the capability set the job held (read inside it);
# 2. the causality probe's noise on CUDA under bf16 autocast against its tolerance
#    (benchmarks/probe_noise.py; on a CPU it measures the float32 and bf16 lower bound);
# 3. with CEILING=1 (about 3 x 4 x (B + start-up) more: set TIME_BUDGET=30): experiments per hour from
#    process start against 3600/B, sequential, --pipeline, and --pipeline with the warm start off
#    (benchmarks/throughput.py --only ceiling-bundled), side by side;
# 4. with OVERLAP=1 (about 8 x 30 s more): a training job's step time alone and with an evaluation
#    beside it on the same GPU, as the harness starts one (idle class, HARNESS_GPU_MEMORY_FRACTION)
#    and at nice 10 and 0 (benchmarks/overlap_step_time.py).
# Needs a CUDA build of torch (install it first; scripts/install.sh keeps a torch that is present).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d /var/tmp/gpu-check.XXXXXX)}
BUDGET=${TIME_BUDGET:-300}
command -v nvidia-smi >/dev/null || { echo "gpu_check: no nvidia-smi: this machine has no NVIDIA driver" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: this torch has no CUDA ' + torch.__version__ + ': install your CUDA build of torch first')"
bash scripts/install.sh "[workload]" >/dev/null
command -v bwrap >/dev/null || { echo "gpu_check: bubblewrap is missing (apt-get install bubblewrap): the night would run unsandboxed" >&2; exit 2; }
repo="$OUT/example"
harness init --example "$repo" >/dev/null
start=$(date +%s)
# The baseline alone: --hours ends the run once it is measured (a candidate would double the time).
harness run --repo "$repo" --agent mutate --iterations 1 --hours 0.01 --time-budget "$BUDGET" --baseline-runs 1 \
  --sandbox bwrap --tag gpu-check 2>&1 | tee "$OUT/run.txt" | grep -v '^\s*$' | tail -n 12
echo "the baseline took $(( $(date +%s) - start ))s from the command's start"
"$PY" benchmarks/gpu_check_summary.py "$repo/runs/gpu-check"
"$PY" benchmarks/probe_noise.py --device cuda
if [ "${CEILING:-0}" = 1 ]; then
  "$PY" benchmarks/throughput.py --only ceiling-bundled --bundled-budget "$BUDGET" --bundled-iterations "${CEILING_ITERATIONS:-4}"
fi
if [ "${OVERLAP:-0}" = 1 ]; then
  "$PY" benchmarks/overlap_step_time.py --budget 30 --repeats 2
fi
echo "all under $OUT"
