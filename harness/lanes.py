"""The lane scheduler: one lane per GPU, each proposing the next candidate while one trains.

Every lane owns one GPU and one or two detached worktrees under runs/<tag>/lanes/ (two when
pipelined: one proposes while the other trains). All lanes share one RunState (one best) and
one ledger; appends, best updates and iteration numbers are serialised by one lock, and the
run branch only ever moves, under that lock, to a kept commit: its HEAD is always the best.

A candidate whose parent is no longer the best is moved onto the best by a 3-way merge
(rebase.merge_onto) before it trains; a conflict is a ledger row of its own. A candidate
that beat the best it started from while another lane moved the best is rebased and trained
again (a new iteration) before it can be kept. Decisions are taken against the best at
decision time, never the best at proposal time.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from . import decide, health, ledger, loop
from .loop import Progress
from .ledger import Row
from .step import (Candidate, Context, RunState, clear_journal, conflict_row, measure, prepare_candidate, rebased,
                   write_journal)

PROPOSAL_GRACE_S = 5.0  # s to wait on Ctrl-C for proposal threads to finish (a commit in progress)
JOIN_POLL_S = 0.2  # s between checks of the lane threads (lets Ctrl-C through)


class Cancelled(BaseException):
    """A proposal that returned after Ctrl-C: it is dropped before anything is committed."""


class Guarded:
    """The researcher, wrapped so that no proposal is committed once the run is being stopped."""

    def __init__(self, inner, sched: "Scheduler"):
        self.inner, self.sched = inner, sched
        self.name, self.model = inner.name, getattr(inner, "model", None)

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def propose(self, task):
        proposal = self.inner.propose(task)
        with self.sched.gate:
            if self.sched.cancel.is_set():
                raise Cancelled()
            self.sched.committing.add(threading.get_ident())
        return proposal


@dataclass
class Lane:
    index: int
    slots: list[Context]  # one worktree, or two when pipelined
    training: bool = False  # a job of this lane is on its GPU (Ctrl-C waits for it to be killed)


class Scheduler:
    def __init__(self, main: Context, state: RunState, lanes: list[Lane], pipelined: bool,
                 progress: Progress, deadline: float | None, start: float):
        self.main, self.state, self.lanes, self.pipelined = main, state, lanes, pipelined
        self.cfg = main.cfg
        self.progress_fn, self.deadline, self.start = progress, deadline, start
        self.lock = threading.RLock()  # ledger appends, best updates, iteration numbers
        self.gate = threading.Lock()  # orders Ctrl-C against commits of finished proposals
        self.cancel = threading.Event()  # Ctrl-C or an error: kill training, commit nothing more
        self.committing: set[int] = set()  # threads between a proposal's return and its commit
        self.error: BaseException | None = None
        self.stopped: str | None = None
        self.issued = state.iteration  # the last iteration number handed out
        self.open: set[int] = set()  # issued numbers without a row yet
        rows = ledger.read_rows(self.cfg.ledger_path)
        self.walls: list[float] = [rows[0].get("wall_s") or 0.0] if rows else []
        self.threads: list[threading.Thread] = []
        self.proposals: list[threading.Thread] = []
        self.monitor: health.Monitor | None = None  # health checkpoints, run by lane 0 between its jobs

    # --- shared state, under the lock --------------------------------------------------

    def progress(self, event: str, data: dict[str, Any]) -> None:
        with self.lock:  # progress printers are not thread-safe
            self.progress_fn(event, data)

    def next_number(self) -> int | None:
        """The next iteration number, or None when the run must not start another proposal."""
        cfg = self.cfg
        with self.lock:
            if self.stopped or self.cancel.is_set():
                return None
            if cfg.iterations is not None and self.issued >= cfg.iterations:
                self.stopped = f"reached --iterations {cfg.iterations}"
                return None
            if self.deadline is not None:
                estimate = max(self.walls[-5:] or [0.0])
                if time.monotonic() + estimate > self.deadline:
                    self.stopped = f"reached --hours {cfg.hours:g} (the next iteration would not finish in time)"
                    return None
            reason = loop.stop_for_budget(self.main, self.state, ledger.read_rows(cfg.ledger_path),
                                          self.issued + 1, in_flight=len(self.open))
            if reason:
                self.issued += 1
                self.stopped = reason
                return None
            self.issued += 1
            self.open.add(self.issued)
            return self.issued

    def extra_number(self) -> int:
        """A number for a re-evaluation: it finishes a candidate, so no cap stops it."""
        with self.lock:
            self.issued += 1
            self.open.add(self.issued)
            return self.issued

    def record(self, lane: Lane, ctx: Context, rows: list[Row]) -> None:
        """Append a candidate's rows (in one go), clear its journal, report the primary row."""
        with self.lock:
            for r in rows:
                r.lane = lane.index
                ledger.append(self.cfg.ledger_path, self.cfg.metric, r)
            if len(rows) > 1:
                self.state.update_sigma(ledger.read_rows(self.cfg.ledger_path))
            clear_journal(self.cfg, ctx.journal)
            if self.monitor is not None:
                self.monitor.after_row(rows[0])
            self.open.discard(rows[0].iteration)
            self.state.iteration = max(self.state.iteration, rows[0].iteration)
            self.walls.append(rows[0].wall_s or 0.0)
            eta = self.deadline - time.monotonic() if self.deadline else None
            self.progress("row", {"row": rows[0], "best": self.state.best_value, "lane": lane.index,
                                  "elapsed_s": time.monotonic() - self.start, "eta_s": eta})

    def abort(self, error: BaseException | None) -> None:
        with self.gate:
            if error is not None and self.error is None:
                self.error = error
            self.cancel.set()

    # --- proposals ---------------------------------------------------------------------

    def prepare(self, lane: Lane, slot: int, note: str = "") -> tuple[int, Candidate] | None:
        """Propose, check and commit one candidate on the current best, in the lane's slot."""
        n = self.next_number()
        if n is None:
            return None
        ctx = lane.slots[slot]
        with self.lock:
            parent, best = self.state.best_commit, self.state.best_value
        self.progress("iteration", {"iteration": n, "lane": lane.index,
                                    "elapsed_s": time.monotonic() - self.start})
        try:
            cand = prepare_candidate(ctx, self.state, n, parent, best, note=note)
        finally:
            with self.gate:
                self.committing.discard(threading.get_ident())
        if cand.commit:
            self.journal(lane, ctx, cand)
        return slot, cand

    def journal(self, lane: Lane, ctx: Context, cand: Candidate) -> None:
        """The slot's journal for a committed candidate, with what its proposal cost (for resume)."""
        write_journal(ctx.cfg, cand.journal_entry(lane=lane.index), ctx.journal)

    def prepare_async(self, lane: Lane, slot: int, note: str) -> Future:
        future: Future = Future()

        def work() -> None:
            try:
                future.set_result(self.prepare(lane, slot, note))
            except Cancelled:
                future.set_result(None)
            except BaseException as e:  # noqa: BLE001 - a Ctrl-C in the researcher stops the run
                if not self.cancel.is_set():
                    self.abort(e)
                future.set_result(None)

        thread = threading.Thread(target=work, name=f"propose-{lane.index}", daemon=True)
        self.proposals.append(thread)
        thread.start()
        return future

    # --- moving a candidate onto the best ------------------------------------------------

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

    # --- training and the decision ---------------------------------------------------------

    def judge(self, lane: Lane, ctx: Context, cand: Candidate) -> Candidate | None:
        """Train cand and decide against the best at decision time; a re-evaluation, if one is due."""
        st = self.state
        with self.lock:
            cand.best_before = st.best_value
            best_runs, sigma = st.best_runs, st.sigma
        m = measure(ctx, st, cand, best_runs, sigma, cancel=self.cancel)
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
                self.main.wt.reset_hard(cand.commit)  # the run branch moves to the new best
            self.record(lane, ctx, [primary, *m.repeats])
            if again is not None and again.outcome is not None:
                self.record(lane, ctx, [again.outcome])
                again = None
            elif again is not None:
                self.journal(lane, ctx, again)
            return again

    # --- the lanes -----------------------------------------------------------------------

    def lane_loop(self, lane: Lane) -> None:
        pending: Future | None = None
        slot = 0
        while True:
            if pending is not None:
                got, pending = self.wait(pending), None
            else:
                got = self.prepare(lane, slot)
            if got is None:
                return
            slot, cand = got
            ctx = lane.slots[slot]
            cand = self.refresh(lane, ctx, cand)
            if cand is None:
                continue
            if cand.outcome is not None:
                self.record(lane, ctx, [cand.outcome])
                continue
            if self.pipelined:
                note = (f"Note: iteration {cand.iteration} ({ledger.one_line(cand.description, 120)}) is still "
                        f"training on the current best. If it is kept, your change will be merged onto it; "
                        f"a change that conflicts with it is thrown away.")
                pending = self.prepare_async(lane, 1 - slot, note)
            lane.training = True
            try:
                while cand is not None:
                    cand = self.judge(lane, ctx, cand)
            finally:
                lane.training = False
            if lane.index == 0 and self.monitor is not None:  # lane 0's GPU is free right now
                stop = self.monitor.before_iteration()
                if stop:
                    with self.lock:
                        self.stopped = self.stopped or stop

    def wait(self, future: Future) -> tuple[int, Candidate] | None:
        """A proposal's result; None at once on Ctrl-C (the proposal itself commits nothing then)."""
        while not self.cancel.is_set():
            try:
                return future.result(timeout=JOIN_POLL_S)
            except FutureTimeout:
                continue
        return None

    def lane_main(self, lane: Lane) -> None:
        try:
            self.lane_loop(lane)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            if not isinstance(e, Cancelled) and not self.cancel.is_set():
                self.abort(e)

    def run(self) -> str:
        """Run the lanes until a stop condition; raises KeyboardInterrupt on Ctrl-C or an error."""
        self.threads = [threading.Thread(target=self.lane_main, args=(lane,), name=f"lane-{lane.index}",
                                         daemon=True) for lane in self.lanes]
        for t in self.threads:
            t.start()
        try:
            while any(t.is_alive() for t in self.threads):
                for t in self.threads:
                    t.join(JOIN_POLL_S)
        except KeyboardInterrupt as e:
            self.abort(e)
            raise
        if self.error is not None:
            raise self.error
        return self.stopped or "done"

    def shutdown(self) -> None:
        """After Ctrl-C: training jobs killed, no commit half-done; a researcher still thinking is
        given PROPOSAL_GRACE_S, then abandoned (it can no longer commit anything)."""
        self.abort(None)
        for lane, t in zip(self.lanes, self.threads):
            if lane.training:  # its job is being killed: that takes at most the runner's grace
                t.join()
        until = time.monotonic() + PROPOSAL_GRACE_S
        for t in [*self.threads, *self.proposals]:
            t.join(max(0.0, until - time.monotonic()))
        while self.committing and time.monotonic() < until + PROPOSAL_GRACE_S:
            time.sleep(0.05)
