"""The Ray executor's faults on a real local Ray cluster (tests/raycluster.py): a signal to the
supervisor mid-training, the cluster's head killed mid-run, Ray's resource errors, a job thread
that never returns. tests/test_ray.py has the lost workers and nodes.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed: pip install -e '.[ray]'")

from harness.lifecycle import faults  # noqa: E402
from harness import ledger

from conftest import ROOT, FAKE_TRAIN, git, make_repo  # noqa: E402
from raycluster import LocalCluster, processes_under, wait_for  # noqa: E402
from test_ray import CPU_JOB, ray_run  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(Path(tmp_path_factory.mktemp("ray")))
    try:
        head = c.start("head", cpus=2)
        yield {"address": c.address, "work": head.work}
    finally:
        c.stop()


def held_repo(path: Path, flag: Path) -> Path:
    """A repo whose iteration 1 job waits while flag exists (it says so in its log first)."""
    hold = (f"import os as _os, time as _time\nif _os.environ.get('HARNESS_ITERATION') == '1':\n"
            f"    print('holding', flush=True)\n    while _os.path.exists({str(flag)!r}):\n        _time.sleep(0.1)\n")
    return make_repo(path, hold + FAKE_TRAIN, kill_after=120)


def argv(repo: Path, address: str, tag: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "harness", "run", "--repo", str(repo), "--tag", tag, "--executor", "ray",
            "--ray-address", address, "--job-resources", CPU_JOB, "--agent", "mutate", "--baseline-runs", "1",
            "--slots", "1", "--iterations", "2", *extra]


def holding(run_dir: Path) -> bool:
    logs = list((run_dir / "logs").glob("iter-0001*.log")) if (run_dir / "logs").exists() else []
    return any("holding" in p.read_text(errors="replace") for p in logs)


def events_of(run_dir: Path, kind: str) -> list[dict]:
    path = run_dir / "events.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines) if e["kind"] == kind]


def each_once(run_dir: Path) -> list[dict]:
    rows = ledger.read_rows(run_dir / "results.tsv")
    assert sorted(r["iteration"] for r in rows) == [0, 1, 2], rows  # every experiment once, none lost
    assert not any("interrupted" in r["description"] for r in rows)
    return rows


ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_sigterm_mid_training_exits_143_and_resumes(tmp_path: Path, cluster):
    """ray.init replaces SIGTERM's handler: the harness's are put back, so a SIGTERM is the clean stop."""
    flag = tmp_path / "hold"
    flag.touch()
    repo = held_repo(tmp_path / "research", flag)
    run_dir = repo / "runs" / "t"
    first = subprocess.Popen(argv(repo, cluster["address"], "t"), env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for(lambda: holding(run_dir), timeout_s=180)
        os.kill(first.pid, signal.SIGTERM)
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    text = out.decode() + err.decode()
    assert first.returncode == 143, text  # 128 + SIGTERM, not Ray's exit or an abort (134)
    assert "interrupted (SIGTERM)" in text and "--resume" in text, text
    assert "interrupted (SIGTERM)" in (run_dir / "summary.txt").read_text()
    assert list(run_dir.glob("inflight-*.json"))  # the candidate in training kept for --resume
    wait_for(lambda: not processes_under(cluster["work"], running="train.py"), timeout_s=30)  # its job stopped
    flag.unlink()
    second = subprocess.run([*argv(repo, cluster["address"], "t"), "--resume"], env=ENV, capture_output=True,
                            timeout=300)
    assert second.returncode == 0, second.stderr.decode()
    rows = each_once(run_dir)
    assert rows[0]["description"] == "baseline"


def test_head_killed_mid_run_stops_cleanly_and_resumes(tmp_path: Path):
    """The head goes away: no raise out of slots() or a job, no Ray exit: a clear stop, journals kept,
    exit 1; a new cluster and --resume finish the night with every experiment once."""
    flag = tmp_path / "hold"
    flag.touch()
    repo = held_repo(tmp_path / "research", flag)
    run_dir = repo / "runs" / "h"
    old = LocalCluster(tmp_path / "ray1")
    new = None
    try:
        head = old.start("head", cpus=2)
        env = {**ENV, "HARNESS_RAY_GRACE_S": "3"}
        first = subprocess.Popen(argv(repo, old.address, "h"), env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)
        try:
            wait_for(lambda: holding(run_dir), timeout_s=180)
            t0 = time.monotonic()
            old.kill(head)  # the head and everything on it, as a machine is lost
            out, err = first.communicate(timeout=120)
            took = time.monotonic() - t0
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
        text = " ".join((out.decode() + err.decode()).split())
        assert first.returncode == 1, text
        assert "went away" in text and "--resume" in text, text
        assert took < 60, took  # the harness's own stop, before Ray's driver would exit by itself
        assert events_of(run_dir, "cluster_gone")
        assert list(run_dir.glob("inflight-*.json"))  # the candidate in flight kept
        rows = ledger.read_rows(run_dir / "results.tsv")
        assert [r["iteration"] for r in rows] == [0]  # nothing recorded for the candidate the cluster lost
        flag.unlink()
        new = LocalCluster(tmp_path / "ray2")
        new.start("head", cpus=2)
        second = subprocess.run([*argv(repo, new.address, "h"), "--resume"], env=ENV, capture_output=True,
                                timeout=300)
        assert second.returncode == 0, second.stderr.decode()
        each_once(run_dir)
        assert not list((run_dir / "ray-tasks").glob("*.json"))
    finally:
        old.stop()
        if new is not None:
            new.stop()


def test_ray_resource_errors_are_retried_then_infrastructure(tmp_path: Path, cluster, monkeypatch):
    """The task raises Ray's errors on the node (faults.RAY_ENV): attempt 1 (the baseline) out of memory,
    retried; iteration 1's both attempts an object store full: an infrastructure row; iteration 2's
    first out of disk, retried. The run goes on to its end."""
    from harness.lifecycle import health
    monkeypatch.setenv(faults.RAY_ENV, "OutOfMemoryError:1,ObjectStoreFullError:3+4,OutOfDiskError:5")
    monkeypatch.setitem(faults._ray, "attempts", 0)
    repo = make_repo(tmp_path / "research")
    ray_run(repo, cluster, "res", "--iterations", "2", "--slots", "1")
    run_dir = repo / "runs" / "res"
    rows = ledger.read_rows(run_dir / "results.tsv")
    by_iter = {r["iteration"]: r for r in rows}
    assert sorted(by_iter) == [0, 1, 2] and len(rows) == 3
    assert by_iter[0]["status"] == "keep"
    assert by_iter[1]["status"] == "crash"
    assert "[infrastructure: ObjectStoreFullError" in by_iter[1]["description"]
    assert "; then ObjectStoreFullError" in by_iter[1]["description"]
    assert by_iter[2]["status"] in ("keep", "discard")
    assert by_iter[1] not in health.candidates(rows)
    infra = [e["message"] for e in events_of(run_dir, "infrastructure")]
    assert len(infra) == 4, infra
    assert "OutOfMemoryError" in infra[0] and "retrying" in infra[0]
    assert "OutOfDiskError" in infra[3] and "retrying" in infra[3]


def test_a_hung_job_thread_does_not_hold_close(tmp_path: Path, cluster, monkeypatch):
    from harness.config import load as config
    from harness.executors import Job, make_executor, ray_executor
    never = threading.Event()
    monkeypatch.setattr(ray_executor.RayExecutor, "_train", lambda self, job: never.wait())
    monkeypatch.setattr(ray_executor, "CLOSE_S", 2.0)
    repo = make_repo(tmp_path / "research")
    cfg = config.resolve(repo, "hung", {"executor": "ray", "ray_address": cluster["address"],
                                        "job_resources": CPU_JOB})
    executor = make_executor(cfg, repo, cfg.run_dir)
    job = Job(cfg, git(repo, "rev-parse", "HEAD"), 1, cfg.logs_dir / "hung.log")
    future = executor.submit(job)
    wait_for(lambda: future.running())
    t0 = time.monotonic()
    executor.close()
    assert time.monotonic() - t0 < 2.0 + ray_executor.SHUTDOWN_S
    hung = events_of(cfg.run_dir, "hung_thread")
    assert len(hung) == 1 and "ray-hung" in hung[0]["message"]
    never.set()
