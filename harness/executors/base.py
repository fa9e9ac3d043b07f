"""The executor interface: submit(job) -> future, in the shape of concurrent.futures.

A Job names a commit, not a path, so the same candidate can train on this machine or on a
cluster node; it carries the run's trusted baseline (commit, protected files' hashes, start-up
allowance), so every executor judges a job by the same figures, held by the supervisor. The future's result() is a TrainResult; cancel() stops a job that waits for a
slot or is running (its process group is killed); a cancelled running job's result() raises
KeyboardInterrupt, as an interrupted training does.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..config import RunConfig
from ..workload.runner import TrainResult


class Cancel:
    """A job's cancel flag: set by the job's own future, or by any event it follows (the run's stop)."""

    def __init__(self) -> None:
        self.own = threading.Event()
        self.parents: list[threading.Event] = []

    def follow(self, event: threading.Event) -> None:
        self.parents.append(event)

    def set(self) -> None:
        self.own.set()

    def is_set(self) -> bool:
        return self.own.is_set() or any(e.is_set() for e in self.parents)


@dataclass
class Job:
    cfg: RunConfig  # how the run trains: command, metric, budget, deadline, protected files
    commit: str  # what to train
    seed: int
    log_path: Path  # the job's whole output
    iteration: int | None = None  # the ledger's iteration it trains for (HARNESS_ITERATION), if any
    cancel: Cancel = field(default_factory=Cancel)
    # The run's trusted baseline, from the supervisor's memory (trust.Baseline), never from a file:
    baseline: str = ""  # the commit whose protected files evaluate the job ("" = a throwaway run's: its own)
    protected_sha256: dict[str, str] = field(default_factory=dict)  # those files' sha256, recorded at the start
    allowance_s: float | None = None  # s, the start-up allowance it is judged by; None = not judged (a baseline run)
    baseline_cpu_s: float | None = None  # the baseline's CPU rate, for a job on a busy machine (integrity/budget.py); None = unmeasured
    baseline_gpu_s: float | None = None  # the baseline's GPU time, for a job on a shared GPU (integrity/budget.py); None = unmeasured
    successor: bool = True  # the run may start another job after this one: its slot readies an interpreter for it
    # (warm.py); False = the run foresees none (its last candidate's, its last test-split job's)

    @property
    def name(self) -> str:
        return self.log_path.stem


class JobFuture(Future):
    """A Future[TrainResult] whose cancel() also stops a running job."""

    def __init__(self, job: Job):
        super().__init__()
        self.job = job

    def cancel(self) -> bool:
        self.job.cancel.set()
        return super().cancel()


def begin(future: Future) -> bool:
    """Mark a job's future running; False when it was cancelled, or settled already (base.settle)."""
    try:
        return future.set_running_or_notify_cancel()
    except RuntimeError:
        return False


def settle(future: Future, result: TrainResult | None = None, exc: BaseException | None = None) -> bool:
    """Give future its result or error unless it has one already (the Ray executor settles a job's
    future itself when the cluster goes away; its thread's later finding is dropped). True if set."""
    if future.done():
        return False
    try:  # not when it runs already (this thread's): concurrent.futures logs that as CRITICAL
        if not future.running() and future.set_running_or_notify_cancel() is False:
            return False
    except RuntimeError:  # began or settled by another thread meanwhile (set_* below tells which)
        pass
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
        return True
    except InvalidStateError:
        return False


def join_bounded(threads: list[threading.Thread], timeout_s: float, folder: Path, what: str) -> list[str]:
    """Join threads for timeout_s in all; one still running is reported (an event `hung_thread` in
    folder's events.log) and left, never waited on forever (daemon threads: they do not hold the exit)."""
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [t.name for t in threads if t.is_alive()]
    if hung:
        from ..ledger import events
        try:
            events.record(folder, "hung_thread", f"{len(hung)} {what} thread(s) did not end within {timeout_s:g} s "
                                                 f"of the stop and were left: {', '.join(hung)}", threads=hung)
        except OSError:
            pass
    return hung


class Executor(Protocol):
    def slots(self) -> int:
        """How many jobs can run at once."""
        ...

    def submit(self, job: Job) -> JobFuture: ...

    def run(self, job: Job) -> TrainResult:
        """submit(job).result(); a KeyboardInterrupt while waiting cancels the job."""
        ...

    def close(self) -> None:
        """Cancel every job, wait for them to be gone, release what the executor holds."""
        ...


class ThreadedExecutor:
    """What the executors share: a thread per submitted job; run() = submit(job).result(), and a
    KeyboardInterrupt while waiting cancels the job."""

    threads: list[threading.Thread]
    cond: threading.Condition
    closed: bool
    thread_prefix = "job"

    def submit(self, job: Job) -> JobFuture:
        future = JobFuture(job)
        with self.cond:
            if self.closed:
                future.set_exception(KeyboardInterrupt("the executor is closed"))
                return future
            self._enqueue(future)
        self._start(self._work, future, f"{self.thread_prefix}-{job.name}")
        return future

    def _enqueue(self, future: JobFuture) -> None:
        raise NotImplementedError

    def _work(self, future: JobFuture) -> None:
        raise NotImplementedError

    def run(self, job: Job) -> TrainResult:
        future = self.submit(job)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            raise

    def _start(self, target, future: JobFuture, name: str) -> None:
        thread = threading.Thread(target=target, args=(future,), name=name, daemon=True)
        self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        thread.start()
