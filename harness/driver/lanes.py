"""A run's lanes: a lane proposes a candidate in its own detached worktree, has it trained, and
hands it to the judge; pipelined, it proposes the next one while the current one trains.
`spawn` makes a worker (a Future) for the loop; `Turns`: interleaved A/B arms take turns;
`Lane` and `Training` are a lane's small state; `Lanes` is RunDriver's part that steps one lane."""
from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import ledger
from ..ledger import Row
from .step import Candidate, Context, prepare_candidate, write_journal
from .training import FirstRun, conflict_row, first_run, rebased


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


class Lanes:
    """RunDriver's part that steps one lane: a proposal back, a candidate queued or started, the
    health checkpoint between its jobs. Called by the loop only, through RunDriver.step."""

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
        return Training(cand, ctx, spawn(first_run, ctx, cand, self.cancel, self.successor(),
                                         name=f"train-{cand.iteration}"),
                        st.best_runs, st.sigma, resumed=resumed)

    def successor(self) -> bool:
        """Does the run foresee another candidate's job after the one it hands the executor now? Not
        when it will propose nothing more (its --iterations or its step used, or a stop) and no other
        proposal is under way. A hint for the slot's warm start (executors.Job.successor): a job it
        did not foresee (a confirmation, a rebased candidate, a health re-run) starts cold, as the
        end's test-split jobs do anyway (their start differs: docs/pipeline.md)."""
        if any(lane.proposing is not None or lane.queued is not None for lane in self.lanes):
            return True
        iterations = self.cfg.iterations
        return not (self.stopped or self.cancel.is_set() or self.step_done()
                    or (iterations is not None and self.policy.proposed >= iterations))

    def journal(self, lane: Lane, ctx: Context, cand: Candidate) -> None:
        write_journal(ctx.cfg, cand.journal_entry(lane=lane.index), ctx.journal)

    def note(self, cand: Candidate) -> str:
        return (f"Note: iteration {cand.iteration} ({ledger.one_line(cand.description, 120)}) is still "
                f"training on the current best. If it is kept, your change will be merged onto it; "
                f"a change that conflicts with it is thrown away.")
