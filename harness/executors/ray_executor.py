"""The Ray executor: each training job is one Ray task, anywhere in a Ray cluster.

The supervisor, the researchers, git, the ledger and every decision stay on this machine; only
training moves. A job travels as code: a `git archive` of the commit's editable and protected
files, with one of its baseline's protected files (checked here against the run's history and
the recorded hashes first), put in Ray's object store and unpacked on the worker
(ray_worker.py), where the local executor's `train_once` runs under a supervisor of its own and
judges the job by the trusted figures the Job carries (the start-up allowance, the hashes). The log comes back as it is written
(the task is a streaming generator) into the run's `logs/` path, so `harness status` and the log
files look as in a local run.

Nodes: each attempt is pinned to one alive node that has the job's resources, the one with the
fewest of this executor's jobs; a node whose `setup_command` failed is not used again. The slot
count follows the cluster (`slots()`: the jobs that fit on the alive, usable nodes, read again
every NODES_TTL_S), so nodes that join are used and nodes that leave are dropped, and the
driver's lanes follow it; `--slots N` pins it. Faults: a task killed by Ray
or a node lost is an infrastructure failure, retried once (on another node when there is one);
a second failure is a `crash` whose reason starts with "infrastructure:". Ray's resource errors
(out of memory, object store or disk full) are such failures too, raised by a task or by a put.
While a task runs its record is on disk under `<folder>/ray-tasks/`; a new executor on the same
folder (--resume after a killed supervisor) stops what those tasks left running on every node
before it starts.

The cluster going away (its head, the GCS, not answering for the grace, HARNESS_RAY_GRACE_S,
default 30 s; a head that answers again within it is waited for): every job's future gets
`ClusterGone`, the driver stops the run with the candidates in flight kept for `--resume`. No
call of the driver's threads waits on Ray meanwhile: `slots()` is read by a thread of its own,
the head watched by another with plain TCP connects (a Ray call blocks while the head is gone).
`close()` is bounded: a job thread that does not end is reported (an event) and left.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ..ledger import events, trust
from ..lifecycle import faults
from ..gitgate import open_repo
from ..errors import ClusterError, ClusterGone
from ..workload.runner import TrainResult
from . import ray_worker
from .ray_cluster import archive, connect, fits, grace_s, import_ray, ray_options
from .ray_watch import REAP_TIMEOUT_S, ClusterWatch, TaskRecords
from .base import Job, JobFuture, ThreadedExecutor, begin, join_bounded, settle

POLL_S = 0.2  # s between checks of a job's cancel flag while its task runs
GRACEFUL_CANCEL_S = 15.0  # s a cancelled task has to kill its job itself before Ray kills the worker
DRAIN_S = 10.0  # s to wait for a task's end after its result (it removes its folder)
NODES_TTL_S = 2.0  # s a reading of the cluster's nodes serves for the slot count
ATTEMPTS = 2  # an infrastructure failure is retried once
CLOSE_S = GRACEFUL_CANCEL_S + REAP_TIMEOUT_S + 15.0  # s close() waits for the job threads (a cancel, a reap)
GONE_CLOSE_S = 5.0  # the same once the cluster has gone (its calls would block)
SHUTDOWN_S = 20.0  # s for ray.shutdown()
# Ray's errors that are the cluster's, not the candidate's: the attempt is retried once
RESOURCE_ERRORS = ("OutOfMemoryError", "ObjectStoreFullError", "OutOfDiskError")
LOST_ERRORS = ("WorkerCrashedError", "NodeDiedError", "LocalRayletDiedError", "ObjectLostError", "OwnerDiedError",
               "TaskUnschedulableError", "RaySystemError", "ActorDiedError")


class Infrastructure(Exception):
    """An attempt failed for reasons of the cluster, not of the candidate."""

    def __init__(self, reason: str, node_id: str | None = None):
        super().__init__(reason)
        self.reason, self.node_id = reason, node_id


class RayExecutor(ClusterWatch, TaskRecords, ThreadedExecutor):
    def __init__(self, repo: Path, folder: Path, address: str | None = None,
                 resources: dict[str, float] | None = None, slots: int | None = None):
        self.ray = import_ray()
        self.repo, self.folder = Path(repo), Path(folder)
        self.address = connect(address)
        self.gcs = self._gcs_address()
        self.grace_s = grace_s()
        self.gone: str | None = None  # why the cluster has gone (set once, by the watch thread)
        self.resources = dict(resources or {"GPU": 1.0})
        self.tasks_dir = self.folder / "ray-tasks"
        self.run_job = self.ray.remote(ray_worker.run_job)
        self.reaper = self.ray.remote(ray_worker.reap)
        self.cancel_leftovers()
        self.pinned = slots  # --slots N: that many, whatever the cluster holds
        self.unusable: dict[str, str] = {}  # node id -> why (its setup_command failed)
        self.count, self.read_at = self._capacity(), time.monotonic()
        if slots is None and self.count < 1:
            raise ClusterError(f"no job of {json.dumps(self.resources)} fits in the Ray cluster at {self.address} "
                               f"(it has {self._summary()}); pass --job-resources, or add nodes")
        self.cond = threading.Condition()
        self.running: dict[str, int] = {}  # node id -> this executor's jobs there
        self.busy = 0
        self.futures: set[JobFuture] = set()
        self.baselines: dict[str, Any] = {}  # baseline commit -> its protected files in the object store
        self.threads: list[threading.Thread] = []
        self.closed = False
        for target, name in ((self._watch, "ray-watch"), (self._read_nodes, "ray-nodes")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def _summary(self) -> str:
        res = self.ray.cluster_resources()
        return ", ".join(f"{k} {v:g}" for k, v in sorted(res.items()) if k in ("CPU", "GPU")) or "no CPU or GPU"

    def slots(self) -> int:
        """Jobs at once: --slots, or how many fit on the alive, usable nodes (read every NODES_TTL_S by a
        thread of its own: this never waits on Ray, whose calls block while the head is gone)."""
        if self.pinned:
            return self.pinned
        return self.count

    def _read_nodes(self) -> None:
        while not self.closed and self.gone is None:
            time.sleep(NODES_TTL_S)
            if self.closed or self.gone is not None:
                return
            try:
                self.count, self.read_at = self._capacity(), time.monotonic()
            except Exception:  # noqa: BLE001 - the last reading stands; the watch thread judges the head
                pass

    def _capacity(self) -> int:
        nodes = [n for n in self.ray.nodes() if n.get("Alive") and n["NodeID"] not in self.unusable]
        return sum(fits(n.get("Resources", {}), self.resources) for n in nodes)

    # -- the interface -----------------------------------------------------------------------

    thread_prefix = "ray"

    def _enqueue(self, future: JobFuture) -> None:
        self.futures.add(future)

    def close(self) -> None:
        """Cancel every job (their tasks too), wait for them (CLOSE_S at most: a thread still there is
        reported and left), disconnect (SHUTDOWN_S at most)."""
        with self.cond:
            if self.closed:  # once (the driver's stop, then its exit)
                return
            self.closed = True
            for f in self.futures:
                f.job.cancel.set()
            self.cond.notify_all()
        join_bounded(self.threads, GONE_CLOSE_S if self.gone else CLOSE_S, self.folder, "Ray job")
        if self.ray.is_initialized():
            join_bounded([_start(self.ray.shutdown, "ray-shutdown")], SHUTDOWN_S, self.folder, "Ray shutdown")

    # -- one job -----------------------------------------------------------------------------

    def _take(self, job: Job) -> bool:
        """Wait for a free slot (the count follows the cluster); False when cancelled first."""
        while True:
            count = self.slots()
            with self.cond:
                if job.cancel.is_set() or self.closed or self.gone is not None:
                    return False
                if self.busy < count:
                    self.busy += 1
                    return True
                self.cond.wait(POLL_S)

    def _give(self) -> None:
        with self.cond:
            self.busy -= 1
            self.cond.notify_all()

    def _work(self, future: JobFuture) -> None:
        """One job's thread. The future may have been settled already (the cluster went away): then
        what this thread finds later is dropped (base.settle)."""
        job = future.job
        if not self._take(job):
            settle(future, exc=ClusterGone(self.gone) if self.gone else KeyboardInterrupt("training cancelled"))
            self._forget(future)
            return
        try:
            if begin(future):
                try:
                    result = self._train(job)
                except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
                    settle(future, exc=ClusterGone(self.gone) if self.gone else e)
                else:
                    settle(future, result, exc=ClusterGone(self.gone) if self.gone else None)
        finally:
            self._give()
            self._forget(future)

    def _forget(self, future: JobFuture) -> None:
        with self.cond:
            self.futures.discard(future)

    def _train(self, job: Job) -> TrainResult:
        cfg = job.cfg
        refused = self._check_baseline(job)
        if refused is not None:
            return refused
        data = base = None
        ship = _shippable(cfg)
        tried: list[str] = []
        reasons: list[str] = []
        for attempt in range(1, ATTEMPTS + 1):
            node_id = None
            try:
                self._check_gone()
                if data is None:  # a full object store is the cluster's failure too: retried
                    data = self._put(archive(self.repo, job.commit, (*cfg.editable, *cfg.protected)))
                if base is None and job.baseline:
                    base = self._baseline(job)
                node_id = self._choose(tried)  # counted there: two jobs choosing at once pick two nodes
                try:
                    return self._attempt(job, ship, (data, base), node_id, attempt)
                finally:
                    with self.cond:
                        self.running[node_id or ""] -= 1
            except Infrastructure as e:
                self._hold_while_unreachable()  # the head gone: ClusterGone, not the candidate's crash
                tried.append(e.node_id or node_id or "")
                reasons.append(e.reason)
                events.record(cfg.run_dir, "infrastructure", f"{job.name} attempt {attempt}: {e.reason}"
                              + ("; retrying" if attempt < ATTEMPTS else ""))
        return TrainResult("crash", reason="infrastructure: " + "; then ".join(reasons))

    def _put(self, value: bytes) -> Any:
        try:
            return self.ray.put(value)
        except self.ray.exceptions.RayError as e:
            if _kind(e):
                raise Infrastructure(f"{_kind(e)} (storing the job's files): {_first_line(e)}") from None
            raise

    def _check_baseline(self, job: Job) -> TrainResult | None:
        """The job's baseline checked here, where the run's history is (trust.py): an `invalid`
        TrainResult when it is not the run's; None when it is (or the job has none: a throwaway run's)."""
        if not job.baseline:
            return None
        repo = open_repo(self.repo)  # not a Worktree: that would clear the user's index.lock
        try:
            problem = trust.baseline_problem(repo, job.baseline, job.commit, job.protected_sha256, job.cfg.protected)
        finally:
            repo.close()
        if problem:
            return TrainResult("invalid", reason=f"{problem}: refused by the trusted baseline check, the "
                                                 f"evaluator runs only from the run's own baseline")
        return None

    def _baseline(self, job: Job) -> Any:
        """The baseline's protected files for the worker's evaluation, in the object store once per baseline."""
        with self.cond:
            ref = self.baselines.get(job.baseline)
        if ref is None:
            ref = self._put(archive(self.repo, job.baseline, job.cfg.protected))
            with self.cond:
                ref = self.baselines.setdefault(job.baseline, ref)
        return ref

    def _choose(self, tried: list[str]) -> str | None:
        """The alive node with the job's resources and the fewest of our jobs (one not tried, if any)."""
        nodes = [n for n in self.ray.nodes() if n.get("Alive") and fits(n.get("Resources", {}), self.resources) >= 1]
        usable = [n["NodeID"] for n in nodes if n["NodeID"] not in self.unusable]
        if not nodes:
            with self.cond:
                self.running[""] = self.running.get("", 0) + 1
            return None  # Ray schedules it where it can (a node may join); a failure is retried
        if not usable:
            raise Infrastructure("no usable node: " + "; ".join(self.unusable.values()))
        fresh = [n for n in usable if n not in tried] or usable
        with self.cond:
            node = min(fresh, key=lambda n: (self.running.get(n, 0), fresh.index(n)))
            self.running[node] = self.running.get(node, 0) + 1
            return node

    def _attempt(self, job: Job, cfg_ship: Any, data: tuple[Any, Any], node_id: str | None,
                 attempt: int) -> TrainResult:
        """One task: the job's files and its baseline's protected files (data), and in the spec the
        run's trusted figures (executors/base.Job), which the worker judges by as a local job is."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        token = uuid.uuid4().hex
        spec = {"token": token, "seed": job.seed, "iteration": job.iteration, "commit": job.commit,
                "protected_sha256": dict(job.protected_sha256), "allowance_s": job.allowance_s,
                "baseline_cpu_s": job.baseline_cpu_s, "baseline_gpu_s": job.baseline_gpu_s, "fault": faults.ray_raise()}
        opts = ray_options(self.resources)
        if node_id is not None:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
        gen = self.run_job.options(num_returns="streaming", max_retries=0, **opts).remote(*data, cfg_ship, spec)
        record = {"token": token, "job": job.name, "attempt": attempt, "node_id": node_id,
                  "address": self.address, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self._write_record(record)
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(job.log_path, "wb") as log:
                return self._follow(job, gen, log, record)
        finally:
            (self.tasks_dir / f"{token}.json").unlink(missing_ok=True)

    def _follow(self, job: Job, gen: Any, log: Any, record: dict[str, Any]) -> TrainResult:
        """Stream the task's log into log until its result; cancel -> the task stopped, KeyboardInterrupt."""
        ex = self.ray.exceptions
        while True:
            self._check_gone()  # the task's record stays: --resume stops what it left
            if job.cancel.is_set():
                self._cancel(gen, record)
                raise KeyboardInterrupt("training cancelled")
            ready, _ = self.ray.wait([gen], timeout=POLL_S)
            if not ready:
                continue
            try:
                item = self.ray.get(next(gen))
            except StopIteration:
                raise Infrastructure("the task ended without a result", record.get("node_id")) from None
            except ex.TaskCancelledError:
                raise Infrastructure("the task was cancelled by Ray", record.get("node_id")) from None
            except ex.RayError as e:
                kind = _kind(e)
                if kind:  # killed by Ray (memory), a node lost, a store full
                    self._reap(record)
                    raise Infrastructure(f"{kind}: {_first_line(e)}", record.get("node_id")) from None
                if isinstance(e, ex.RayTaskError):  # the worker side failed (git missing, disk full ...)
                    raise Infrastructure(f"the worker failed: {_first_line(e)}", record.get("node_id")) from None
                raise
            kind = item[0]
            if kind == "started":
                record.update(item[1])
                self._write_record(record)
            elif kind == "log":
                log.write(item[1])
                log.flush()
            elif kind == "unusable":
                self.unusable[record["node_id"]] = item[1]
                raise Infrastructure(item[1], record.get("node_id"))
            elif kind == "result":
                self._events(job, item[2])
                self._drain(gen)
                return item[1]

    def _drain(self, gen: Any) -> None:
        """Wait (briefly) for the task's own end: its folder on the node is removed by then."""
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            ready, _ = self.ray.wait([gen], timeout=POLL_S)
            if ready:
                try:
                    next(gen)
                except StopIteration:
                    return
                except Exception:  # noqa: BLE001 - the result is in hand; the rest is tidying
                    return

    def _events(self, job: Job, lines: list[str]) -> None:
        if lines:
            path = job.cfg.run_dir / events.NAME
            with open(path, "a", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))

    def _cancel(self, gen: Any, record: dict[str, Any]) -> None:
        """Stop a running task: first by an interrupt (the job kills its own group), then Ray kills the worker."""
        self.ray.cancel(gen, force=False)
        deadline = time.monotonic() + GRACEFUL_CANCEL_S
        while time.monotonic() < deadline:
            try:
                ready, _ = self.ray.wait([gen], timeout=POLL_S)
                if ready:
                    self.ray.get(next(gen))
            except StopIteration:
                return
            except Exception:  # noqa: BLE001 - cancelled, or gone: either way the task has ended
                return
        try:
            self.ray.cancel(gen, force=True)
        except Exception:  # noqa: BLE001 - already finished
            pass
        self._reap(record)



def _shippable(cfg: Any) -> Any:
    """The config that travels: nothing of the researcher's (options, keys' names) goes to the worker."""
    from dataclasses import replace
    return replace(cfg, agent_options={})


def _kind(e: BaseException) -> str | None:
    """The name of Ray's error, or of the one a task raised (a RayTaskError carries it as its cause),
    when it is the cluster's failure (RESOURCE_ERRORS, LOST_ERRORS and their kinds); else None."""
    cause = getattr(e, "cause", None)
    error = cause if isinstance(cause, BaseException) else e
    if any(cls.__name__ in RESOURCE_ERRORS + LOST_ERRORS for cls in type(error).__mro__):
        return type(error).__name__
    return None


def _start(target: Any, name: str) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]
