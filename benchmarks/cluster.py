"""The Ray executor against the local one: the same sleep jobs through 1, 2 and 4 slots.

Starts a local Ray head node (`ray start --head --block`, fake CPU count = the most slots, no
dashboard) and stops it and everything it started at the end. For each slot count it submits
J jobs of a sleep trainer (B seconds) to a LocalExecutor and to a RayExecutor with {"CPU": 1}
per job and `slots` = N, and prints experiments per hour, the scaling against one slot
(target >= 0.9 x N), and each executor's overhead per job: wall x slots / J - B, in ms.

    python benchmarks/cluster.py [--budget 1.0] [--jobs 8]
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from common import ROOT, make_repo  # noqa: E402  (puts the repo root on sys.path)

from harness import supervise  # noqa: E402
from harness.config import resolve  # noqa: E402
from harness.executors import Job, LocalExecutor  # noqa: E402
from harness.executors.ray_executor import RayExecutor  # noqa: E402

TRAIN = """import time
SLEEP_S = {budget}
time.sleep(SLEEP_S)
print("---")
print("val_bpb: 1.0")
"""
SLOTS = (1, 2, 4)


def start_head(cpus: int, temp: Path) -> tuple[subprocess.Popen, str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = uuid.uuid4().hex
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT), supervise.TOKEN_VAR: token,
           "HARNESS_RAY_WORK_DIR": str(temp / "work")}
    head = subprocess.Popen(["ray", "start", "--head", "--block", "--port", str(port), "--num-cpus", str(cpus),
                             "--num-gpus", "0", "--include-dashboard=false", "--disable-usage-stats",
                             "--temp-dir", str(temp / "ray")], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"127.0.0.1:{port}"
    probe = (f"import ray, time\nray.init(address={address!r}, log_to_driver=False)\n"
             f"while ray.cluster_resources().get('CPU', 0) < {cpus}: time.sleep(0.2)\n")
    subprocess.run([sys.executable, "-c", probe], env=env, check=True, timeout=120, capture_output=True)
    return head, address, token


def stop_head(head: subprocess.Popen, token: str) -> None:
    try:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    supervise._kill_all(lambda: supervise.members(pgid=head.pid, token=token), grace_s=2.0)


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
        head, address, token = start_head(max(SLOTS), temp)
        try:
            rows = []
            for n in SLOTS:
                local = LocalExecutor(repo, temp / f"slots-{n}", tuple(str(i) for i in range(n)))
                try:
                    wall_local = timed(local, cfg, commit, args.jobs, f"local{n}")
                finally:
                    local.close()
                ray_ex = RayExecutor(repo, temp / f"ray-{n}", address, {"CPU": 1}, slots=n)
                try:
                    timed(ray_ex, cfg, commit, n, f"warm{n}")  # worker processes started once
                    wall_ray = timed(ray_ex, cfg, commit, args.jobs, f"ray{n}")
                finally:
                    ray_ex.close()
                rows.append((n, wall_local, wall_ray))
        finally:
            stop_head(head, token)
    base_local, base_ray = rows[0][1], rows[0][2]
    print(f"{args.jobs} jobs of {args.budget:g}s per configuration")
    print(f"{'slots':>5} {'local exp/h':>12} {'ray exp/h':>10} {'local scale':>12} {'ray scale':>10} "
          f"{'local ms/job':>13} {'ray ms/job':>11}")
    for n, wl, wr in rows:
        per = lambda w: (w * n / args.jobs - args.budget) * 1000  # noqa: E731
        print(f"{n:>5} {args.jobs / wl * 3600:>12.0f} {args.jobs / wr * 3600:>10.0f} {base_local / wl:>12.2f} "
              f"{base_ray / wr:>10.2f} {per(wl):>13.0f} {per(wr):>11.0f}")


if __name__ == "__main__":
    main()
