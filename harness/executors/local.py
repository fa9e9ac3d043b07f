"""The local executor: jobs on this machine, one slot per listed GPU (or one, on the inherited GPU).

Each slot has its own detached worktree under `runs/<tag>/slots/<i>`, where the job's commit
is materialised (reset --hard and clean) before it trains, so a researcher can keep editing
its own worktree meanwhile. Slots are handed out first come, first served: two A/B arms on one
GPU alternate. Training itself (`train_once`): protected files checked and restored before and
checked after, the seal channel, the process under the run's supervisor and the hard deadline.

A job holds its slot while it trains, not while it is evaluated: once its training process is
over and checked (evaluation.train_job), the slot goes to the next job in the queue and the
separate evaluation (evaluation.finish) runs beside it; the job's future resolves when the
evaluation is done. Each slot has one evaluation at a time (`Slot.scoring`): a job whose
training ends while its slot's previous evaluation still runs keeps the slot until that one is
over, so evaluations never pile up behind a trainer that is faster than its evaluator.
"""
from __future__ import annotations

import collections
import shutil
import socket
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import track
from ..config import RunConfig
from ..gitgate import GitGate, Worktree
from ..workload.runner import TrainResult
from . import evaluation
from .base import Job, JobFuture, ThreadedExecutor, join_bounded

CLOSE_S = 60.0  # s close() waits for the job threads after cancelling them (a job is killed in seconds)


def train_once(cfg: RunConfig, worktree: Path, log_path: Path, seed: int, gpu: str | None = None,
               cancel: threading.Event | None = None, iteration: int | None = None,
               commit: str | None = None, trusted: dict[str, Any] | None = None) -> TrainResult:
    """Train the code in worktree once under the hard deadline (cancel set = KeyboardInterrupt):
    sandboxed, timed by the harness, protected files checked before and after, the metric from the
    workload's separate evaluation when it has one (evaluation.py). trusted: the run's baseline as
    the Job carries it (baseline, protected_sha256, allowance_s, baseline_cpu_s); None = a throwaway run's."""
    return scored(evaluation.finish(train_half(cfg, worktree, log_path, seed, gpu, cancel, iteration, commit,
                                               trusted), cancel))


def train_half(cfg: RunConfig, worktree: Path, log_path: Path, seed: int, gpu: str | None = None,
               cancel: threading.Event | None = None, iteration: int | None = None,
               commit: str | None = None, trusted: dict[str, Any] | None = None
               ) -> evaluation.Trained | TrainResult:
    """train_once's first half: the training process, checked; its evaluation still to run."""
    return evaluation.train_job(cfg, worktree, log_path, seed, cancel=cancel, gpu=gpu,
                                job_env=track.job_env(cfg, iteration, commit), **(trusted or {}))


def scored(result: TrainResult) -> TrainResult:
    return replace(result, node=result.node or socket.gethostname())  # the ledger's node column


def trusted_fields(job: Job) -> dict[str, Any]:
    """What a job carries of the run's trusted baseline, as train_once takes it."""
    return {"baseline": job.baseline, "protected_sha256": dict(job.protected_sha256), "allowance_s": job.allowance_s,
            "baseline_cpu_s": job.baseline_cpu_s, "baseline_gpu_s": job.baseline_gpu_s}


@dataclass
class Slot:
    index: int
    gpu: str | None
    path: Path
    worktree: Worktree | None = None
    scoring: threading.Lock = field(default_factory=threading.Lock)  # held by the one evaluation of its last job


class LocalExecutor(ThreadedExecutor):
    def __init__(self, repo: Path, root: Path, gpus: tuple[str, ...] = ()):
        self.gate = GitGate(repo)
        self.root = Path(root)
        self.free = [Slot(i, gpu, self.root / str(i)) for i, gpu in enumerate(gpus or (None,))]
        self.all = list(self.free)
        self.gpus = {slot.gpu for slot in self.all if slot.gpu is not None}
        self.count = len(self.free)
        self._remove_leftovers()
        self.waiting: collections.deque[JobFuture] = collections.deque()
        self.running: set[JobFuture] = set()
        self.cond = threading.Condition()
        self.git_lock = threading.Lock()  # worktree add/prune of two slots at once would race
        self.threads: list[threading.Thread] = []
        self.closed = False

    def slots(self) -> int:
        return self.count

    thread_prefix = "job"

    def _enqueue(self, future: JobFuture) -> None:
        self.waiting.append(future)

    def _take(self, future: JobFuture) -> Slot | None:
        """Wait until a slot this job may use is free and no job before it waits for that slot;
        None when it was cancelled. A job whose run names a GPU of this executor (an A/B arm
        scheduled in parallel, `gpu` in its settings) runs on that GPU's slot only."""
        with self.cond:
            while True:
                if future.job.cancel.is_set() or self.closed:
                    self.waiting.remove(future)
                    self.cond.notify_all()
                    return None
                slot = next((s for s in self.free if self._fits(future, s)), None)
                ahead = self.waiting.index(future)
                if slot is not None and not any(self._fits(f, slot) for f in list(self.waiting)[:ahead]):
                    self.waiting.remove(future)
                    self.running.add(future)
                    self.free.remove(slot)
                    self.cond.notify_all()
                    return slot
                self.cond.wait(0.2)

    def _fits(self, future: JobFuture, slot: Slot) -> bool:
        want = getattr(future.job.cfg, "gpu", None)
        return want is None or want not in self.gpus or slot.gpu == want

    def _give(self, future: JobFuture | None, slot: Slot) -> None:
        """slot free for the next job; future (when given) no longer running."""
        with self.cond:
            if future is not None:
                self.running.discard(future)
            if slot not in self.free:
                self.free.append(slot)
                self.free.sort(key=lambda s: s.index)
            self.cond.notify_all()

    def _done(self, future: JobFuture) -> None:
        with self.cond:
            self.running.discard(future)
            self.cond.notify_all()

    overlaps = True  # a job's evaluation runs beside the next job's training (the driver may queue it)

    def _work(self, future: JobFuture) -> None:
        slot = self._take(future)
        if slot is None:  # cancelled while it waited for a slot
            if future.set_running_or_notify_cancel():
                future.set_exception(KeyboardInterrupt("training cancelled"))
            return
        if not future.set_running_or_notify_cancel():
            self._give(future, slot)
            return
        job, trained = future.job, None
        try:
            wt = self._materialise(slot, job.commit)
            job.log_path.parent.mkdir(parents=True, exist_ok=True)
            trained = train_half(job.cfg, wt.path, job.log_path, job.seed, slot.gpu, job.cancel, job.iteration,
                                 job.commit, trusted_fields(job))
            if isinstance(trained, evaluation.Trained) and trained.scored:
                self._scoring_turn(slot, job)  # the slot's previous evaluation over (the slot held meanwhile)
            else:
                trained = scored(evaluation.finish(trained, job.cancel))  # nothing to evaluate: at once
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
            if isinstance(trained, evaluation.Trained):  # cancelled before its evaluation: its folders go
                shutil.rmtree(trained.space.root, ignore_errors=True)
            self._give(future, slot)
            future.set_exception(e)
            return
        self._give(None, slot)  # the next job trains while this one is evaluated
        with self.cond:  # a job waits for a slot, or trains in one: the evaluation yields the CPU to it
            beside = bool(self.waiting) or len(self.free) < self.count
        if isinstance(trained, TrainResult):
            self._done(future)
            future.set_result(trained)
            return
        try:
            result = scored(evaluation.finish(trained, job.cancel, overlap_s=job.cfg.kill_after, beside=beside))
        except BaseException as e:  # noqa: BLE001
            self._done(future)
            future.set_exception(e)
            return
        finally:
            slot.scoring.release()
        self._done(future)
        future.set_result(result)

    def _scoring_turn(self, slot: Slot, job: Job) -> None:
        """Wait for slot's evaluation turn (its previous job's evaluation over); KeyboardInterrupt
        when the job is cancelled meanwhile (its folders removed: nothing will evaluate it)."""
        while not slot.scoring.acquire(timeout=0.2):
            if job.cancel.is_set() or self.closed:
                raise KeyboardInterrupt("training cancelled")

    def _materialise(self, slot: Slot, commit: str) -> Worktree:
        with self.git_lock:
            if slot.worktree is None:
                slot.worktree = self.gate.detached_worktree(slot.path, commit)
            else:
                slot.worktree.reset_hard(commit)
        return slot.worktree

    def close(self) -> None:
        """Cancel every job (running ones are killed), wait for them (CLOSE_S at most: a thread still
        there is reported and left, its slot's worktree too, for --resume to remove), remove the
        slots' worktrees."""
        with self.cond:
            if self.closed:  # once (the driver's stop, then its exit)
                return
            self.closed = True
            for f in [*self.waiting, *self.running]:
                f.job.cancel.set()
            self.cond.notify_all()
        hung = join_bounded(self.threads, CLOSE_S, self.root.parent, "training job")
        with self.cond:
            busy = [s for s in self.all if s not in self.free] if hung else []
        with self.git_lock:
            for slot in self.all:
                if slot in busy:
                    continue
                if slot.worktree is not None:
                    slot.worktree.close()
                slot.worktree = None
            self._remove_leftovers(skip={s.path for s in busy})

    def _remove_leftovers(self, skip: set[Path] = frozenset()) -> None:
        """Slot worktrees of this executor, or of a supervisor that was killed: removed, pruned."""
        if self.root.exists():
            for path in sorted(self.root.iterdir()):
                if path not in skip:
                    self.gate.remove_worktree(path)
            self.gate.prune()
