"""One run (a `harness run`, or one A/B arm) as the loop drives it: its set-up, the loop's step
(phases baseline / waiting / lanes / end), iteration numbers and the one writer of its rows
(`append`); its lanes (lanes.py), judge (judge.py) and stop (stop.py) are the parts it is
made of. `Guarded`: the researcher, so that no proposal is committed once the run stops."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..ledger import events
from .. import ledger
from ..workload import testsplit
from ..lifecycle import health, runs, stops
from ..config import RunConfig
from ..gitgate import GitGate, data_files
from ..ledger import Row
from ..lifecycle.runs import Progress
from .judge import Judge
from .lanes import Lane, Lanes, Training, Turns, spawn
from .stop import Stop
from .signals import Cancelled
from .step import Context, RunState, clear_journal, write_journal

LANES_CHECK_S = 2.0  # s between readings of the executor's slots, when the lanes follow them (Ray)


# ---------------------------------------------------------------------------
# One run


class RunDriver(Lanes, Judge, Stop):
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
                                      True, name=f"test-{self.cfg.tag}")

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

    # --- numbers and rows: the loop's only ---------------------------------------------------

    def step_done(self) -> bool:
        """`harness step`: this session has made the proposals it may."""
        return self.steps is not None and self.policy.proposed - self.started_with >= self.steps

    def next_number(self) -> int | None:
        """The next iteration number for a new proposal, or None when the run must not start one."""
        if self.stopped or self.cancel.is_set():
            return None
        if self.step_done():
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
