"""GPU duty and experiments per hour: sequential vs pipelined, lanes, and the night's ceiling.

Three sections, each side by side in one process, through the real scheduler in real temporary
git repos (the default sandbox):

- `sleep`: a sleep-based trainer (budget B seconds) and a researcher that takes L seconds per
  proposal. For L = B/4, B/2 and B the same number of iterations sequentially (--no-pipeline)
  and pipelined; then 1, 2 and 4 lanes (pipelined, L = B/2). GPU duty is training seconds / wall
  seconds per lane, from the first training job's start to the last row.
- `ceiling-sleep`: the sleep trainer with a separate evaluation (`evaluate_command`: a protected
  scorer that sleeps E = B/4 and writes the figure the job left), L = B/2, sequential, with
  --pipeline, and with --pipeline but the warm start off (--no-warm-start: every job's
  interpreter started for it): experiments per hour **from process start** (the baseline, the
  first proposal and every evaluation included, to the last row) as a fraction of the limit 3600/B.
- `overhead`: the harness's own cost per row at researcher latency 0, from process start: a real
  `harness run` process (the CLI, the default sandbox for the job and the researcher) on the sleep
  trainer, with a `cmd:` researcher that rewrites one number at once, sequential and pipelined.
  Three figures per row: the wall time outside the trainer's own sleep (the trainer's and the
  researcher's process starts included: what a user waits for besides training), outside the job
  as the ledger times it (train_s), and outside the job and the researcher's time on the critical
  path (agent_s when sequential: the harness's own work).
- `ceiling-bundled`: the same on the bundled workload (train.py, prepare.py's sandboxed
  evaluation and its training-data export) at a 30 s budget on this machine's device, a stand-in
  researcher that waits B/2 and changes one knob.

    python benchmarks/throughput.py                                   # every section
    python benchmarks/throughput.py --only ceiling-bundled --bundled-iterations 3
    python benchmarks/throughput.py --only ceiling-sleep --budget 2 --iterations 6
    python benchmarks/throughput.py --only overhead --iterations 20
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import make_repo  # noqa: E402  (puts the repo root on sys.path)

from harness.driver import loop as driver  # noqa: E402
from harness import ledger  # noqa: E402
from harness.agents import Proposal  # noqa: E402
from harness.config.load import resolve  # noqa: E402

TRAIN = """import os, time
GAIN = 0.0  # the researcher's rare winning knob
# ---
VALUE = 1.0  # the researcher's usual (losing) knob
# ---
SLEEP_S = {budget}  # s of "training": the budget B
time.sleep(SLEEP_S)
if os.environ.get("HARNESS_OUTPUT_DIR"):  # a separate evaluation scores what the job left
    open(os.path.join(os.environ["HARNESS_OUTPUT_DIR"], "value"), "w").write(repr(VALUE - GAIN))
print("---")
print(f"val_bpb: {{VALUE - GAIN:.6f}}")
print("peak_vram_mb: 0")
"""
EVALUATE = """import json, os, time
time.sleep({eval_s})  # s of scoring: E
value = float(open(os.path.join(os.environ["HARNESS_OUTPUT_DIR"], "value")).read())
json.dump({{"val_bpb": value}}, open(os.environ["HARNESS_RESULT_FILE"], "w"))
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


class KnobResearcher:
    """For the bundled train.py: waits latency_s, then sets WARMDOWN_FRAC to a value of its own
    (every proposal unique, none a cheat; whether it wins is the workload's business)."""
    name, model = "knob", None

    def __init__(self, latency_s: float):
        self.latency_s = latency_s

    def describe(self):
        return {"backend": "knob"}

    def propose(self, task):
        time.sleep(self.latency_s)
        train = task.worktree / "train.py"
        lines = train.read_text().splitlines()
        value = round(0.3 + 0.01 * task.iteration, 4)
        lines = [f"WARMDOWN_FRAC = {value!r}" if ln.startswith("WARMDOWN_FRAC =") else ln for ln in lines]
        train.write_text("\n".join(lines) + "\n")
        return Proposal(f"warmdown {value}")


def measure(root: Path, name: str, budget_s: float, latency_s: float, iterations: int,
            pipelined: bool, lanes: int, eval_s: float | None = None, warm: bool = True) -> dict:
    repo = make_repo(root / "".join(c if c.isalnum() else "-" for c in name), TRAIN.format(budget=budget_s),
                     f'time_budget = {budget_s}\ngate = "strict"\nbaseline_runs = 1\n'
                     + (f'evaluate_command = "{sys.executable} -S prepare.py"\n' if eval_s is not None else ""))
    if eval_s is not None:  # the protected scorer
        (repo / "prepare.py").write_text(EVALUATE.format(eval_s=eval_s))
        for argv in (["git", "add", "-A"], ["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "e"]):
            __import__("subprocess").run(argv, cwd=repo, check=True)
    gpus = tuple(str(g) for g in range(lanes)) if lanes > 1 else ()
    cfg = resolve(repo, "bench", {"iterations": iterations, "pipeline": pipelined, "gpus": gpus, "warm_start": warm})
    return drive(cfg, name, SleepyResearcher(latency_s), budget_s, latency_s, lanes)


def measure_bundled(root: Path, name: str, budget_s: float, latency_s: float, iterations: int,
                    pipelined: bool, warm: bool = True) -> dict:
    from harness.commands.initrepo import init_example
    repo = init_example(root / "".join(c if c.isalnum() else "-" for c in name))
    # no test-split scoring: it runs once at the end of a night, after the last row, and would
    # only lengthen a short benchmark
    settings = repo / "harness.toml"
    settings.write_text("".join(ln for ln in settings.read_text().splitlines(True) if not ln.startswith("test_command")))
    for argv in (["git", "add", "-A"], ["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "t"]):
        __import__("subprocess").run(argv, cwd=repo, check=True)
    cfg = resolve(repo, "bench", {"iterations": iterations, "pipeline": pipelined, "time_budget": budget_s,
                                  "gate": "strict", "baseline_runs": 1, "warm_start": warm})
    return drive(cfg, name, KnobResearcher(latency_s), budget_s, latency_s, 1)


def drive(cfg, name: str, researcher, budget_s: float, latency_s: float, lanes: int) -> dict:
    started: list[float] = []
    rows_at: list[float] = []

    def progress(event, data):
        if event == "start":  # after the baseline
            started.append(time.monotonic())
        elif event == "row":
            rows_at.append(time.monotonic())

    t_call = time.monotonic()
    driver.run(cfg, progress=progress, researcher=researcher)
    t_end = rows_at[-1] if rows_at else time.monotonic()  # the last decision (the run's tidy-up left out)
    every = [r for r in ledger.read_rows(cfg.ledger_path) if r["status"] != "budget"]
    rows = every[1:]
    # From the first training job's start: the run's very first proposal (the GPU necessarily
    # idle, once per night) is left out, so a short benchmark shows the steady state. Pipelined,
    # that proposal was made while the baseline trained: there is nothing to leave out (taking
    # its latency off anyway gave a duty over 100%).
    wall_s = t_end - started[0] - (0.0 if cfg.pipeline else latency_s)
    train_s = sum(r["train_s"] or 0.0 for r in rows)
    trained = sum(1 for r in rows if r["train_s"])
    # From process start: the baseline's training counts, and so does any GPU idle time before it
    # or while the first proposal is made.
    duty_start = sum(r["train_s"] or 0.0 for r in every) / ((t_end - t_call) * lanes)
    experiments = sum(1 for r in every if r["train_s"])
    per_hour_start = experiments / (t_end - t_call) * 3600
    return {"name": name, "duty": train_s / (wall_s * lanes), "duty_start": duty_start,
            "per_hour": trained / wall_s * 3600, "per_hour_start": per_hour_start,
            "of_limit": per_hour_start / (3600 / budget_s) / lanes, "total_s": t_end - t_call,
            "experiments": experiments, "rows": len(rows), "trained": trained, "wall_s": wall_s,
            "statuses": {s: sum(r["status"] == s for r in rows) for s in {r["status"] for r in rows}}}


def line(m: dict) -> str:
    counts = " ".join(f"{k} {v}" for k, v in sorted(m["statuses"].items()))
    return (f"  {m['name']:<22} GPU duty {m['duty']:6.1%} (from process start {m['duty_start']:6.1%})   "
            f"experiments/h {m['per_hour']:7.0f}   "
            f"({m['trained']} trained in {m['wall_s']:.1f}s; {counts})")


def ceiling_line(m: dict, budget_s: float) -> str:
    counts = " ".join(f"{k} {v}" for k, v in sorted(m["statuses"].items()))
    return (f"  {m['name']:<22} from process start: {m['experiments']} experiments in {m['total_s']:.1f}s = "
            f"{m['per_hour_start']:6.1f}/h of the limit {3600 / budget_s:.0f}/h: {m['of_limit']:5.1%}   "
            f"GPU duty {m['duty_start']:5.1%}   ({counts})")


def section_sleep(root: Path, b: float, n: int) -> None:
    print(f"sleep trainer: budget B = {b:g}s, {n} iterations per configuration (per lane), one win in {WIN_EVERY}")
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


# The instant researcher of the `overhead` section: one shell, one sed; every proposal a new VALUE.
INSTANT = """cmd:sh -c 'sed -i "s/^VALUE = .*/VALUE = 2.$(date +%N)/" train.py'"""


def measure_overhead(root: Path, name: str, budget_s: float, iterations: int, pipelined: bool) -> dict:
    """One real `harness run` process from start to exit; the ledger's rows."""
    repo = make_repo(root / "".join(c if c.isalnum() else "-" for c in name), TRAIN.format(budget=budget_s),
                     f'time_budget = {budget_s}\nbaseline_runs = 1\n')
    argv = [sys.executable, "-m", "harness", "run", "--repo", str(repo), "--tag", "o", "--agent", INSTANT,
            "--iterations", str(iterations), "--pipeline" if pipelined else "--no-pipeline"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    t0 = time.monotonic()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall_s = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"{name}: harness run failed ({done.returncode}):\n{done.stderr[-2000:]}")
    rows = [r for r in ledger.read_rows(repo / "runs" / "o" / "results.tsv") if r["status"] != "budget"]
    trained = [r for r in rows if r["train_s"]]
    train_s = sum(r["train_s"] for r in trained)
    agent_s = sum(r["agent_s"] or 0.0 for r in rows)
    waited_s = 0.0 if pipelined else agent_s  # pipelined, the researcher works while the job trains
    return {"name": name, "rows": len(rows), "trained": len(trained), "wall_s": wall_s,
            "outside_sleep": (wall_s - len(trained) * budget_s) / len(rows),
            "outside_train": (wall_s - train_s) / len(rows),
            "outside_job": (wall_s - train_s - waited_s) / len(rows),
            "statuses": {st: sum(r["status"] == st for r in rows) for st in {r["status"] for r in rows}}}


def section_overhead(root: Path, b: float, n: int) -> None:
    print(f"overhead per row at researcher latency 0, from process start: sleep trainer B = {b:g}s, "
          f"{n} iterations, a real `harness run`")
    for pipelined in (False, True):
        m = measure_overhead(root, f"overhead {'pipelined' if pipelined else 'sequential'}", b, n, pipelined)
        counts = " ".join(f"{k} {v}" for k, v in sorted(m["statuses"].items()))
        print(f"  {m['name']:<22} {m['rows']} rows in {m['wall_s']:.1f}s: outside the trainer's sleep "
              f"{m['outside_sleep']:.3f}s per row, outside the job {m['outside_train']:.3f}s, "
              f"outside the job and the researcher "
              f"{m['outside_job']:.3f}s per row   ({counts})")


CEILING_MODES = (("sequential", False, True), ("pipelined", True, True), ("pipelined, cold", True, False))
# (name, --pipeline, warm start): "cold" = --no-warm-start, every job's interpreter started for it


def section_ceiling(results: list[dict], budget_s: float, what: str) -> None:
    seq, pip, cold = results
    for m in results:
        print(ceiling_line(m, budget_s))
    print(f"  {what}: pipelined / sequential: experiments/h from process start x"
          f"{pip['per_hour_start'] / seq['per_hour_start']:.2f}; warm / cold start (pipelined): x"
          f"{pip['per_hour_start'] / cold['per_hour_start']:.2f}, wall per experiment "
          f"{pip['total_s'] / pip['experiments']:.2f}s against {cold['total_s'] / cold['experiments']:.2f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=1.0, help="B of the sleep trainer, seconds")
    parser.add_argument("--iterations", type=int, default=8, help="iterations per sleep configuration (per lane)")
    parser.add_argument("--bundled-budget", type=float, default=30.0, help="B of the bundled workload, seconds")
    parser.add_argument("--bundled-iterations", type=int, default=4,
                        help="iterations per bundled configuration (fewer on a small machine)")
    parser.add_argument("--only", choices=("sleep", "ceiling-sleep", "ceiling-bundled", "overhead"), action="append",
                        help="run these sections only (repeatable); default: every one")
    args = parser.parse_args()
    only = set(args.only or ("sleep", "ceiling-sleep", "ceiling-bundled", "overhead"))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if "sleep" in only:
            section_sleep(root, args.budget, args.iterations)
        if "overhead" in only:
            section_overhead(root, args.budget, args.iterations)
        if "ceiling-sleep" in only:
            b, n = args.budget, args.iterations
            print(f"ceiling, sleep trainer with a separate evaluation: B = {b:g}s, E = B/4, L = B/2, "
                  f"{n} iterations, from process start")
            section_ceiling([measure(root, f"eval {mode}", b, b / 2, n, pipelined, 1, eval_s=b / 4, warm=warm)
                             for mode, pipelined, warm in CEILING_MODES], b, "L=B/2")
        if "ceiling-bundled" in only:
            b, n = args.bundled_budget, args.bundled_iterations
            print(f"ceiling, bundled workload: B = {b:g}s, L = B/2, {n} iterations, from process start")
            section_ceiling([measure_bundled(root, f"bundled {mode}", b, b / 2, n, pipelined, warm)
                             for mode, pipelined, warm in CEILING_MODES], b, "L=B/2")


if __name__ == "__main__":
    main()
