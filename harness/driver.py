"""The one run driver: every `harness run`, `harness step` and `harness ab` arm goes through here.

A Driver holds one or more runs (a single run, or the arms of an A/B comparison) that share one
executor (the GPUs: its slots), one supervisor of child processes and one interrupt path.
Each run (RunDriver) has lanes: a lane proposes a candidate in its own detached worktree, has
it trained by the executor, and decides; pipelined, it proposes the next candidate while the
current one trains (two worktrees per lane). The classic loop is one lane, not pipelined.

All lanes of a run share one RunState (one best) and one ledger; appends, best updates and
iteration numbers are serialised by the run's lock, and the run branch only ever moves, under
that lock, to a kept commit: its HEAD is always the best. A candidate whose parent is no longer
the best is 3-way merged onto it before it trains (a conflict is a row of its own); a win whose
best moved meanwhile is rebased and trained again before it can be kept.

Stops: one StopPolicy per run (stops.py). Interrupts: SIGINT, SIGTERM and SIGHUP all raise
`Interrupted` in the main thread once; the clean-up (jobs and researchers killed, journals
kept, worktrees reset, processes reaped) runs once, with further signals ignored.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from . import decide, disk, events, faults, health, ledger, recovery, runs, stops, supervise, testsplit
from .errors import ClusterGone, HarnessError
from .config import RunConfig
from .executors import Executor, make_executor
from .gitgate import GitGate, data_files
from .ledger import Row
from .runs import Progress, Summary
from .step import (Candidate, Context, RunState, clear_journal, conflict_row, measure, prepare_candidate,
                   rebased, write_journal)

PROPOSAL_GRACE_S = 5.0  # s to wait on a stop for proposal threads to finish (a commit in progress)
POLL_S = 0.2  # s between checks of the threads (lets signals through)
LANES_CHECK_S = 2.0  # s between readings of the executor's slots, when the lanes follow them (Ray)
SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}


class Interrupted(KeyboardInterrupt):
    """A stop asked for by a signal (SIGINT, SIGTERM, SIGHUP)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(SIGNALS.get(signum, str(signum)))
        self.signum = signum

    @property
    def why(self) -> str:
        return SIGNALS.get(self.signum, f"signal {self.signum}")


class Cancelled(BaseException):
    """A proposal that returned after the stop: it is dropped before anything is committed."""


@contextlib.contextmanager
def interrupts() -> Iterator[dict[str, Any]]:
    """The one interrupt path: the first SIGINT/SIGTERM/SIGHUP raises Interrupted in the main
    thread; later ones are only noted (the clean-up must run once, whole)."""
    seen: dict[str, Any] = {"signum": None, "quiet": False}  # quiet: the run is ending, only note it
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def handler(signum, frame):
        if seen["signum"] is None:
            seen["signum"] = signum
            if not seen["quiet"]:
                raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield seen
    finally:
        for s in signal.sigpending() & set(SIGNALS):  # held back during the clean-up: noted now
            signal.sigtimedwait([s], 0)
            seen["signum"] = seen["signum"] or s
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        for s, h in old.items():
            signal.signal(s, h)


def quiet(seen: dict[str, Any]) -> None:
    """The run is ending: later signals are only noted, and the main thread's children (git's
    clean-up of worktrees) do not get them. A closed tmux pane or a second Ctrl-C signals the
    terminal's whole process group, and a git killed half-way would leave its worktree behind;
    blocked here, the signals stay blocked in what the main thread starts (the mask is inherited),
    while the other threads still take them for the handler to note."""
    seen["quiet"] = True
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)


def safe(progress: Progress) -> Progress:
    """Progress that can never stop the run: a closed terminal (SIGHUP) makes printing fail."""
    lock = threading.Lock()

    def emit(event: str, data: dict[str, Any]) -> None:
        with lock:
            try:
                progress(event, data)
            except (OSError, ValueError):
                pass
    return emit


class Turns:
    """Interleaved A/B arms take turns: arm i makes its k-th proposal once every arm before it has
    made its k-th and every arm after it its (k-1)-th; an arm that stops leaves the round."""

    def __init__(self, n: int):
        self.cond = threading.Condition()
        self.done = [0] * n
        self.gone: set[int] = set()

    def take(self, i: int, cancel: threading.Event) -> None:
        with self.cond:
            while not cancel.is_set():
                others = [j for j in range(len(self.done)) if j != i and j not in self.gone]
                if all(self.done[j] > self.done[i] if j < i else self.done[j] >= self.done[i] for j in others):
                    return
                self.cond.wait(POLL_S)

    def finish(self, i: int) -> None:
        with self.cond:
            self.done[i] += 1
            self.cond.notify_all()

    def leave(self, i: int) -> None:
        with self.cond:
            self.gone.add(i)
            self.cond.notify_all()


@dataclass
class Lane:
    index: int
    slots: list[Context]  # one worktree, or two when pipelined
    thread: threading.Thread | None = None


# ---------------------------------------------------------------------------
# One run


class RunDriver:
    """One run's lanes, best, ledger and stop policy."""

    def __init__(self, cfg: RunConfig, researcher: Any, resume: bool, progress: Progress,
                 n_lanes: int | None, pipelined: bool, cancel: threading.Event, steps: int | None = None):
        self.cfg, self.researcher, self.resume = cfg, researcher, resume
        self.progress_fn = progress
        self.n_lanes, self.pipelined, self.cancel = n_lanes, pipelined, cancel
        self.steps = steps  # proposals this session may start (`harness step`: 1); None = no bound
        self.lock = threading.RLock()  # ledger appends, best updates, iteration numbers
        self.gate = threading.Lock()  # orders the stop against commits of finished proposals
        self.committing: set[int] = set()
        self.ready = threading.Event()  # the baseline is measured (and waiting candidates trained)
        self.error: BaseException | None = None
        self.stopped: str | None = None
        self.ctx: Context | None = None
        self.state: RunState | None = None
        self.lanes: list[Lane] = []
        self.executor: Any = None
        self.guarded: Guarded | None = None
        self.wanted = 0  # lanes that may start a candidate: all, or the executor's live slots (n_lanes None)
        self.threads: list[threading.Thread] = []
        self.proposals: list[threading.Thread] = []
        self.open: set[int] = set()
        self.issued = 0
        self.unused: list[int] = []  # numbers below `issued` with no row: proposals a stop dropped
        self.turns: Turns | None = None
        self.turn_index = 0
        self.monitor: health.Monitor | None = None
        self.policy: stops.StopPolicy | None = None
        self.events_from = events.size(cfg.run_dir)  # before the resume's own events (orphans stopped)
        self.fresh = False
        self.started_with = 0  # proposals on the ledger when this session started (harness step)

    # --- set-up (main thread: all git set-up is serial) ------------------------------------

    def open_run(self, executor: Any) -> None:
        cfg = self.cfg
        self.ctx, state = runs.open_run(cfg, self.resume, self.progress, self.researcher, executor)
        self.fresh = state is None
        self.state = state or runs.first_state(cfg, self.ctx.wt.head(), cfg.worktree)
        self.issued = self.state.iteration
        rows = stops.ledger_rows(cfg)
        self.policy = stops.StopPolicy(cfg, rows, stops.RunClock(cfg.run_dir))
        self.executor, self.guarded = executor, Guarded(self.researcher, self)
        self.wanted = self.n_lanes or max(1, executor.slots())  # None: one lane per executor slot (Ray)
        for i in range(self.wanted):
            self.lanes.append(self.new_lane(i))

    def new_lane(self, i: int) -> Lane:
        """Lane i's worktrees (one, or two when pipelined) at the best; created, or re-attached on resume."""
        cfg, gate, slots = self.cfg, GitGate(self.cfg.repo), []
        for s in "ab"[: 2 if self.pipelined else 1]:
            wt = gate.detached_worktree(cfg.run_dir / "lanes" / f"{i}{s}", self.state.best_commit,
                                        data_files(cfg.protected))  # the researcher's: no validation bytes
            slots.append(Context(cfg, wt, self.guarded, self.ctx.program_text, journal=f"inflight-{i}{s}.json",
                                 executor=self.executor, cancel=self.cancel, trusted=self.ctx.trusted))
        return Lane(i, slots)

    def progress(self, event: str, data: dict[str, Any]) -> None:
        if self.cfg.arm:
            data = {**data, "arm": self.cfg.arm + (f"-r{self.cfg.repeat}" if self.cfg.repeat else "")}
        self.progress_fn(event, data)

    # --- the run's own thread ------------------------------------------------------------

    def start(self) -> None:
        thread = threading.Thread(target=self._guarded, args=(self.main,), name=f"run-{self.cfg.tag}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            if isinstance(e, (Cancelled, KeyboardInterrupt)) and self.cancel.is_set():
                return  # the stop itself
            if self.cancel.is_set():  # an error while the run stops: recorded, never lost
                events.record(self.cfg.run_dir, "error_during_stop", f"{type(e).__name__}: {e}")
            else:
                self.abort(e)

    def main(self) -> None:
        """Baseline (or the candidates an interruption left), then the lanes until a stop."""
        early = self.pipelined and self.fresh  # hide the first proposals behind the baseline
        if early:
            for lane in self.lanes:
                self.start_lane(lane)
        if self.fresh:
            runs.baseline(self.ctx, self.state, self.progress)
        else:
            runs.train_waiting(self.ctx, self.state, self.progress)
        with self.lock:
            self.issued = max(self.issued, self.state.iteration)
            rows = stops.ledger_rows(self.cfg)
            if not self.fresh:  # handed out again first, so the ledger's numbers have no gap
                used = {r.get("iteration") or 0 for r in rows} | self.open
                self.unused = [n for n in range(1, max(used, default=0)) if n not in used]
            self.policy.resync(rows)
            self.policy.proposed += len(self.open)  # proposals made while the baseline trained
        self.monitor = health.Monitor(replace(self.ctx, researcher=self.researcher), self.state, self.progress,
                                      self.events_from, lock=self.lock)
        self.progress("start", {"best": self.state.best_value, "iteration": self.state.iteration,
                                "lanes": len(self.lanes), "pipeline": self.pipelined})
        self.ready.set()
        if not early:
            for lane in self.lanes:
                self.start_lane(lane)
        checked = time.monotonic()
        tests = testsplit.Scorer(self.ctx, self.state, self.cancel, self.progress, self.lock)  # the private test split
        while any(lane.thread.is_alive() for lane in self.lanes if lane.thread is not None):
            if self.n_lanes is None and time.monotonic() - checked >= LANES_CHECK_S:
                self.follow_slots()
                checked = time.monotonic()
            tests.poll()
            time.sleep(POLL_S)
        if self.error is None and self.steps is None:  # the run ends here (not one `harness step`)
            tests.at_end()

    def start_lane(self, lane: Lane) -> None:
        lane.thread = threading.Thread(target=self._guarded, args=(self.lane_loop, lane), daemon=True,
                                       name=f"lane-{self.cfg.tag}-{lane.index}")
        lane.thread.start()

    def follow_slots(self) -> None:
        """One lane per slot of the executor, live: a node that joins the cluster gets lanes (new, or
        ones that retired), one that leaves retires the highest lanes after their candidate."""
        if self.stopped or self.cancel.is_set():
            return
        wanted = max(1, self.executor.slots())
        if wanted != self.wanted:
            message = f"{wanted} lane(s), was {self.wanted}: the executor offers {wanted} slot(s)"
            self.wanted = wanted
            events.record(self.cfg.run_dir, "lanes", message)
            self.progress("event", {"kind": "lanes", "message": message, "lanes": wanted})
        for i in range(wanted):  # a lane that retired and is wanted again starts anew
            if i >= len(self.lanes):
                with self.lock:  # the best does not move while the worktrees are made at it
                    self.lanes.append(self.new_lane(i))
            lane = self.lanes[i]
            if lane.thread is None or not lane.thread.is_alive():
                self.start_lane(lane)

    def retiring(self, lane: Lane) -> bool:
        """A lane above the executor's live slots starts no new candidate (it finishes the one it has)."""
        return lane.index >= self.wanted

    def wait_ready(self) -> bool:
        while not self.ready.is_set():
            if self.cancel.is_set():
                return False
            self.ready.wait(POLL_S)
        return True

    # --- numbers and rows, under the lock --------------------------------------------------

    def next_number(self) -> int | None:
        """The next iteration number for a new proposal, or None when the run must not start one."""
        with self.lock:
            if self.stopped or self.cancel.is_set():
                return None
            if self.steps is not None and self.policy.proposed - self.started_with >= self.steps:
                self.stopped = "step done"
                return None
            reason = self.policy.reason(in_flight=len(self.open))
            if reason:
                self.stopped = reason
                if stops.is_budget(reason) and self.ready.is_set():
                    self.issued += 1
                    self.append([stops.budget_row(self.cfg, self.state.best_commit, self.issued, reason,
                                                  self.researcher.name)])
                return None
            self.policy.take()
            if self.unused:
                n = self.unused.pop(0)
            else:
                self.issued += 1
                n = self.issued
            self.open.add(n)
            return n

    def extra_number(self) -> int:
        """A number for a re-evaluation: it finishes a candidate, so no cap stops it."""
        with self.lock:
            self.issued += 1
            self.open.add(self.issued)
            return self.issued

    def append(self, rows: list[Row]) -> None:
        with self.lock:
            for r in rows:
                ledger.append(self.cfg.ledger_path, self.cfg.metric, r)
                self.policy.after_row(r)

    def record(self, lane: Lane, ctx: Context, rows: list[Row]) -> None:
        """Append a candidate's rows (in one go), clear its journal, report the primary row."""
        with self.lock:
            for r in rows:
                r.lane = lane.index
            self.append(rows)
            if len(rows) > 1:
                self.state.update_sigma(ledger.read_rows(self.cfg.ledger_path))
            clear_journal(self.cfg, ctx.journal)
            if self.monitor is not None:
                self.monitor.after_row(rows[0])
            self.open.discard(rows[0].iteration)
            self.state.iteration = max(self.state.iteration, rows[0].iteration)
            self.progress("row", {"row": rows[0], "best": self.state.best_value, "lane": lane.index,
                                  "elapsed_s": self.policy.clock.elapsed_s(), "eta_s": self.eta_s()})

    def eta_s(self) -> float | None:
        cfg = self.cfg
        if cfg.hours is not None:
            return max(0.0, cfg.hours * 3600 - self.policy.clock.elapsed_s())
        if cfg.iterations is not None and self.policy.walls:
            left = max(0, cfg.iterations - self.policy.proposed)
            lanes = max(1, min(self.wanted, len(self.lanes)))
            return left * sum(self.policy.walls) / len(self.policy.walls) / lanes
        return None

    def abort(self, error: BaseException | None) -> None:
        with self.gate:
            if error is not None and self.error is None:
                self.error = error
            self.cancel.set()

    # --- proposals ----------------------------------------------------------------------------

    def prepare(self, lane: Lane, slot: int, note: str = "") -> tuple[int, Candidate] | None:
        """Propose, check and commit one candidate on the current best, in the lane's slot."""
        if self.turns is not None:
            self.turns.take(self.turn_index, self.cancel)
        try:
            return self._prepare(lane, slot, note)
        finally:
            if self.turns is not None:
                self.turns.finish(self.turn_index)

    def _prepare(self, lane: Lane, slot: int, note: str) -> tuple[int, Candidate] | None:
        n = self.next_number()
        if n is None:
            return None
        ctx = lane.slots[slot]
        with self.lock:
            parent, best = self.state.best_commit, self.state.best_value
        self.progress("iteration", {"iteration": n, "lane": lane.index, "elapsed_s": self.policy.clock.elapsed_s()})
        try:
            cand = prepare_candidate(ctx, self.state, n, parent, best, note=note)
        finally:
            with self.gate:
                self.committing.discard(threading.get_ident())
        if cand.commit:
            self.journal(lane, ctx, cand)
        return slot, cand

    def journal(self, lane: Lane, ctx: Context, cand: Candidate) -> None:
        write_journal(ctx.cfg, cand.journal_entry(lane=lane.index), ctx.journal)

    def prepare_async(self, lane: Lane, slot: int, note: str) -> Future:
        future: Future = Future()

        def work() -> None:
            try:
                future.set_result(self.prepare(lane, slot, note))
            except Cancelled:
                future.set_result(None)
            except BaseException as e:  # noqa: BLE001 - an error in the researcher stops the run
                if not self.cancel.is_set():
                    self.abort(e)
                future.set_result(None)

        thread = threading.Thread(target=work, name=f"propose-{lane.index}", daemon=True)
        self.proposals = [t for t in self.proposals if t.is_alive()] + [thread]
        thread.start()
        return future

    def wait(self, future: Future) -> tuple[int, Candidate] | None:
        while not self.cancel.is_set():
            try:
                return future.result(timeout=POLL_S)
            except FutureTimeout:
                continue
        return None

    # --- moving a candidate onto the best, training, deciding ---------------------------------

    def refresh(self, lane: Lane, ctx: Context, cand: Candidate) -> Candidate | None:
        """A proposal made on an older best is rebased onto the best before it trains."""
        with self.lock:
            best = self.state.best_commit
            if cand.outcome is not None or cand.parent == best:
                return cand
            moved = rebased(ctx, self.state, cand, best, cand.iteration)
            if isinstance(moved, Candidate):
                if moved.commit:
                    self.journal(lane, ctx, moved)
                return moved
            self.record(lane, ctx, [conflict_row(ctx, cand, best, moved)])
            return None

    def judge(self, lane: Lane, ctx: Context, cand: Candidate) -> Candidate | None:
        """Train cand and decide against the best at decision time; a re-evaluation, if one is due."""
        st = self.state
        with self.lock:
            cand.best_before = st.best_value
            best_runs, sigma = st.best_runs, st.sigma
        m = measure(ctx, st, cand, best_runs, sigma, cancel=self.cancel)
        faults.point("after_train")
        if m.failure is not None:
            self.record(lane, ctx, [m.failure])
            return None
        verdict, description = m.verdict, m.description
        with self.lock:
            again: Candidate | None = None
            if verdict == decide.KEEP and st.best_commit != cand.parent:
                verdict, best = decide.DISCARD, st.best_commit
                n = self.extra_number()
                moved = rebased(ctx, st, cand, best, n)
                won = f"beat its parent {cand.parent[:12]} ({cand.best_before:.6f}), but another lane moved the best"
                if isinstance(moved, Candidate):
                    again = moved
                    description += f" [{won} to {best[:12]} meanwhile: re-evaluated on it as iteration {n}]"
                else:
                    self.open.discard(n)
                    self.issued -= 1  # under the lock, n is still the last number handed out
                    description += f" [{won} to {best[:12]} and it conflicts with it: {', '.join(moved)}]"
            m.verdict, m.description = verdict, description
            primary = m.primary(ctx, cand, sigma)
            if verdict == decide.KEEP:
                st.best_commit, st.best_value, st.best_runs = cand.commit, m.mean, len(m.values)
                self.ctx.wt.reset_hard(cand.commit)  # the run branch moves to the new best
            self.record(lane, ctx, [primary, *m.repeats])
            if again is not None and again.outcome is not None:
                self.record(lane, ctx, [again.outcome])
                again = None
            elif again is not None:
                self.journal(lane, ctx, again)
            return again

    def note(self, cand: Candidate) -> str:
        return (f"Note: iteration {cand.iteration} ({ledger.one_line(cand.description, 120)}) is still "
                f"training on the current best. If it is kept, your change will be merged onto it; "
                f"a change that conflicts with it is thrown away.")

    def lane_loop(self, lane: Lane) -> None:
        pending: Future | None = None
        slot = 0
        try:
            while True:
                if lane.index == 0 and self.monitor is not None:  # a health checkpoint between lane 0's jobs
                    stop = self.monitor.before_iteration()
                    if stop:
                        with self.lock:
                            self.stopped = self.stopped or stop
                if pending is not None:
                    got, pending = self.wait(pending), None
                elif self.retiring(lane):
                    return
                else:
                    got = self.prepare(lane, slot)
                if got is None or not self.wait_ready():
                    return
                slot, cand = got
                ctx = lane.slots[slot]
                cand = self.refresh(lane, ctx, cand)
                if cand is None:
                    continue
                if cand.outcome is not None:
                    self.record(lane, ctx, [cand.outcome])
                    continue
                if self.pipelined and not self.retiring(lane):
                    pending = self.prepare_async(lane, 1 - slot, self.note(cand))
                while cand is not None:
                    cand = self.judge(lane, ctx, cand)
        finally:
            if self.turns is not None and lane.index == 0:
                self.turns.leave(self.turn_index)

    # --- the stop ------------------------------------------------------------------------------

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def shutdown(self) -> None:
        """After a stop: jobs killed (the executor), no commit half-done; a researcher still
        thinking is given PROPOSAL_GRACE_S, then stopped by the supervisor."""
        until = time.monotonic() + PROPOSAL_GRACE_S
        for t in [*self.threads, *self.proposals]:
            t.join(max(0.0, until - time.monotonic()))
        while self.committing and time.monotonic() < until + PROPOSAL_GRACE_S:
            time.sleep(0.05)

    def tidy(self, why: str) -> None:
        """Worktrees back at the best, journals kept for --resume; the stop's message."""
        if self.ctx is not None:
            self.state = runs.reconcile(self.ctx, self.state.baseline_commit if self.state else "") or self.state
        self.stopped = runs.interrupted(self.cfg, why)

    def summary(self) -> Summary:
        if self.policy is not None:
            self.policy.clock.save()
        return runs.summarize(self.cfg, self.state, self.stopped or "done")

    def close(self) -> None:
        """Every worktree's GitPython processes stopped now: a supervisor that exits next must
        not leave them to outlive it, nor to whenever the objects are collected."""
        for ctx in [self.ctx, *(c for lane in self.lanes for c in lane.slots)]:
            if ctx is not None:
                ctx.wt.close()


class Guarded:
    """The researcher, wrapped so that no proposal is committed once the run is being stopped."""

    def __init__(self, inner: Any, run: RunDriver):
        self.inner, self.run = inner, run
        self.name, self.model = inner.name, getattr(inner, "model", None)

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def propose(self, task):
        proposal = self.inner.propose(task)
        with self.run.gate:
            if self.run.cancel.is_set():
                raise Cancelled()
            self.run.committing.add(threading.get_ident())
        return proposal


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
                drive(runs_, executor, schedule)
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
        summaries = [r.summary() for r in runs_]
    if interrupted is None and seen["signum"] is not None:  # it came while the run was ending anyway
        interrupted = Interrupted(seen["signum"])
    return summaries, interrupted


def drive(runs_: list[RunDriver], executor: Executor, schedule: str) -> None:
    for r in runs_:
        r.open_run(executor)
    groups = [[r] for r in runs_] if schedule == "sequential" else [runs_]
    for group in groups:
        for r in group:
            r.started_with = r.policy.proposed
            r.start()
        while any(r.alive() for r in group):
            if any(r.error is not None for r in group):  # one run's error stops them all
                for r in group:
                    r.abort(None)
            for r in group:
                for t in r.threads:
                    t.join(POLL_S)
        errors = [r.error for r in group if r.error is not None]
        if errors:
            raise errors[0]


def stop(runs_: list[RunDriver], executor: Executor | None) -> None:
    """Every run's lanes told to stop, training jobs killed, researchers killed, threads joined."""
    for r in runs_:
        r.abort(None)
    if executor is not None:
        executor.close()
    if supervise.current() is not None:
        supervise.current().stop_all()
    for r in runs_:
        r.shutdown()


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
    from .agents import make_researcher
    from .pipeline import pipelined
    researcher = researcher or make_researcher(cfg.agent, cfg.model, cfg.agent_options)
    return single(cfg, researcher, resume, progress, pipelined(cfg), steps)[0]
