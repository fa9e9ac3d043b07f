"""What an evaluation beside a training job costs the training: its step time alone, and with
`prepare.py --evaluate` scoring a saved model over and over beside it, in the scheduling class
the harness starts its evaluators in (the idle class, scoring.IDLE_CLASS) and, for comparison,
at nice 10 (what the harness used before) and at the same priority as the training (nice 0). On a GPU both run on the same device, the evaluator within
HARNESS_GPU_MEMORY_FRACTION of its memory, as the harness runs them (docs/pipeline.md).

The bundled train.py and prepare.py in a temporary folder, each configuration `--repeats` times,
interleaved (A B C A B C ...) so that a machine whose load drifts affects them alike. The step
time is the job's own training_seconds / num_steps (its timed loop, no start-up).

    python benchmarks/overlap_step_time.py [--budget 15] [--repeats 2]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from common import ROOT  # noqa: E402  (puts the repo root on sys.path)

from harness.executors.scoring import EVAL_GPU_MEMORY_FRACTION, idle_prefix  # noqa: E402


def figures(text: str) -> dict[str, float]:
    block = text.rsplit("\n---\n", 1)[-1]
    return {m[1]: float(m[2]) for m in re.finditer(r"^(\w+): ([-+0-9.eE]+)$", block, re.M)}


def saved_model(work: Path, out: Path) -> None:
    """A model for the evaluator to score: a short step-bounded run that saves it."""
    env = {**os.environ, "HARNESS_OUTPUT_DIR": str(out), "HARNESS_MAX_STEPS": "5"}
    subprocess.run([sys.executable, "train.py"], cwd=work, env=env, check=True, capture_output=True)


def train(work: Path, budget_s: float, out: Path, beside: list[str] | None) -> tuple[float, int]:
    """(seconds per step of a budget_s training, evaluations finished beside it)."""
    stop, done = threading.Event(), [0]

    def evaluate_loop() -> None:
        env = {**os.environ, "HARNESS_OUTPUT_DIR": str(out), "HARNESS_RESULT_FILE": str(out.parent / "r.json"),
               "HARNESS_GPU_MEMORY_FRACTION": f"{EVAL_GPU_MEMORY_FRACTION:g}"}
        while not stop.is_set():
            argv = [*beside, sys.executable, "prepare.py", "--evaluate"]
            proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while proc.poll() is None and not stop.wait(0.1):
                pass
            if proc.poll() is None:  # the training is over: the evaluation in flight is not waited for
                proc.kill()
                proc.wait()
            elif proc.returncode == 0:
                done[0] += 1
    thread = threading.Thread(target=evaluate_loop, daemon=True) if beside is not None else None
    if thread:
        thread.start()
    env = {**os.environ, "HARNESS_TIME_BUDGET": f"{budget_s:g}"}
    text = subprocess.run([sys.executable, "train.py"], cwd=work, env=env, check=True, capture_output=True,
                          text=True).stdout
    stop.set()
    if thread:
        thread.join()
    f = figures(text)
    return f["training_seconds"] / max(1.0, f["num_steps"]), done[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=15.0, help="s of training per measurement")
    parser.add_argument("--repeats", type=int, default=2, help="measurements per configuration")
    args = parser.parse_args()
    idle = idle_prefix()
    how = " ".join([Path(idle[0]).name, *idle[1:]]) if idle else "as is"
    configs = [("alone", None), (f"evaluator beside, as the harness starts it: {how}", idle),
               ("evaluator beside, nice 10", ["nice", "-n", "10"]),
               ("evaluator beside, nice 0", [])]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        for name in ("train.py", "prepare.py"):
            shutil.copy(ROOT / name, work / name)
        shutil.copytree(ROOT / "data", work / "data")
        out = Path(tmp) / "out"
        out.mkdir()
        saved_model(work, out)
        steps: dict[str, list[float]] = {name: [] for name, _ in configs}
        evals: dict[str, int] = {name: 0 for name, _ in configs}
        for _ in range(args.repeats):
            for name, beside in configs:
                step_s, n = train(work, args.budget, out, beside)
                steps[name].append(step_s)
                evals[name] += n
        alone = statistics.fmean(steps["alone"])
        print(f"training step time, {args.budget:g}s budget, {args.repeats} runs each, {os.cpu_count()} CPUs")
        for name, _ in configs:
            mean = statistics.fmean(steps[name])
            print(f"  {name:<30} {mean * 1e3:8.2f} ms/step   x{mean / alone:.2f} of alone   "
                  f"({evals[name]} evaluations finished beside it; runs: "
                  f"{', '.join(f'{s * 1e3:.2f}' for s in steps[name])} ms)")


if __name__ == "__main__":
    main()
