"""What the separate evaluation costs, with the evaluator's own graph runner (prepare.AtenProgram)
against torch's deserializer (what prepare.load_model used before), side by side in one run.

The bundled model is trained a few steps on this machine (CPU) and saved as a training job saves
it; then `prepare.py --evaluate`'s work (evaluate_saved: load, score, probe) runs in a fresh
process per try, alternating the two loaders, so a busy neighbour weighs on both alike. Printed:
each one's wall and CPU seconds per evaluation (median) and their ratios.

    python benchmarks/evaluation_load.py [--steps 5] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT  # noqa: E402  (puts the repo root on sys.path)

# torch's deserializer, as load_model used it before the graph runner (the same checks first)
DESERIALIZER = r'''
import json, torch, prepare
from safetensors.torch import load_file

def load_model(folder, device):
    from torch._export.serde.serialize import SerializedArtifact, deserialize
    meta = json.loads((folder / "meta.json").read_text())
    program = json.loads((folder / "program.json").read_text())
    problems = prepare.check_program(program)
    if problems:
        prepare._refuse(["the saved model cannot be evaluated safely: " + "; ".join(problems)])
    for node in program["graph_module"]["graph"]["nodes"]:
        node["metadata"] = {}
    program["graph_module"]["metadata"] = {}
    tensors = load_file(str(folder / "weights.safetensors"), device=str(device))
    split = {p: {k[len(p):]: v for k, v in tensors.items() if k.startswith(p)} for p in ("state_dict/", "constants/")}
    params = {s["parameter"]["parameter_name"] for s in program["graph_module"]["signature"]["input_specs"]
              if "parameter" in s}
    state = {k: torch.nn.Parameter(v, requires_grad=False) if k in params else v for k, v in split["state_dict/"].items()}
    artifact = SerializedArtifact(json.dumps(program).encode(), state, split["constants/"], {})
    return deserialize(artifact).module(), int(meta["batch_size"]), int(meta["seq_len"])

prepare.load_model = load_model
'''
EVALUATE = "import sys, prepare\nfrom pathlib import Path\nprepare.evaluate_saved(Path(sys.argv[1]))\n"


def evaluate(out: Path, loader: str) -> tuple[float, float, str]:
    """(wall s, CPU s, val_bpb) of one evaluation in a fresh process."""
    code = (DESERIALIZER if loader == "torch's deserializer" else "") + EVALUATE
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{loader}: {done.stderr[-2000:]}")
    bpb = next(line.split(": ")[1] for line in done.stdout.splitlines() if line.startswith("val_bpb: "))
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), bpb


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="eval-bench-"))
    env = {**os.environ, "HARNESS_MAX_STEPS": str(args.steps), "HARNESS_OUTPUT_DIR": str(out), "CUDA_VISIBLE_DEVICES": "",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    subprocess.run([sys.executable, "train.py"], cwd=ROOT, env=env, check=True, capture_output=True, timeout=900)
    meta = json.loads((out / "model" / "meta.json").read_text())
    loaders = ["the graph runner", "torch's deserializer"]
    walls: dict[str, list[float]] = {k: [] for k in loaders}
    cpus: dict[str, list[float]] = {k: [] for k in loaders}
    figures = set()
    for _ in range(args.repeats):  # interleaved
        for loader in loaders:
            wall, cpu, bpb = evaluate(out, loader)
            walls[loader].append(wall)
            cpus[loader].append(cpu)
            figures.add(bpb)
    print(f"bundled model, {args.steps} steps, batch {meta['batch_size']} x seq_len {meta['seq_len']}, "
          f"one thread; val_bpb {', '.join(sorted(figures))} (one figure: both loaders score alike)")
    for loader in loaders:
        print(f"{loader:22s} wall {statistics.median(walls[loader]):6.2f} s   CPU {statistics.median(cpus[loader]):6.2f} s"
              f"   (median of {args.repeats})")
    new, old = loaders
    print(f"ratio (runner / deserializer): wall {statistics.median(walls[new]) / statistics.median(walls[old]):.2f}, "
          f"CPU {statistics.median(cpus[new]) / statistics.median(cpus[old]):.2f}")


if __name__ == "__main__":
    main()
