"""What the warm start saves per experiment: the same job on the bundled workload, started cold and
handed to a warm interpreter, interleaved in one run (cold, warm, cold, warm, ...).

The bundled train.py and prepare.py (`harness init --example`), sandboxed with the separate
evaluation, step-bounded (`--steps`, so every job does the same work), through the local executor
as a night runs it. A job's `train_s` is the harness's clock: from the process's start for a cold
job, from the handover for a warm one, so their difference is the start-up the slot no longer
waits for (the interpreter, its imports, the first read of the training split). The figures the
two starts report must be the same (same seed, same steps).

    python benchmarks/warm_start.py [--pairs 5] [--steps 20]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import ROOT  # noqa: F401  (puts the repo root on sys.path)

from harness.commands.initrepo import init_example  # noqa: E402
from harness.config.load import resolve  # noqa: E402
from harness.executors import Job, LocalExecutor  # noqa: E402
from harness.gitgate import GitGate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="cold + warm measurements")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per job")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = init_example(Path(tmp) / "example")  # committed, clean
        common = {"max_steps": args.steps, "time_budget": 1800, "kill_after": 1800, "sandbox": "bwrap"}
        warm_cfg = resolve(repo, "bench", common)
        cold_cfg = resolve(repo, "bench", {**common, "warm_start": False})
        warm_cfg.run_dir.mkdir(parents=True, exist_ok=True)
        head = GitGate(repo).repo.head.commit.hexsha
        ex = LocalExecutor(repo, warm_cfg.run_dir / "slots")
        times: dict[str, list[float]] = {"cold": [], "warm": []}
        figures: set[float] = set()
        n = 0
        try:
            for _ in range(args.pairs):
                for cfg in (cold_cfg, warm_cfg, warm_cfg):  # the second warm_cfg job is handed over warm
                    n += 1
                    result = ex.run(Job(cfg, head, 42, cfg.run_dir / "logs" / f"job-{n}.log"))
                    assert result.status == "ok", result.reason
                    figures.add(round(result.metrics["val_bpb"], 6))
                    if cfg is cold_cfg or result.start == "warm":
                        times[result.start].append(result.train_s)
                    if cfg is warm_cfg and result.start == "cold":  # the job that readies the next
                        deadline = time.monotonic() + 60
                        while ex.all[0].ready is None and time.monotonic() < deadline:
                            time.sleep(0.05)
        finally:
            ex.close()
    cold, warm = statistics.median(times["cold"]), statistics.median(times["warm"])
    print(f"bundled workload, {args.steps} steps per job, sandboxed, {args.pairs} cold and "
          f"{len(times['warm'])} warm jobs, interleaved:")
    print(f"  cold start   train_s median {cold:6.2f}s  ({', '.join(f'{t:.2f}' for t in times['cold'])})")
    print(f"  warm start   train_s median {warm:6.2f}s  ({', '.join(f'{t:.2f}' for t in times['warm'])})")
    print(f"  saved per experiment: {cold - warm:.2f}s of the slot's time ({(cold - warm) / cold:.0%} of a cold job "
          f"of {args.steps} steps); val_bpb {'the same' if len(figures) == 1 else 'DIFFERS: ' + str(sorted(figures))}")


if __name__ == "__main__":
    main()
