"""The Ray executor against the local one: the same sleep jobs through 1, 2 and 4 slots.

Starts a local Ray cluster of two nodes on this machine (tests/raycluster.py: `ray start --head`
and `ray start --address`, no dashboard, no usage statistics) and stops it and everything it
started at the end. For each slot count N it submits J jobs of a sleep trainer (B seconds) to a
LocalExecutor with N slots, to a RayExecutor on the head node alone ({"CPU": 1, "solo": 1} per
job: only the head has "solo") and to one over both nodes ({"CPU": 1}: the jobs spread), each
with `slots` = N, and prints experiments per hour, the scaling against one slot (target >= 0.9 x N)
and each executor's overhead per job: wall x slots / J - B, in ms.

    python benchmarks/cluster.py [--budget 1.0] [--jobs 8]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, make_repo  # noqa: E402  (puts the repo root on sys.path)

sys.path.insert(0, str(ROOT / "tests"))
from raycluster import LocalCluster  # noqa: E402

from harness.config.load import resolve  # noqa: E402
from harness.executors import Job, LocalExecutor  # noqa: E402
from harness.executors.ray_executor import RayExecutor  # noqa: E402

TRAIN = """import time
SLEEP_S = {budget}
time.sleep(SLEEP_S)
print("---")
print("val_bpb: 1.0")
"""
SLOTS = (1, 2, 4)
ONE_NODE = {"CPU": 1, "solo": 1}  # only the head node has the "solo" resource
TWO_NODES = {"CPU": 1}


def timed(executor, cfg, commit: str, jobs: int, tag: str) -> float:
    """Wall seconds for `jobs` jobs submitted at once."""
    t0 = time.monotonic()
    futures = [executor.submit(Job(cfg, commit, i, cfg.logs_dir / f"{tag}-{i}.log")) for i in range(jobs)]
    results = [f.result() for f in futures]
    wall = time.monotonic() - t0
    bad = [r for r in results if r.status != "ok"]
    if bad:
        raise SystemExit(f"{tag}: {len(bad)} job(s) failed: {bad[0].reason}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=1.0, help="seconds each job sleeps")
    ap.add_argument("--jobs", type=int, default=8, help="jobs per configuration")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rb-", dir="/tmp") as tmp:
        temp = Path(tmp)
        repo = make_repo(temp / "repo", TRAIN.format(budget=args.budget))
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
        cfg = resolve(repo, "bench", {})
        cluster = LocalCluster(temp / "cluster")
        try:
            cluster.start("head", cpus=max(SLOTS), resources={"solo": max(SLOTS)})
            cluster.start("b", cpus=max(SLOTS))
            rows = []
            for n in SLOTS:
                local = LocalExecutor(repo, temp / f"slots-{n}", tuple(str(i) for i in range(n)))
                try:
                    walls = [timed(local, cfg, commit, args.jobs, f"local{n}")]
                finally:
                    local.close()
                for name, resources in (("one", ONE_NODE), ("two", TWO_NODES)):
                    ray_ex = RayExecutor(repo, temp / f"ray-{name}-{n}", cluster.address, resources, slots=n)
                    try:
                        timed(ray_ex, cfg, commit, n, f"warm{name}{n}")  # worker processes started once
                        walls.append(timed(ray_ex, cfg, commit, args.jobs, f"ray{name}{n}"))
                    finally:
                        ray_ex.close()
                rows.append((n, walls))
        finally:
            cluster.stop()
    print(f"{args.jobs} jobs of {args.budget:g}s per configuration; Ray on one node and on two nodes")
    labels = ("local", "ray 1 node", "ray 2 nodes")
    print(f"{'slots':>5} " + " ".join(f"{label + ' ' + what:>{len(label) + 8}}" for what in ("exp/h", "scale", "ms/job")
                                     for label in labels))
    for n, walls in rows:
        per = [(w * n / args.jobs - args.budget) * 1000 for w in walls]
        cells = ([args.jobs / w * 3600 for w in walls], [base / w for base, w in zip(rows[0][1], walls)], per)
        print(f"{n:>5} " + " ".join(f"{v:>{len(label) + 8}.{2 if k == 1 else 0}f}" for k, values in enumerate(cells)
                                    for label, v in zip(labels, values)))


if __name__ == "__main__":
    main()
