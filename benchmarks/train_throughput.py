"""
Throughput of the bundled workload on this machine: runs train.py exactly as the harness does
(a subprocess with a time budget) and prints tokens/s, MFU, val_bpb and peak memory.

    python benchmarks/train_throughput.py                  # 300 s on CUDA, 10 s on CPU
    python benchmarks/train_throughput.py --time-budget 60
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--time-budget", type=float, default=300.0 if device == "cuda" else 10.0,
                        help="seconds of training (default: 300 on CUDA, 10 on CPU)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        env = dict(os.environ, HARNESS_TIME_BUDGET=str(args.time_budget),
                   HARNESS_RESULT_FILE=str(result_file), PYTHONUNBUFFERED="1")
        env.pop("HARNESS_MAX_STEPS", None)  # a step cap would make the figures meaningless
        t0 = time.time()
        proc = subprocess.run([sys.executable, "train.py"], cwd=ROOT, env=env,
                              timeout=2 * args.time_budget + 600)  # startup and compile on top
        wall_s = time.time() - t0
        if proc.returncode != 0 or not result_file.exists():
            sys.exit(f"train.py failed (exit {proc.returncode})")
        r = json.loads(result_file.read_text())

    name = torch.cuda.get_device_name() if device == "cuda" else f"cpu ({os.cpu_count()} cores)"
    print(f"\ndevice:           {name}")
    print(f"time budget:      {args.time_budget:.0f} s (training {r['training_seconds']:.1f} s, wall {wall_s:.1f} s)")
    print(f"model:            {r['num_params_M']:.2f} M parameters, {r['num_steps']} steps")
    print(f"throughput:       {r['total_tokens_M'] * 1e6 / r['training_seconds']:,.0f} tokens/s")
    print(f"mfu:              {r['mfu_percent']:.1f} %")
    print(f"val_bpb:          {r['val_bpb']:.4f}")
    print(f"peak memory:      {r['peak_vram_mb']:.0f} MB")


if __name__ == "__main__":
    main()
