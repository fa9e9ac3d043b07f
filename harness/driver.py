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

Stops: one StopPolicy per run (stops.py). Interrupts: SIGINT, SIGTERM and SIGHUP raise
`Interrupted` in the main thread during the set-up; while the loop runs they are noted and the
loop raises it between its steps. The stop then stops issuing, cancels what is in flight (jobs
killed, researchers killed), waits a bounded grace, records what came back (a late proposal's
spend: a `stopped` row), and reconciles with nothing else running; further signals are ignored.
"""
from __future__ import annotations

import collections
import contextlib
import signal
import statistics
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, TimeoutError as FutureTimeout, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from . import decide, disk, events, ledger, testsplit
from .lifecycle import faults, health, recovery, runs, stops, supervise
from .agents import pricing
from .agents.base import printable
from .errors import ClusterGone, HarnessError
from .config import RunConfig
from .executors import Executor, make_executor
from .gitgate import GitGate, data_files
from .ledger import Row
from .lifecycle.runs import Progress, Summary
from .step import (Candidate, Context, FirstRun, RunState, clear_journal, confirm_run, conflict_row, first_run,
                   now_iso, prepare_candidate, primary_row, rebased, write_journal)

PROPOSAL_GRACE_S = 5.0  # s a stop waits for what is in flight (a proposal's commit, a job's end)
POLL_S = 0.2  # s the loop waits at most between its steps (lets a noted signal through)
LANES_CHECK_S = 2.0  # s between readings of the executor's slots, when the lanes follow them (Ray)
FLUSH_S = 5.0  # s the end of a run waits for its progress to be printed
IDLE_S = 1.0  # s a Printer's thread waits for the next event before it ends
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
    """A proposal that returned after the stop: never committed; its spend goes on a `stopped` row."""

    def __init__(self, proposal: Any = None):
        super().__init__("the run is stopping")
        self.proposal = proposal


@contextlib.contextmanager
def interrupts() -> Iterator[dict[str, Any]]:
    """The one interrupt path: the first SIGINT/SIGTERM/SIGHUP raises Interrupted in the main
    thread; later ones are only noted (the clean-up must run once, whole)."""
    # quiet: the run is ending, only note it; defer: the loop runs, it raises Interrupted between steps
    seen: dict[str, Any] = {"signum": None, "quiet": False, "defer": False}
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def handler(signum, frame):
        if seen["signum"] is None:
            seen["signum"] = signum
            if not seen["quiet"] and not seen["defer"]:
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


class Printer:
    """Progress handed to one printing thread: a paused terminal (Ctrl-S) or a pipe nobody reads
    blocks that thread only, never the loop that decides. Events wait in a bounded queue (the
    oldest dropped past it, and counted); flush() waits a bounded time at the end of a run."""

    LIMIT = 10_000

    def __init__(self, progress: Progress):
        self.progress, self.dropped = progress, 0
        self.queue: collections.deque = collections.deque()
        self.cond = threading.Condition()
        self.busy = False
        self.thread: threading.Thread | None = None  # started with the first event, gone when idle

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        with self.cond:
            if len(self.queue) >= self.LIMIT:
                self.queue.popleft()
                self.dropped += 1
            self.queue.append((event, data))
            if self.thread is None:
                self.thread = threading.Thread(target=self._work, name="progress", daemon=True)
                self.thread.start()
            self.cond.notify_all()

    def _work(self) -> None:
        while True:
            with self.cond:
                self.busy = False
                self.cond.notify_all()
                if not self.queue:
                    self.cond.wait(IDLE_S)
                if not self.queue:
                    self.thread = None
                    return
                event, data = self.queue.popleft()
                self.busy = True
            try:
                self.progress(event, data)
            except (OSError, ValueError):  # a closed terminal (SIGHUP) makes printing fail
                pass
            except Exception as e:  # noqa: BLE001 - a display's bug must not stop the run
                with contextlib.suppress(Exception):
                    sys.stderr.write(f"harness: progress display failed: {type(e).__name__}: {e}\n")

    def flush(self, timeout_s: float = FLUSH_S) -> bool:
        """Wait until everything queued is printed (True), or timeout_s (a terminal that stays paused)."""
        until = time.monotonic() + timeout_s
        with self.cond:
            while self.queue or self.busy:
                left = until - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, POLL_S))
        return True


def safe(progress: Progress) -> Progress:
    """Progress that can never stop the run: a closed terminal (SIGHUP) makes printing fail. A
    Printer is safe already (and prints from its own thread)."""
    if isinstance(progress, Printer):
        return progress

    def emit(event: str, data: dict[str, Any]) -> None:
        try:
            progress(event, data)
        except (OSError, ValueError):
            pass
    return emit


def spawn(fn: Callable[..., Any], *args: Any, name: str) -> Future:
    """fn(*args) in a daemon thread of its own, as a Future: a worker for the loop. Daemon: a
    researcher or a job that hangs past the stop's grace never keeps the process alive."""
    future: Future = Future()

    def work() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the loop with the future
            future.set_exception(e)
    threading.Thread(target=work, name=name, daemon=True).start()
    return future


class Turns:
    """Interleaved A/B arms take turns: arm i makes its k-th proposal once every arm before it has
    made its k-th and every arm after it its (k-1)-th; an arm that stops leaves the round. Asked by
    the one loop only (no lock)."""

    def __init__(self, n: int):
        self.done = [0] * n
        self.gone: set[int] = set()

    def may(self, i: int) -> bool:
        others = [j for j in range(len(self.done)) if j != i and j not in self.gone]
        return all(self.done[j] > self.done[i] if j < i else self.done[j] >= self.done[i] for j in others)

    def finish(self, i: int) -> None:
        self.done[i] += 1

    def leave(self, i: int) -> None:
        self.gone.add(i)


@dataclass
class Training:
    """A candidate being trained: its first run, then the confirmation runs the gate asks for."""
    cand: Candidate
    ctx: Context
    future: Future
    best_runs: int
    sigma: float | None
    first: FirstRun | None = None
    values: list[float] = field(default_factory=list)
    repeats: list[Row] = field(default_factory=list)
    confirming: int = 0  # the confirmation run in flight (1..confirm); 0 = the first run
    resumed: bool = False  # a candidate an interruption left (its journal counts the attempt)


@dataclass
class Lane:
    index: int
    slots: list[Context]  # one worktree, or two when pipelined
    proposing: Future | None = None  # a proposal in flight, in slot prop_slot
    prop_slot: int = 0
    prop_n: int = 0  # its iteration number and parent (a late proposal's row needs them)
    prop_parent: str = ""
    turn_taken: bool = False  # its proposal counts in the interleaved arms' round
    queued: tuple[int, Candidate] | None = None  # a proposal back, waiting to train
    training: Training | None = None
    following: Training | None = None  # pipelined: the next candidate, handed to the executor before
    # `training` is decided, so it trains while `training` is evaluated (decided after it)
    health: Future | None = None  # lane 0's health re-run, between its jobs
    health_stop: str | None = None  # the checkpoint's stop, once its re-run is on the ledger
    checked: bool = False  # lane 0's checkpoint looked at since its last job
    done: bool = False  # starts no more proposals (a stop, the step done, retired)

    def busy(self) -> bool:
        return bool(self.proposing or self.queued or self.training or self.following or self.health)

    def futures(self) -> list[Future]:
        out = [f for f in (self.proposing, self.health) if f is not None]
        return out + [t.future for t in (self.training, self.following) if t is not None]


# ---------------------------------------------------------------------------
# One run


class RunDriver:
    """One run's lanes, best, ledger and stop policy. Only the driver's loop calls its methods
    (step, stop_work): they decide, move the branch and write rows; the workers (spawn) propose,
    commit in a lane's own worktree, and train; nothing here is shared with them but Futures."""

    def __init__(self, cfg: RunConfig, researcher: Any, resume: bool, progress: Progress,
                 n_lanes: int | None, pipelined: bool, cancel: threading.Event, steps: int | None = None):
        self.cfg, self.researcher, self.resume = cfg, researcher, resume
        self.progress_fn = progress
        self.n_lanes, self.pipelined, self.cancel = n_lanes, pipelined, cancel
        self.steps = steps  # proposals this session may start (`harness step`: 1); None = no bound
        self.gate = threading.Lock()  # orders the stop against commits of finished proposals (Guarded)
        self.committing: set[int] = set()
        self.ready = False  # the baseline is measured (and waiting candidates trained)
        self.error: BaseException | None = None
        self.stopped: str | None = None
        self.ctx: Context | None = None
        self.state: RunState | None = None
        self.lanes: list[Lane] = []
        self.executor: Any = None
        self.guarded: Guarded | None = None
        self.wanted = 0  # lanes that may start a candidate: all, or the executor's live slots (n_lanes None)
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
        self.phase = "new"  # new -> baseline | waiting -> lanes -> end -> done
        self.task: Future | None = None  # the phase's own worker: the baseline, a waiting candidate, the test split
        self.waiting: list[tuple[Path, dict[str, Any]]] = []
        self.resumed: Training | None = None
        self.tests: testsplit.Scorer | None = None
        self.checked_slots = 0.0
        self.late: list[Row] = []  # rows of proposals that came back after the stop

    # --- set-up (the loop's thread: all git set-up is serial) ---------------------------------

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

    def start(self) -> None:
        """The baseline (or the candidates an interruption left) starts; pipelined, a fresh run's
        first proposals are made while the baseline trains."""
        self.started_with = self.policy.proposed
        self.tests = testsplit.Scorer(self.ctx, self.state, self.cancel, self.progress)  # the private test split
        if self.fresh:
            self.phase = "baseline"
            self.task = spawn(runs.baseline, self.ctx, self.state, self.progress, name=f"baseline-{self.cfg.tag}")
        else:
            self.phase = "waiting"
            self.waiting = runs.pending(self.cfg.run_dir, ledger.read_rows(self.cfg.ledger_path))

    def futures(self) -> list[Future]:
        out = [self.task] if self.task is not None else []
        if self.resumed is not None:
            out.append(self.resumed.future)
        return out + [f for lane in self.lanes for f in lane.futures()]

    def finished(self) -> bool:
        return self.phase == "done"

    # --- the loop's step ---------------------------------------------------------------------

    def step(self) -> None:
        """Move this run on by whatever came back; start what may start. Never blocks on a worker."""
        if self.phase == "baseline":
            if self.pipelined:
                for lane in self.lanes:
                    self.lane_step(lane)  # proposals made while the baseline trains wait for it
            if self.task is not None and self.task.done():
                got, self.task = self.task.result(), None
                self.append(got.rows)
                if got.error is not None:
                    raise got.error
                st = self.state
                st.best_value, st.best_runs, st.sigma = got.value, got.runs, got.sigma
                self.state.iteration = max(self.state.iteration, 0)
                self.went_live()
        elif self.phase == "waiting":
            self.step_waiting()
        elif self.phase == "lanes":
            self.step_lanes()
        elif self.phase == "end":
            if self.task is None or self.task.done():
                if self.task is not None:
                    self.task.result()
                self.task, self.phase = None, "done"

    def step_waiting(self) -> None:
        """--resume: each committed candidate an interruption left is trained first, in iteration
        order, once (a second interruption while it trains records it as an interrupted crash)."""
        if self.resumed is not None:
            if not self.resumed.future.done():
                return
            tr, self.resumed = self.resumed, None
            self.trained(None, tr)
            if self.resumed is not None:  # a re-evaluation (it cannot be: one at a time) or a confirmation
                return
        while self.resumed is None and self.waiting:
            path, data = self.waiting.pop(0)
            cand, row = runs.waiting_candidate(self.ctx, self.state, data)
            if row is not None:
                row.lane = data.get("lane")
                self.ctx.wt.reset_hard(self.state.best_commit)
                self.append([row])
                path.unlink(missing_ok=True)
                self.state.iteration = max(self.state.iteration, cand.iteration)
                continue
            write_journal(self.cfg, cand.journal_entry(attempts=1), self.ctx.journal)  # a second kill records it
            if path.name != self.ctx.journal:
                path.unlink(missing_ok=True)
            self.progress("resumed", {"iteration": cand.iteration, "commit": cand.commit})
            self.resumed = self.start_training(self.ctx, cand, resumed=True)
        if self.resumed is None and not self.waiting:
            self.went_live()

    def went_live(self) -> None:
        """The baseline is measured (or the waiting candidates trained): the lanes start."""
        self.issued = max(self.issued, self.state.iteration)
        rows = stops.ledger_rows(self.cfg)
        if not self.fresh:  # handed out again first, so the ledger's numbers have no gap
            used = {r.get("iteration") or 0 for r in rows} | self.open
            self.unused = [n for n in range(1, max(used, default=0)) if n not in used]
        self.policy.resync(rows)
        self.policy.proposed += len(self.open)  # proposals made while the baseline trained
        self.monitor = health.Monitor(replace(self.ctx, researcher=self.researcher), self.state, self.progress,
                                      self.events_from)
        self.progress("start", {"best": self.state.best_value, "iteration": self.state.iteration,
                                "lanes": len(self.lanes), "pipeline": self.pipelined})
        self.ready, self.phase = True, "lanes"
        self.step_lanes()

    def step_lanes(self) -> None:
        if self.n_lanes is None and time.monotonic() - self.checked_slots >= LANES_CHECK_S:
            self.follow_slots()
            self.checked_slots = time.monotonic()
        for lane in self.lanes:
            self.lane_step(lane)
        if self.task is not None and self.task.done():  # a test-split scoring
            got, self.task = self.task, None
            got.result()
        if self.task is None and self.tests is not None:
            due = self.tests.due()
            if due and self.tests.unscored(due):
                self.task = spawn(self.tests.score_points, due, ledger.read_rows(self.cfg.ledger_path),
                                  name=f"test-{self.cfg.tag}")
        if all(lane.done and not lane.busy() for lane in self.lanes):
            if self.task is not None:
                return  # a scoring still in flight
            if self.turns is not None:
                self.turns.leave(self.turn_index)
            self.phase = "end"
            if self.error is None and self.steps is None and self.tests is not None:  # the run ends here
                wanted = self.tests.end_points()
                if wanted and self.tests.unscored(wanted):
                    self.task = spawn(self.tests.score_points, wanted, ledger.read_rows(self.cfg.ledger_path),
                                      name=f"test-{self.cfg.tag}")

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
                self.lanes.append(self.new_lane(i))
            self.lanes[i].done = False

    def retiring(self, lane: Lane) -> bool:
        """A lane above the executor's live slots starts no new candidate (it finishes the one it has)."""
        return lane.index >= self.wanted

    # --- one lane ------------------------------------------------------------------------------

    def lane_step(self, lane: Lane) -> None:
        if lane.proposing is not None and lane.proposing.done():
            self.proposal_back(lane)
        if lane.health is not None and lane.health.done():
            hr, lane.health = lane.health.result(), None
            self.append([self.monitor.after_rerun(hr)])
            self.monitor.recorded(hr)
            if lane.health_stop:
                self.stopped = self.stopped or lane.health_stop
        if lane.training is not None and lane.training.future.done():
            tr, lane.training = lane.training, None
            self.trained(lane, tr)
        if lane.training is None and lane.following is not None:
            self.follow(lane)
        if not self.ready or lane.training is not None or lane.health is not None:
            if not self.ready and self.pipelined and not lane.busy() and not lane.done:
                self.propose(lane, 0)  # hidden behind the baseline
            elif self.ready and lane.training is not None and lane.health is None:
                self.overlap(lane)
            return
        if self.checkpoint(lane):
            return
        if lane.queued is not None:
            slot, cand = lane.queued
            lane.queued = None
            self.start_candidate(lane, slot, cand)
            if lane.training is not None or self.checkpoint(lane):  # its row may end a streak
                return
        if lane.proposing is None and not lane.done:
            if self.retiring(lane):
                lane.done = True
            else:
                self.propose(lane, lane.prop_slot)

    def checkpoint(self, lane: Lane) -> bool:
        """Lane 0's health checkpoint, between its jobs and before its next proposal (once per row):
        a stop, or a re-run of the best started (True: the lane waits for it)."""
        if lane.index != 0 or self.monitor is None or lane.checked:
            return False
        lane.checked = True
        stop, due = self.monitor.before_iteration()
        if due is not None:
            lane.health, lane.health_stop = spawn(self.monitor.rerun, due, name="health"), stop
            return True
        if stop:
            self.stopped = self.stopped or stop
        return False

    def propose(self, lane: Lane, slot: int, note: str = "") -> None:
        """A new proposal in the lane's slot, on the current best (or the lane is done: a stop)."""
        if self.turns is not None and not self.turns.may(self.turn_index):
            return  # the other arms' turn first
        n = self.next_number()
        if n is None:
            lane.done = True
            return
        ctx = lane.slots[slot]
        parent, best = self.state.best_commit, self.state.best_value
        self.progress("iteration", {"iteration": n, "lane": lane.index, "elapsed_s": self.policy.clock.elapsed_s()})
        lane.prop_slot, lane.turn_taken, lane.prop_n, lane.prop_parent = slot, self.turns is not None, n, parent
        lane.proposing = spawn(self._prepare, lane.index, ctx, n, parent, best, note,
                               name=f"propose-{self.cfg.tag}-{lane.index}")

    def _prepare(self, index: int, ctx: Context, n: int, parent: str, best: float, note: str) -> Candidate:
        """A worker: propose, check and commit one candidate in ctx's own worktree; its journal."""
        try:
            cand = prepare_candidate(ctx, self.state, n, parent, best, note=note)
        finally:
            with self.gate:
                self.committing.discard(threading.get_ident())
        if cand.commit:
            write_journal(ctx.cfg, cand.journal_entry(lane=index), ctx.journal)
        return cand

    def proposal_back(self, lane: Lane) -> None:
        future, lane.proposing = lane.proposing, None
        if lane.turn_taken and self.turns is not None:
            self.turns.finish(self.turn_index)
        cand = future.result()  # a researcher's error stops the run (raised); Cancelled: at the stop only
        if cand.proposal.error:
            self.state.last_failure_log = self.cfg.logs_dir / f"iter-{cand.iteration:04d}-agent.log"
        lane.queued = (lane.prop_slot, cand)  # started (or its outcome recorded) once the lane is free

    def start_candidate(self, lane: Lane, slot: int, cand: Candidate) -> None:
        """A proposal back: its outcome recorded, or moved onto the best and trained; pipelined, the
        lane's next proposal starts in its other worktree while this one trains."""
        ctx = lane.slots[slot]
        if cand.outcome is None and cand.parent != self.state.best_commit:
            best = self.state.best_commit
            moved = rebased(ctx, self.state, cand, best, cand.iteration)
            if isinstance(moved, list):
                self.record(lane, ctx, [conflict_row(ctx, cand, best, moved)])
                return
            cand = moved
            if cand.commit:
                self.journal(lane, ctx, cand)
        if cand.outcome is not None:
            self.record(lane, ctx, [cand.outcome])
            return
        lane.training = self.start_training(ctx, cand)
        lane.checked = False
        if self.pipelined and not self.retiring(lane) and lane.proposing is None and not lane.done:
            self.propose(lane, 1 - slot, self.note(cand))

    def overlap(self, lane: Lane) -> None:
        """Pipelined, on an executor that evaluates beside the next job (executors/local.py): the
        queued candidate is handed to it while the lane's current one is still training or being
        evaluated, so it trains the moment the slot is free. Only one that needs nothing of the
        decision first (on the best as it is, no outcome of its own to record), so the lane's rows
        stay in iteration order; it is decided after the current one (follow). If the current one
        is kept, it was trained on the old best: decided as a lane's candidate whose best moved
        (a win is rebased and trained again, `decided`). Only for a workload with a separate
        evaluation (evaluate_command): without one there is nothing to train beside."""
        if lane.following is not None or lane.queued is None or not self.pipelined or not self.cfg.evaluate_command \
                or not getattr(self.executor, "overlaps", False):
            return
        slot, cand = lane.queued
        if cand.outcome is not None or cand.parent != self.state.best_commit or self.checkpoint(lane):
            return
        lane.queued = None
        lane.following = self.start_training(lane.slots[slot], cand)

    def follow(self, lane: Lane) -> None:
        """The lane's current candidate is decided: the one that trained beside it is next, and the
        lane's next proposal starts in the worktree the decided one left."""
        tr, lane.following = lane.following, None
        lane.training, lane.checked = tr, False
        slot = next(i for i, ctx in enumerate(lane.slots) if ctx is tr.ctx)
        if self.pipelined and not self.retiring(lane) and lane.proposing is None and not lane.done:
            self.propose(lane, 1 - slot, self.note(tr.cand))

    def start_training(self, ctx: Context, cand: Candidate, resumed: bool = False) -> Training:
        st = self.state
        cand.best_before = st.best_value
        return Training(cand, ctx, spawn(first_run, ctx, cand, self.cancel, name=f"train-{cand.iteration}"),
                        st.best_runs, st.sigma, resumed=resumed)

    def journal(self, lane: Lane, ctx: Context, cand: Candidate) -> None:
        write_journal(ctx.cfg, cand.journal_entry(lane=lane.index), ctx.journal)

    def note(self, cand: Candidate) -> str:
        return (f"Note: iteration {cand.iteration} ({ledger.one_line(cand.description, 120)}) is still "
                f"training on the current best. If it is kept, your change will be merged onto it; "
                f"a change that conflicts with it is thrown away.")

    # --- the one judge -------------------------------------------------------------------------

    def trained(self, lane: Lane | None, tr: Training) -> None:
        """A run of tr came back: record a failure, ask for a confirmation, or decide against the
        best as it is now (a win whose best another lane moved is re-evaluated on it)."""
        cfg, st, cand, ctx = self.cfg, self.state, tr.cand, tr.ctx
        faults.point("after_train")
        if tr.confirming == 0:
            tr.first = tr.future.result()  # KeyboardInterrupt: the job was cancelled by the stop
            if tr.first.failure is not None:
                st.last_failure_log = tr.first.log
                self.done_with(lane, tr, [tr.first.failure])
                return
            tr.values = [tr.first.result.value(cfg.metric)]
            can_confirm = cfg.confirm > 0
        else:
            result, row = tr.future.result()
            tr.repeats.append(row)
            if result.status != "ok":
                self.decided(lane, tr, decide.DISCARD, f"{cand.description} [a confirmation run failed]")
                return
            tr.values.append(result.value(cfg.metric))
            can_confirm = False
        verdict, thr = decide.decide(cfg.gate_settings, tr.values, cand.best_before, tr.best_runs, tr.sigma,
                                     can_confirm=can_confirm)
        if verdict == decide.CONFIRM or (tr.confirming and tr.confirming < cfg.confirm):
            tr.confirming += 1
            tr.future = spawn(confirm_run, ctx, cand, tr.confirming, self.cancel,
                              name=f"confirm-{cand.iteration}-{tr.confirming}")
            self.keep_training(lane, tr)
            return
        why = decide.why_discarded(cfg.gate_settings, tr.values, cand.best_before, thr) if verdict == decide.DISCARD else ""
        self.decided(lane, tr, verdict, f"{cand.description} [{why}]" if why else cand.description)

    def keep_training(self, lane: Lane | None, tr: Training) -> None:
        if lane is None:
            self.resumed = tr
        else:
            lane.training = tr

    def decided(self, lane: Lane | None, tr: Training, verdict: str, description: str) -> None:
        st, cand, ctx = self.state, tr.cand, tr.ctx
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
                self.issued -= 1  # n is still the last number handed out
                description += f" [{won} to {best[:12]} and it conflicts with it: {', '.join(moved)}]"
        primary = primary_row(ctx, cand, verdict, description, tr.values, tr.first, tr.sigma)
        if verdict == decide.KEEP:
            st.best_commit, st.best_value, st.best_runs = cand.commit, statistics.fmean(tr.values), len(tr.values)
            self.ctx.wt.reset_hard(cand.commit)  # the run branch moves to the new best
        self.done_with(lane, tr, [primary, *tr.repeats])
        if again is not None and again.outcome is not None:
            self.record(lane, ctx, [again.outcome])
        elif again is not None:
            if lane is not None:
                self.journal(lane, ctx, again)
            else:
                write_journal(self.cfg, again.journal_entry(), ctx.journal)
            self.keep_training(lane, self.start_training(ctx, again))

    def done_with(self, lane: Lane | None, tr: Training, rows: list[Row]) -> None:
        if lane is None and rows and rows[0].status != "keep":
            self.ctx.wt.reset_hard(self.state.best_commit)
        self.record(lane, tr.ctx, rows)

    # --- numbers and rows: the loop's only ---------------------------------------------------

    def next_number(self) -> int | None:
        """The next iteration number for a new proposal, or None when the run must not start one."""
        if self.stopped or self.cancel.is_set():
            return None
        if self.steps is not None and self.policy.proposed - self.started_with >= self.steps:
            self.stopped = "step done"
            return None
        reason = self.policy.reason(in_flight=len(self.open))
        if reason:
            self.stopped = reason
            if stops.is_budget(reason) and self.ready:
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
        self.issued += 1
        self.open.add(self.issued)
        return self.issued

    def append(self, rows: list[Row]) -> None:
        """The one writer of this run's ledger rows (and of the stop policy's spend and clock)."""
        for r in rows:
            ledger.append(self.cfg.ledger_path, self.cfg.metric, r)
            self.policy.after_row(r)

    def record(self, lane: Lane | None, ctx: Context, rows: list[Row]) -> None:
        """Append a candidate's rows (in one go), clear its journal, report the primary row."""
        for r in rows:
            r.lane = lane.index if lane is not None else r.lane
        if lane is not None:
            lane.checked = False  # lane 0's health checkpoint looks again before its next candidate
        self.append(rows)
        if len(rows) > 1:
            self.state.update_sigma(ledger.read_rows(self.cfg.ledger_path))
        clear_journal(self.cfg, ctx.journal)
        if self.monitor is not None:
            self.monitor.after_row(rows[0])
        self.open.discard(rows[0].iteration)
        self.state.iteration = max(self.state.iteration, rows[0].iteration)
        self.progress("row", {"row": rows[0], "best": self.state.best_value,
                              "lane": lane.index if lane is not None else None,
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

    # --- the stop ------------------------------------------------------------------------------

    def shutdown(self, until: float) -> None:
        """After the stop (jobs killed by the executor, researchers by the supervisor): what is in
        flight is given until `until` to come back, no commit left half-done; a proposal that came
        back has its spend recorded (a `stopped` row), known or not."""
        for f in self.futures():
            with contextlib.suppress(FutureTimeout, CancelledError):
                f.exception(timeout=max(0.0, until - time.monotonic()))
        while self.committing and time.monotonic() < until + PROPOSAL_GRACE_S:
            time.sleep(0.05)
        for lane in self.lanes:
            if lane.proposing is not None:
                future = lane.proposing
                if not future.done():
                    events.record(self.cfg.run_dir, "proposal_lost", f"lane {lane.index}: iteration {lane.prop_n}'s "
                                  f"proposal was still running {PROPOSAL_GRACE_S:.0f} s after the stop; what it "
                                  f"spent is unknown")
                    self.late.append(self.stopped_row(lane, None))
                    continue
                error = future.exception()
                if isinstance(error, Cancelled):
                    self.late.append(self.stopped_row(lane, error.proposal))
                elif error is None:
                    lane.queued = lane.queued or (lane.prop_slot, future.result())
            if lane.queued is not None and lane.queued[1].outcome is not None:
                self.late.append(lane.queued[1].outcome)  # back before the stop took it: as it was
            lane.queued = None  # a committed one is journalled: --resume trains it
        if self.resumed is not None:  # the user's stop is no crash: the next --resume trains it again
            write_journal(self.cfg, self.resumed.cand.journal_entry(), self.ctx.journal)

    def stopped_row(self, lane: Lane, proposal: Any) -> Row:
        """A proposal that came back after the stop (or never did): its spend, never trained."""
        model = pricing.resolve_model(self.cfg.model)
        usage = proposal.usage if proposal is not None else None
        tokens_in, cached, tokens_out = usage.cells() if usage is not None else (None, None, None)
        cost = pricing.call_cost(model, usage)[0] if usage is not None else None
        said = printable(proposal.description) if proposal is not None else ""
        return Row(commit=lane.prop_parent, metric=None, status="stopped", iteration=lane.prop_n, arm=self.cfg.arm,
                   description=ledger.one_line(f"{said or '(no description)'} [the run stopped before this "
                                               f"proposal was checked; never trained]"),
                   agent=self.researcher.name, model=model or "", parent=lane.prop_parent[:12],
                   started_at=now_iso(), agent_s=round(proposal.agent_s, 3) if proposal is not None else None,
                   input_tokens=tokens_in, cached_tokens=cached, output_tokens=tokens_out, cost_usd=cost,
                   retries=proposal.retries if proposal is not None else None, lane=lane.index, kind="stopped",
                   reason="stopped")

    def record_late(self) -> None:
        """The stop's own rows (late proposals' spend), with nothing else running."""
        late, self.late = self.late, []
        for row in late:
            with contextlib.suppress(Exception):
                self.append([row])
                self.open.discard(row.iteration)

    def tidy(self, why: str) -> None:
        """Worktrees back at the best, journals kept for --resume; the stop's message."""
        self.record_late()
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
        t0 = time.monotonic()
        proposal = self.inner.propose(task)
        if not proposal.agent_s:
            proposal.agent_s = time.monotonic() - t0
        with self.run.gate:
            if self.run.cancel.is_set():
                raise Cancelled(proposal)
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
    from .agents import make_researcher
    from .pipeline import pipelined
    researcher = researcher or make_researcher(cfg.agent, cfg.model, cfg.agent_options)
    return single(cfg, researcher, resume, progress, pipelined(cfg), steps)[0]
