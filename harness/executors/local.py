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

Warm start (warm.py): each slot has a second worktree (`spare`). Once a job runs, the slot readies
its next one there: the spare is reset to the job's commit and cleaned, and an interpreter is
started in it, under the sandbox, bounds and environment the run's jobs get, with its imports
done. The slot's next job is handed to it when its start is the same (else it is discarded and
the job starts cold); the two worktrees then change places.
"""
from __future__ import annotations

import collections
import concurrent.futures
import shutil
import itertools
import socket
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import track
from ..ledger import events
from ..config import RunConfig
from ..gitgate import GitGate, Worktree
from ..workload.runner import TrainResult
from . import evaluation, warm
from .base import Job, JobFuture, ThreadedExecutor, join_bounded

CLOSE_S = 60.0  # s close() waits for the job threads after cancelling them (a job is killed in seconds)
WARM_WAIT_S = 30.0  # s a job waits for its slot's next interpreter still being readied (a git reset, a spawn)


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
               commit: str | None = None, trusted: dict[str, Any] | None = None,
               ready: warm.Warm | None = None, on_start=None) -> evaluation.Trained | TrainResult:
    """train_once's first half: the training process, checked; its evaluation still to run.
    ready: an interpreter waiting for it (warm.py); on_start: called once the job runs."""
    return evaluation.train_job(cfg, worktree, log_path, seed, cancel=cancel, gpu=gpu,
                                job_env=track.job_env(cfg, iteration, commit), warm=ready, on_start=on_start,
                                **(trusted or {}))


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
    path: Path  # the worktree its job trains in
    spare_path: Path  # the worktree its next job's interpreter waits in (warm.py)
    worktree: Worktree | None = None
    spare: Worktree | None = None
    ready: warm.Warm | None = None  # the interpreter waiting for its next job
    warming: concurrent.futures.Future | None = None  # readies it
    scoring: threading.Lock = field(default_factory=threading.Lock)  # held by the one evaluation of its last job

    def swap(self) -> None:
        """The spare, where the next job's interpreter waited, becomes the job's worktree."""
        self.path, self.spare_path = self.spare_path, self.path
        self.worktree, self.spare = self.spare, self.worktree


class LocalExecutor(ThreadedExecutor):
    def __init__(self, repo: Path, root: Path, gpus: tuple[str, ...] = ()):
        self.gate = GitGate(repo)
        self.root = Path(root)
        self.free = [Slot(i, gpu, self.root / str(i), self.root / f"{i}w") for i, gpu in enumerate(gpus or (None,))]
        self.warm_root = self.root.with_name(self.root.name + "-warm")  # the waiting interpreters' folders
        self.warm_ids = itertools.count()
        # One thread, alive as long as the executor, starts the waiting interpreters: bwrap's
        # --die-with-parent follows the thread that started it, which must outlive it.
        self.warmer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="warm")
        self.stopping = threading.Event()  # set by close(): a warm-up's export or setup stops with the run
        shutil.rmtree(self.warm_root, ignore_errors=True)  # a killed supervisor's (its processes: recovery reaps them)
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
        job, trained, ready = future.job, None, None
        try:
            ready = self._ready(slot, job)
            wt = self._materialise(slot, job.commit)
            job.log_path.parent.mkdir(parents=True, exist_ok=True)
            trained = train_half(job.cfg, wt.path, job.log_path, job.seed, slot.gpu, job.cancel, job.iteration,
                                 job.commit, trusted_fields(job), ready, lambda: self._warm_next(slot, job))
            if isinstance(trained, evaluation.Trained) and trained.scored:
                self._scoring_turn(slot, job)  # the slot's previous evaluation over (the slot held meanwhile)
            else:
                trained = scored(evaluation.finish(trained, job.cancel))  # nothing to evaluate: at once
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
            if isinstance(trained, evaluation.Trained):  # cancelled before its evaluation: its folders go
                shutil.rmtree(trained.space.root, ignore_errors=True)
            if ready is not None and not ready.used:  # never handed the job: stopped with it
                ready.discard()
            self._give(future, slot)
            future.set_exception(e)
            return
        if ready is not None and not ready.used:  # the job ended before its start (a refused baseline)
            ready.discard()
        self._give(None, slot)  # the next job trains while this one is evaluated
        if isinstance(trained, TrainResult):
            self._done(future)
            future.set_result(trained)
            return
        try:
            # starved (idle class) by at most its slot's next training and two of each other slot's
            starved_s = (job.cfg.kill_after or 0) * (2 * self.count - 1)
            result = scored(evaluation.finish(trained, job.cancel, overlap_s=starved_s))
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

    def _ready(self, slot: Slot, job: Job) -> warm.Warm | None:
        """The interpreter waiting for slot's next job, the slot's worktrees swapped for it; None
        when there is none, or the job's run starts its jobs cold (it is stopped then). One still
        being readied is waited for (WARM_WAIT_S at most)."""
        if slot.warming is not None:
            concurrent.futures.wait([slot.warming], WARM_WAIT_S)
        with self.git_lock, self.cond:
            ready, slot.ready = slot.ready, None
            if ready is not None and warm.eligible(job.cfg):
                slot.swap()
                return ready
        if ready is not None:
            ready.discard()
        return None

    def _warm_next(self, slot: Slot, job: Job) -> None:
        """The slot's job runs: ready the next one's interpreter in the spare worktree, beside it
        (not after a job its run foresees no successor of: one would import and read for nothing)."""
        if self.closed or not job.successor or not warm.eligible(job.cfg):
            return
        try:
            slot.warming = self.warmer.submit(self._warm_up, slot, job)
        except RuntimeError:  # closed meanwhile
            slot.warming = None

    def _warm_up(self, slot: Slot, job: Job) -> None:
        try:
            with self.git_lock:  # at the job's commit, nothing of an earlier job left in it
                if self.closed:
                    return
                path = slot.spare_path
                if slot.spare is None:
                    slot.spare = self.gate.detached_worktree(path, job.commit)
                else:
                    slot.spare.reset_hard(job.commit)
            space = evaluation.make_space(self.warm_root / f"{slot.index}-{next(self.warm_ids)}.job")
            ready = warm.start(job.cfg, path, space, job.baseline or job.commit, slot.gpu,
                               track.job_env(job.cfg, None, None), dict(job.protected_sha256), self.stopping)
        except KeyboardInterrupt:  # the executor closed while the warm-up exported or set up
            return
        except Exception as e:  # noqa: BLE001 - the next job starts cold; the run's events say why
            events.record(self.root.parent, "warm_start_failed", f"slot {slot.index}: {e}")
            return
        if ready is None:
            events.record(self.root.parent, "warm_start_failed", f"slot {slot.index}: no interpreter could be "
                                                                 f"started for {job.log_path.stem}'s successor")
            return
        with self.cond:  # still the slot's spare worktree, and no other one waiting there
            if not self.closed and slot.ready is None and slot.spare_path == path:
                slot.ready, ready = ready, None
        if ready is not None:
            ready.discard()

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
            self.stopping.set()
            for f in [*self.waiting, *self.running]:
                f.job.cancel.set()
            self.cond.notify_all()
        hung = join_bounded(self.threads, CLOSE_S, self.root.parent, "training job")
        self.warmer.shutdown(wait=False, cancel_futures=True)
        concurrent.futures.wait([s.warming for s in self.all if s.warming is not None], WARM_WAIT_S)
        with self.cond:
            busy = [s for s in self.all if s not in self.free] if hung else []
            ready = [s.ready for s in self.all if s.ready is not None]
            for slot in self.all:
                slot.ready = None
        for waiting in ready:
            waiting.discard()
        shutil.rmtree(self.warm_root, ignore_errors=True)
        with self.git_lock:
            for slot in self.all:
                if slot in busy:
                    continue
                for wt in (slot.worktree, slot.spare):
                    if wt is not None:
                        wt.close()
                slot.worktree = slot.spare = None
            self._remove_leftovers(skip={p for s in busy for p in (s.path, s.spare_path)})

    def _remove_leftovers(self, skip: set[Path] = frozenset()) -> None:
        """Slot worktrees of this executor, or of a supervisor that was killed: removed, pruned."""
        if self.root.exists():
            for path in sorted(self.root.iterdir()):
                if path not in skip:
                    self.gate.remove_worktree(path)
            self.gate.prune()
