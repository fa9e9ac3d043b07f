"""The one judge: every run of a candidate that comes back (first run, confirmation, re-evaluation)
is decided here, by the loop only: a failure, a confirmation asked for, keep (the run branch
moves), discard, or a win whose best moved meanwhile trained again on it. RunDriver's part."""
from __future__ import annotations

import statistics

from . import decide
from ..lifecycle import faults
from ..ledger import Row
from .lanes import Lane, Training, spawn
from .step import Candidate, write_journal
from .training import confirm_run, primary_row, rebased


class Judge:
    """RunDriver's part that decides a trained candidate. Called by the loop only."""

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
