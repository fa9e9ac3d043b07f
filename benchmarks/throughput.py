"""GPU duty and experiments per hour: sequential vs pipelined, and 1, 2 and 4 lanes.

A sleep-based trainer (budget B seconds) and a researcher that takes L seconds per proposal,
in real temporary git repos, through the real scheduler. For L = B/4, B/2 and B it runs the
same number of iterations sequentially (--no-pipeline) and pipelined, side by side in one
process; then 1, 2 and 4 lanes (pipelined, L = B/2). Prints, per configuration, the GPU duty
(training seconds / wall seconds per lane, from the first training job's start to the last row) and the
experiments per hour, with the ratio pipelined / sequential and the scaling of the lanes.

Pipelined duty should stay above 95% whenever L < B; lanes should scale nearly linearly.

    python benchmarks/throughput.py [--budget 1.0] [--iterations 8]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import make_repo  # noqa: E402  (puts the repo root on sys.path)

from harness.driver import loop as driver  # noqa: E402
from harness import ledger  # noqa: E402
from harness.agents import Proposal  # noqa: E402
from harness.config.load import resolve  # noqa: E402

TRAIN = """import time
GAIN = 0.0  # the researcher's rare winning knob
# ---
VALUE = 1.0  # the researcher's usual (losing) knob
# ---
SLEEP_S = {budget}  # s of "training": the budget B
time.sleep(SLEEP_S)
print("---")
print(f"val_bpb: {{VALUE - GAIN:.6f}}")
print("peak_vram_mb: 0")
"""
WIN_EVERY = 5  # one proposal in WIN_EVERY improves the metric (most are discarded, as in real runs)


class SleepyResearcher:
    """Takes latency_s per proposal; edits VALUE (worse, unique) or, now and then, GAIN (better)."""
    name, model = "sleepy", None

    def __init__(self, latency_s: float):
        self.latency_s = latency_s

    def describe(self):
        return {"backend": "sleepy"}

    def propose(self, task):
        time.sleep(self.latency_s)
        train = task.worktree / "train.py"
        lines = train.read_text().splitlines()
        i = task.iteration
        if i % WIN_EVERY == 0:
            lines = [f"GAIN = {i * 1e-3!r}" if ln.startswith("GAIN =") else ln for ln in lines]
        else:
            lines = [f"VALUE = {1.0 + i * 1e-3!r}" if ln.startswith("VALUE =") else ln for ln in lines]
        train.write_text("\n".join(lines) + "\n")
        return Proposal(f"iteration {i}")


def measure(root: Path, name: str, budget_s: float, latency_s: float, iterations: int,
            pipelined: bool, lanes: int) -> dict:
    repo = make_repo(root / "".join(c if c.isalnum() else "-" for c in name), TRAIN.format(budget=budget_s),
                     f'time_budget = {budget_s}\ngate = "strict"\nbaseline_runs = 1\n')
    gpus = tuple(str(g) for g in range(lanes)) if lanes > 1 else ()
    cfg = resolve(repo, "bench", {"iterations": iterations, "pipeline": pipelined, "gpus": gpus})
    started: list[float] = []

    def progress(event, data):
        if event == "start":  # after the baseline
            started.append(time.monotonic())

    t_call = time.monotonic()
    driver.run(cfg, progress=progress, researcher=SleepyResearcher(latency_s))
    t_end = time.monotonic()
    every = [r for r in ledger.read_rows(cfg.ledger_path) if r["status"] != "budget"]
    rows = every[1:]
    # From the first training job's start: the run's very first proposal (the GPU necessarily
    # idle, once per night) is left out, so a short benchmark shows the steady state.
    wall_s = time.monotonic() - started[0] - latency_s
    train_s = sum(r["train_s"] or 0.0 for r in rows)
    trained = sum(1 for r in rows if r["train_s"])
    # From process start: the baseline's training counts, and so does any GPU idle time before it
    # or while the first proposal is made.
    duty_start = sum(r["train_s"] or 0.0 for r in every) / ((t_end - t_call) * lanes)
    return {"name": name, "duty": train_s / (wall_s * lanes), "duty_start": duty_start,
            "per_hour": trained / wall_s * 3600,
            "rows": len(rows), "trained": trained, "wall_s": wall_s,
            "statuses": {s: sum(r["status"] == s for r in rows) for s in {r["status"] for r in rows}}}


def line(m: dict) -> str:
    counts = " ".join(f"{k} {v}" for k, v in sorted(m["statuses"].items()))
    return (f"  {m['name']:<22} GPU duty {m['duty']:6.1%} (from process start {m['duty_start']:6.1%})   "
            f"experiments/h {m['per_hour']:7.0f}   "
            f"({m['trained']} trained in {m['wall_s']:.1f}s; {counts})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=1.0, help="B: seconds of training per experiment")
    parser.add_argument("--iterations", type=int, default=8, help="iterations per configuration (per lane)")
    args = parser.parse_args()
    b, n = args.budget, args.iterations
    print(f"budget B = {b:g}s, {n} iterations per configuration (per lane), one win in {WIN_EVERY}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print("sequential vs pipelined, one lane:")
        for frac, label in ((0.25, "B/4"), (0.5, "B/2"), (1.0, "B")):
            seq = measure(root, f"L={label} sequential", b, b * frac, n, False, 1)
            pip = measure(root, f"L={label} pipelined", b, b * frac, n, True, 1)
            print(line(seq))
            print(line(pip))
            print(f"  L={label}: pipelined / sequential: duty x{pip['duty'] / seq['duty']:.2f}, "
                  f"experiments/h x{pip['per_hour'] / seq['per_hour']:.2f}")
        print("lanes (pipelined, L = B/2):")
        base = None
        for lanes in (1, 2, 4):
            m = measure(root, f"{lanes} lane{'s' if lanes > 1 else ''}", b, b / 2, n * lanes, True, lanes)
            base = base or m["per_hour"]
            print(line(m) + f"   scaling x{m['per_hour'] / base:.2f} (ideal x{lanes})")


if __name__ == "__main__":
    main()
