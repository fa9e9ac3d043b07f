"""Soak test: many iterations in one process, watching for leaks of file descriptors, memory or time.

An instant researcher (rewrites one number) and a no-op trainer (prints a result at once), over
N iterations in a real temporary git repo, with every robustness layer on (journal, ledger
shadow, scope and git checks, policy, protected hashes, health checkpoints). Prints open file
descriptors, RSS and the harness's overhead per iteration (wall minus researcher and training)
for the first and the last 50 iterations: flat is the goal. Wall time on a busy machine follows the
load, so the CPU time per iteration (the harness's process and its children: git, the trainer) is
printed beside it: growth with the night shows in both, the neighbours' load only in the first.

    python benchmarks/soak.py [--iterations 500]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.driver import loop as driver  # noqa: E402
from harness import ledger  # noqa: E402
from harness.config.load import resolve  # noqa: E402

from overhead import TRAIN, InstantResearcher, make_repo  # noqa: E402

WINDOW = 50  # iterations averaged at each end


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=500)
    args = parser.parse_args()
    samples: dict[int, tuple[int, float]] = {}
    cpu: dict[int, float] = {}  # iteration -> CPU seconds since the row before it

    def progress(event, data):
        if event == "row":
            samples[data["row"].iteration] = (open_fds(), rss_mb())
            now = cpu_s()
            cpu[data["row"].iteration] = now - cpu.get("_last", now)
            cpu["_last"] = now

    with tempfile.TemporaryDirectory() as tmp:
        repo = make_repo(Path(tmp) / "repo", TRAIN)
        cfg = resolve(repo, "soak", {"iterations": args.iterations, "baseline_runs": 1,
                                     "on_unhealthy": "continue"})
        t0 = time.monotonic()
        summary = driver.run(cfg, researcher=InstantResearcher(), progress=progress)
        total = time.monotonic() - t0
        rows = [r for r in ledger.read_rows(cfg.ledger_path) if r["iteration"] and r["status"] != "repeat"]
    overhead = {r["iteration"]: r["wall_s"] - (r["agent_s"] or 0) - (r["train_s"] or 0) for r in rows}
    its = sorted(overhead)
    first, last = its[:WINDOW], its[-WINDOW:]

    def figures(block: list[int]) -> str:
        fds = statistics.mean(samples[i][0] for i in block)
        rss = statistics.mean(samples[i][1] for i in block)
        ms = statistics.mean(overhead[i] for i in block) * 1000
        cpu_ms = statistics.mean(cpu[i] for i in block) * 1000
        return f"fds {fds:5.1f}  rss {rss:6.1f} MB  overhead {ms:5.0f} ms/iteration  cpu {cpu_ms:5.0f} ms/iteration"

    print(f"iterations: {len(rows)}  total wall: {total:.1f}s  statuses: {summary.counts}")
    print(f"first {WINDOW}: {figures(first)}")
    print(f"last  {WINDOW}: {figures(last)}")
    print(f"last/first overhead: {statistics.mean(overhead[i] for i in last) / statistics.mean(overhead[i] for i in first):.2f}"
          f"  cpu: {statistics.mean(cpu[i] for i in last) / statistics.mean(cpu[i] for i in first):.2f}")


if __name__ == "__main__":
    main()
