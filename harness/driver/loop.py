"""The one run driver: every `harness run`, `harness step` and `harness ab` arm goes through here.

A Driver holds one or more runs (a single run, or the arms of an A/B comparison) that share one
executor (the GPUs: its slots), one supervisor of child processes and one interrupt path.
Each run (RunDriver) has lanes: a lane proposes a candidate in its own detached worktree, has
it trained by the executor, and decides; pipelined, it proposes the next candidate while the
current one trains (two worktrees per lane). The classic loop is one lane, not pipelined.

One thread decides. Researcher calls, training jobs, the baseline, health re-runs and test-split
scorings are Futures (spawn: a daemon worker each); the loop (drive) waits on all of them with
wait(FIRST_COMPLETED), and only the loop hands out iteration numbers, decides, moves the run
branch (its HEAD is always the best) and appends rows (RunDriver.append, the one writer of a
run's ledger and of its stop policy's spend). Lanes, pipelining, A/B arms and Ray slots are how
many futures are in flight; there is no run lock. A candidate whose parent is no longer the best
is 3-way merged onto it before it trains (a conflict is a row of its own); a win whose best moved
meanwhile is rebased and trained again before it can be kept.

Here: `run_all`, `drive` (the loop), `stop`, and the entries `run` / `single`. The loop's parts:
rundriver.py (one run: set-up, the loop's step, numbers and rows), lanes.py (a lane's state and
step, `spawn`, `Turns`), judge.py (the one judge), stop.py (a run's stop), signals.py (the
interrupt path), printer.py (progress printed from its own thread).

Stops: one StopPolicy per run (lifecycle/stops.py). Interrupts: SIGINT, SIGTERM and SIGHUP raise
`Interrupted` in the main thread during the set-up; while the loop runs they are noted and the
loop raises it between its steps. The stop then stops issuing, cancels what is in flight (jobs
killed, researchers killed), waits a bounded grace, records what came back (a late proposal's
spend: a `stopped` row), and reconciles with nothing else running; further signals are ignored.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path
from typing import Any, Callable

from ..lifecycle import disk
from ..lifecycle import recovery, runs, supervise
from ..errors import ClusterGone, HarnessError
from ..config import RunConfig
from ..executors import Executor, make_executor
from ..lifecycle.runs import Progress, Summary
from .printer import Printer, safe
from .rundriver import RunDriver
from .signals import POLL_S, Interrupted, interrupts, quiet
from .stop import PROPOSAL_GRACE_S


# ---------------------------------------------------------------------------
# The driver: runs over one executor, one supervisor, one interrupt path


def run_all(folder: Path, repo: Path, runs_: list[RunDriver], gpus: tuple[str, ...], schedule: str = "together",
            locks: tuple[Path, ...] = (), on_locked: Callable[[], None] | None = None
            ) -> tuple[list[Summary], Interrupted | None]:
    """Drive runs_ (sequentially, or all at once) until each stops. folder: where the supervisor's
    records and the executor's slots live (the run's folder, or the A/B comparison's).

    The signal handlers cover the whole of it, clean-up included: a signal during the clean-up
    (a closed terminal sends SIGHUP twice) is noted, never lets the process die half-way."""
    interrupted: Interrupted | None = None
    executor: Any = None
    with interrupts() as seen:
        with contextlib.ExitStack() as held:
            try:
                for path in (folder, *locks):  # one harness per run
                    held.enter_context(recovery.supervisor_lock(path))
                if on_locked is not None:
                    on_locked()
                recovery.on_resume(folder)  # processes an earlier supervisor of this run left behind
                held.enter_context(supervise.active(folder))
                for r in runs_:
                    held.callback(r.close)  # the worktrees' git processes, before the supervisor lets go
                executor = make_executor(runs_[0].cfg, repo, folder, gpus)
                held.callback(executor.close)
                drive(runs_, executor, schedule, seen)
            except KeyboardInterrupt as e:
                quiet(seen)
                interrupted = e if isinstance(e, Interrupted) else Interrupted(signal.SIGINT)
                stop(runs_, executor)
                for r in runs_:
                    r.tidy(interrupted.why)
            except BaseException as e:
                quiet(seen)
                stop(runs_, executor)  # an error in one run stops every lane and job, then is raised
                if isinstance(e, ClusterGone):  # the cluster went away: worktrees at the best, journals kept
                    for r in runs_:
                        with contextlib.suppress(Exception):
                            r.tidy("the Ray cluster went away")
                    raise
                if isinstance(e, disk.DiskFull) or (disk.caused(e) and not isinstance(e, HarnessError)):
                    for r in runs_:
                        with contextlib.suppress(Exception):  # the clean-up may need the disk too
                            r.tidy("the disk is full")
                    if isinstance(e, disk.DiskFull):
                        raise
                    raise disk.DiskFull(disk.stop_message(runs_[0].cfg.run_dir, runs_[0].cfg.tag,
                                                          f"({type(e).__name__})")) from e
                raise
            finally:
                quiet(seen)
                for r in runs_:
                    r.cancel.set()
                for printer in {id(r.progress_fn): r.progress_fn for r in runs_
                                if isinstance(r.progress_fn, Printer)}.values():
                    printer.flush()
        summaries = [r.summary() for r in runs_]
    if interrupted is None and seen["signum"] is not None:  # it came while the run was ending anyway
        interrupted = Interrupted(seen["signum"])
    return summaries, interrupted


def drive(runs_: list[RunDriver], executor: Executor, schedule: str, seen: dict[str, Any] | None = None) -> None:
    """The one loop: every run's step, then a wait on everything in flight (FIRST_COMPLETED, at
    most POLL_S); a signal noted meanwhile is raised here, between two steps."""
    seen = seen if seen is not None else {"signum": None, "quiet": False, "defer": False}
    for r in runs_:
        r.open_run(executor)
    groups = [[r] for r in runs_] if schedule == "sequential" else [runs_]
    seen["defer"] = True
    try:
        for group in groups:
            for r in group:
                r.start()
            while True:
                if seen["signum"] is not None and not seen["quiet"]:
                    raise Interrupted(seen["signum"])
                for r in group:
                    if not r.finished():
                        r.step()
                if all(r.finished() for r in group):
                    break
                in_flight = [f for r in group for f in r.futures()]
                if in_flight:
                    wait(in_flight, timeout=POLL_S, return_when=FIRST_COMPLETED)
                else:
                    time.sleep(POLL_S / 4)  # nothing in flight: a turn or a slot to wait for
    finally:
        seen["defer"] = False


def stop(runs_: list[RunDriver], executor: Executor | None) -> None:
    """Every run told to stop, training jobs killed, researchers killed, what was in flight given
    a bounded grace to come back (RunDriver.shutdown)."""
    for r in runs_:
        r.abort(None)
    if executor is not None:
        executor.close()
    if supervise.current() is not None:
        supervise.current().stop_all()
    until = time.monotonic() + PROPOSAL_GRACE_S
    for r in runs_:
        r.shutdown(until)


def single(cfg: RunConfig, researcher: Any, resume: bool, progress: Progress, pipelined: bool,
           steps: int | None = None) -> tuple[Summary, Interrupted | None]:
    """`harness run` / `harness step`: one run, one lane per GPU."""
    gpus = tuple(cfg.gpus)
    lanes = max(1, len(gpus)) if cfg.executor == "local" else None  # Ray: as many as the cluster's slots
    run = RunDriver(cfg, researcher, resume, safe(progress), lanes, pipelined,
                    threading.Event(), steps=steps)
    summaries, interrupted = run_all(cfg.run_dir, cfg.repo, [run], gpus)
    return summaries[0], interrupted


def run(cfg: RunConfig, resume: bool = False, progress: Progress = runs.no_progress, researcher: Any = None,
        steps: int | None = None) -> Summary:
    """The library's entry: run until a stop; a signal's stop is in the summary's `stopped`."""
    from ..agents import make_researcher
    from .pipeline import pipelined
    researcher = researcher or make_researcher(cfg.agent, cfg.model, cfg.agent_options)
    return single(cfg, researcher, resume, progress, pipelined(cfg), steps)[0]
