"""Executors' close() is bounded: a job thread that never returns is reported and left, not waited on.
(The Ray executor's: tests/test_ray_faults.py.)"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from harness.config import load as config
from harness.executors import Job, LocalExecutor, local

from conftest import git, make_repo


def test_a_hung_local_job_thread_does_not_hold_close(tmp_path: Path, monkeypatch):
    never = threading.Event()
    started = threading.Event()

    def hangs(*args, **kwargs):  # a job thread that ignores its cancel and never returns
        started.set()
        never.wait()

    monkeypatch.setattr(local, "train_half", hangs)  # the training half, where the job thread waits on its job
    monkeypatch.setattr(local, "CLOSE_S", 1.0)
    repo = make_repo(tmp_path / "research")
    cfg = config.resolve(repo, "hung", {})
    executor = LocalExecutor(repo, cfg.run_dir / "slots")
    future = executor.submit(Job(cfg, git(repo, "rev-parse", "HEAD"), 1, cfg.logs_dir / "hung.log"))
    assert started.wait(30)
    t0 = time.monotonic()
    executor.close()
    assert time.monotonic() - t0 < 10
    assert not future.done()
    events = [json.loads(line) for line in (cfg.run_dir / "events.log").read_text().splitlines()]
    hung = [e for e in events if e["kind"] == "hung_thread"]
    assert len(hung) == 1 and "job-hung" in hung[0]["message"] and "1 s" in hung[0]["message"]
    assert (cfg.run_dir / "slots" / "0").exists()  # the hung job's worktree is left to --resume
    executor.close()  # once: a second close does not wait again
    never.set()


def test_a_future_settled_by_two_threads_takes_the_first_and_logs_nothing(caplog):
    """The Ray executor settles a job's future itself when the cluster goes away, and the job's thread
    settles it again later: neither may print concurrent.futures' CRITICAL "unexpected state" line
    on the user's terminal, and the first settlement stands."""
    from concurrent.futures import Future

    from harness.executors.base import begin, settle

    running = Future()
    assert begin(running)  # the job's thread has it
    gone = RuntimeError("the cluster went away")
    assert settle(running, exc=gone) is True  # the executor's watcher settles it first
    assert settle(running, exc=ValueError("the thread's own finding")) is False
    assert running.exception() is gone
    pending = Future()
    assert settle(pending, exc=gone) is True and pending.exception() is gone
    cancelled = Future()
    assert cancelled.cancel() and settle(cancelled, exc=gone) is False
    assert not [r for r in caplog.records if r.name == "concurrent.futures"], caplog.text
