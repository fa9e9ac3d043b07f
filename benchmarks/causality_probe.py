"""What the causality probe costs: the separate evaluation's scoring alone against scoring plus
the probe, on the bundled model trained a few steps on this machine (CPU), side by side.

The probe feeds every scored window again (twice, at least 1024 rows in all) with its bytes from
a secret cut on replaced (prepare._is_causal). This prints both times and their ratio; compare
it with the training budget (300 s by default) to see what it adds to an experiment.

    python benchmarks/causality_probe.py [--steps 20] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT  # noqa: E402  (puts the repo root on sys.path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="probe-bench-"))
    env = {**os.environ, "HARNESS_MAX_STEPS": str(args.steps), "HARNESS_OUTPUT_DIR": str(out), "CUDA_VISIBLE_DEVICES": ""}
    subprocess.run([sys.executable, "train.py"], cwd=ROOT, env=env, check=True, capture_output=True, timeout=900)
    import torch
    import prepare
    device = torch.device("cpu")
    module, batch_size, seq_len = prepare.load_model(out / prepare.MODEL_DIR, device)
    val = prepare.load_split("val", device)
    pristine = prepare._is_causal
    times: dict[str, list[float]] = {"scoring alone": [], "scoring + probe": []}
    for _ in range(args.repeats):  # interleaved, so a busy neighbour weighs on both alike
        for label in times:
            prepare._is_causal = (lambda *a, **k: True) if label == "scoring alone" else pristine
            t0 = time.perf_counter()
            bpb, causal = prepare.score(module, val, seq_len, batch_size, device)
            times[label].append(time.perf_counter() - t0)
            assert causal
    prepare._is_causal = pristine
    alone, probed = (statistics.median(v) for v in times.values())
    print(f"bundled model, {args.steps} steps, seq_len {seq_len}, batch {batch_size}, val_bpb {bpb:.4f}")
    print(f"scoring alone     {alone:7.3f} s (median of {args.repeats})")
    print(f"scoring + probe   {probed:7.3f} s")
    print(f"ratio             {probed / alone:7.2f}x")


if __name__ == "__main__":
    main()
