"""The stop of one run (RunDriver's part): what is in flight is given a bounded grace, a proposal
that came back is recorded with its spend (a `stopped` row), and the run is reconciled with
nothing else running."""
from __future__ import annotations

import contextlib
import time
from concurrent.futures import CancelledError, TimeoutError as FutureTimeout
from typing import Any

from ..ledger import events
from .. import ledger
from ..lifecycle import runs
from ..agents import pricing
from ..agents.base import printable
from ..ledger import Row
from ..lifecycle.runs import Summary
from .lanes import Lane
from .signals import Cancelled
from .step import now_iso, write_journal

PROPOSAL_GRACE_S = 5.0  # s a stop waits for what is in flight (a proposal's commit, a job's end)


class Stop:
    """RunDriver's part that stops it. Called by the loop only, once the run is stopping."""

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
