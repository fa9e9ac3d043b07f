"""The harness's own overhead per iteration: wall time minus researcher and training time.

An instant researcher (rewrites one number) and a no-op trainer (prints a result at once),
over N iterations in a real temporary git repo. Prints the mean overhead of the first and
last 10 iterations and their ratio: it should stay well under a second and flat.

    python benchmarks/overhead.py [--iterations 100]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import make_repo  # noqa: E402  (puts the repo root on sys.path)

from harness.driver import loop as driver  # noqa: E402
from harness import ledger  # noqa: E402
from harness.agents import Proposal  # noqa: E402
from harness.config.load import resolve  # noqa: E402

TRAIN = "VALUE = 1.0\nprint('---')\nprint(f'val_bpb: {VALUE}')\nprint('peak_vram_mb: 0')\n"


class InstantResearcher:
    name = "instant"
    model = None

    def describe(self):
        return {"backend": "instant"}

    def propose(self, task):
        train = task.worktree / "train.py"
        value = 1.0 - task.iteration * 1e-4 if task.iteration % 3 == 0 else 2.0 + task.iteration * 1e-4
        train.write_text(TRAIN.replace("VALUE = 1.0", f"VALUE = {value!r}"))
        return Proposal(f"VALUE {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = make_repo(Path(tmp) / "repo", TRAIN)
        cfg = resolve(repo, "bench", {"iterations": args.iterations})
        t0 = time.monotonic()
        driver.run(cfg, researcher=InstantResearcher())
        total = time.monotonic() - t0
        rows = [r for r in ledger.read_rows(cfg.ledger_path) if r["iteration"] and r["status"] != "repeat"]
    overhead = [r["wall_s"] - (r["agent_s"] or 0) - (r["train_s"] or 0) for r in rows]
    first, last = statistics.mean(overhead[:10]), statistics.mean(overhead[-10:])
    train = statistics.mean(r["train_s"] or 0 for r in rows)
    print(f"iterations: {len(rows)}  total wall: {total:.1f}s  mean no-op training job: {train * 1000:.0f} ms")
    print(f"harness overhead per iteration: first 10 {first * 1000:.0f} ms, last 10 {last * 1000:.0f} ms, "
          f"last/first {last / first:.2f}")


if __name__ == "__main__":
    main()
