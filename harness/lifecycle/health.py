"""Health checkpoints: a night that has gone wrong stops with a reason instead of burning on.

Between iterations the Monitor
- checks the ledger against the harness's copy (ledgerguard.sync) and echoes new events;
- stops after STREAK failures in a row (crash, timeout, invalid) in this session;
- every `health_every` iterations: stops when more than FAILURE_RATE of the window failed,
  naming the dominant cause, and trains the current best again: a `repeat` row, and a
  `drift` event when its metric moved beyond the noise (sigma, else a relative tolerance);
and after each row warns (an event) when the researcher's tokens pass TOKEN_FACTOR times the
running median. With `on_unhealthy = continue` the stops become events.
"""
from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from ..driver import decide
from ..ledger import events, guard as ledgerguard
from .. import ledger, track
from ..ledger import Row
from ..driver.step import Context, RunState, train
from ..driver.training import repeat_row

FAILED = ("crash", "timeout", "invalid")
FAILURE_RATE = 0.30  # of a checkpoint's window
STREAK = 5  # failures in a row
TOKEN_FACTOR = 2.0  # times the running median
TOKEN_MIN_ROWS = 5  # rows before the median means anything
DRIFT_Z = 3.0  # noise standard deviations a re-run of the best may move
DRIFT_REL = 0.02  # relative tolerance when the noise is unknown
HEALTH_SEED_OFFSET = 1000  # re-runs of the best use seeds no candidate uses
# Reasons (the ledger's `reason` column) that are not the proposal's fault: a conflict with a best
# another lane kept (the scheduler's doing), a job the cluster lost twice (executors/ray_executor.py).
NOT_THE_PROPOSAL = ("rebase_conflict", "infrastructure", "disk_full")
_LEGACY = ("after rebase:", "[infrastructure:")  # the same, in a ledger written before the column


def reason_of(description: str) -> str:
    """The harness's reason in a description: the last [...] part, numbers blurred so causes group."""
    found = re.findall(r"\[([^\[\]]+)\]", description or "")
    text = found[-1] if found else (description or "")
    return re.sub(r"\d+(\.\d+)?", "N", text)[:120]


def diagnose(rows: list[dict[str, Any]]) -> str:
    """'crash 6, invalid 3; most often crash: "exit code N: ..." (5 times)'."""
    failed = [r for r in rows if r.get("status") in FAILED]
    counts = Counter(r["status"] for r in failed)
    if not counts:
        return "no failures"
    status = counts.most_common(1)[0][0]
    cause, n = Counter(reason_of(r.get("description", "")) for r in failed if r["status"] == status).most_common(1)[0]
    return (", ".join(f"{s} {c}" for s, c in counts.most_common())
            + f"; most often {status}: \"{cause}\" ({n} time{'s' if n > 1 else ''})")


def candidates(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows that judge the researcher: not repeats, budget stops, or proposals another lane's keep
    made stale (a rebase conflict is the scheduler's doing, not a broken rule), nor jobs the cluster lost."""
    return [r for r in rows if (r.get("iteration") or 0) > 0
            and r.get("status") not in ("repeat", "budget", "stopped") and not _not_the_proposal(r)]


def _not_the_proposal(r: dict[str, Any]) -> bool:
    if r.get("kind") is not None:
        return (r.get("reason") or "") in NOT_THE_PROPOSAL
    return any(m in (r.get("description") or "") for m in _LEGACY)


class Monitor:
    def __init__(self, ctx: Context, state: RunState, progress: Callable[[str, dict], None],
                 events_from: int = 0):
        self.ctx, self.state, self.progress = ctx, state, progress
        self.cfg = ctx.cfg  # called by the driver's one loop only: no lock
        self.session_start = state.iteration
        self.last_checkpoint = state.iteration
        self.offset = events_from
        rows = ledger.read_rows(self.cfg.ledger_path)
        self.tokens = [self._tokens(r) for r in candidates(rows) if r.get("agent_s") is not None]
        self.checked: set[int] = set()
        self._judged: tuple[int, list[dict[str, Any]], Any] = (0, [], None)  # see _candidates

    def _candidates(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """candidates(rows), of only the rows appended since the last call: the ledger reader hands
        out the same row objects while the file only grows (ledger.read_rows, copy=False), so a
        night of a thousand iterations does not filter every row again at every iteration."""
        seen, judged, last = self._judged
        if not (seen <= len(rows) and (seen == 0 or rows[seen - 1] is last)):  # rewritten: from the start
            seen, judged = 0, []
        judged = judged + candidates(rows[seen:]) if len(rows) > seen else judged
        self._judged = (len(rows), judged, rows[-1] if rows else None)
        return judged

    @staticmethod
    def _tokens(row: Any) -> int:
        get = row.get if isinstance(row, dict) else lambda k: getattr(row, k)
        return (get("input_tokens") or 0) + (get("output_tokens") or 0)

    def event(self, kind: str, message: str, **data: Any) -> None:
        events.record(self.cfg.run_dir, kind, message, **data)
        self.echo()

    def echo(self) -> None:
        new, self.offset = events.read(self.cfg.run_dir, self.offset)
        for e in new:
            self.progress("event", e)

    def _unhealthy(self, message: str) -> str | None:
        stop = self.cfg.on_unhealthy == "stop"
        advice = ("fix the cause, then continue with --resume (or pass --on-unhealthy continue)" if stop
                  else "continuing (--on-unhealthy continue)")
        self.event("unhealthy", f"{message}; {advice}")
        return f"unhealthy: {message}; {advice}" if stop else None

    # --- the hooks the loop calls ---------------------------------------------------------

    def before_iteration(self) -> tuple[str | None, int | None]:
        """(None to go on, or why the run stops; the iteration whose checkpoint trains the best again
        now, or None). The driver's loop runs that re-run (rerun) as a job and records it (after_rerun);
        a checkpoint's stop takes effect once its re-run is on the ledger."""
        ledgerguard.sync(self.cfg.ledger_path)
        self.echo()
        rows = ledger.read_rows(self.cfg.ledger_path, copy=False)  # looked at, never changed
        judged = self._candidates(rows)
        session = []  # this session's candidates, oldest first: only its tail is looked at
        for r in reversed(judged):
            if r["iteration"] <= self.session_start:
                break
            session.append(r)
        session.reverse()
        run = 0  # failures in a row at the end of this session
        while run < len(session) and session[-1 - run]["status"] in FAILED:
            run += 1
        if run and run % STREAK == 0 and -session[-1]["iteration"] not in self.checked:
            self.checked.add(-session[-1]["iteration"])  # a streak is reported once
            stop = self._unhealthy(f"{run} failures in a row ({diagnose(session[-run:])})")
            if stop:
                return stop, None
        # A checkpoint each time the iteration count crosses a multiple of n (lanes move it by more than 1).
        n, it = self.cfg.health_every, self.state.iteration
        if not n or it // n <= self.last_checkpoint // n:
            return None, None
        self.last_checkpoint = it
        window = judged[-n:]
        failed = [r for r in window if r["status"] in FAILED]
        due = it if ledger.best_row(rows) is not None else None
        if len(failed) > FAILURE_RATE * len(window):
            return self._unhealthy(f"{len(failed)} of the last {len(window)} iterations failed, more than "
                                   f"{FAILURE_RATE:.0%} ({diagnose(window)})"), due
        return None, due

    def after_row(self, row: Row) -> None:
        track.after_row(self.cfg)  # experiment tracking: nudges a background sync of the ledger, never blocks
        if row.agent_s is None:
            return
        tokens = self._tokens(row)
        if len(self.tokens) >= TOKEN_MIN_ROWS:
            median = statistics.median(self.tokens)
            if median > 0 and tokens > TOKEN_FACTOR * median:
                self.event("tokens", f"iteration {row.iteration} used {tokens} tokens, more than "
                           f"{TOKEN_FACTOR:g}x the running median ({median:g})", iteration=row.iteration)
        self.tokens.append(tokens)

    # --- the best, trained again --------------------------------------------------------------

    def rerun(self, it: int) -> "HealthRun":
        """The best trained again for the checkpoint at iteration it (a worker's part: no row written)."""
        cfg, state = self.cfg, self.state
        best = ledger.best_row(ledger.read_rows(cfg.ledger_path))
        seed = cfg.seed + HEALTH_SEED_OFFSET + it
        log = cfg.logs_dir / f"iter-{it:04d}-health.log"
        best_commit = state.best_commit  # trained by commit, in an executor slot of its own
        result = train(self.ctx, best_commit, log, seed, iteration=best.get("iteration") or 0)
        row = repeat_row(cfg, result, best.get("iteration") or 0, best_commit, seed, log,
                         self.ctx.researcher.name, cfg.model, kind="health")
        return HealthRun(it, best, best_commit, result.value(cfg.metric) if result.status == "ok" else None,
                         result.reason, row)

    def after_rerun(self, hr: "HealthRun") -> Row:
        """The re-run's row, its note said (a drift beyond the noise is an event)."""
        state, it, recorded = self.state, hr.it, self.state.best_value
        if hr.value is None:
            note = f"health check at iteration {it}: the best failed to train again ({hr.reason})"
            self.event("health_rerun_failed", note)
        else:
            drift = hr.value - recorded
            if state.sigma:
                tol = DRIFT_Z * state.sigma * math.sqrt(1 + 1 / max(1, state.best_runs))
            else:
                tol = DRIFT_REL * abs(recorded)
            if abs(drift) > tol:
                note = (f"health check at iteration {it}: drift {drift:+.6f} from the recorded "
                        f"{recorded:.6f}, beyond the noise (+-{tol:.6f})")
                self.event("drift", note, iteration=it, value=hr.value, recorded=recorded)
            else:
                note = f"health check at iteration {it}: within the noise ({drift:+.6f}, +-{tol:.6f})"
        hr.row.description = ledger.one_line(f"{hr.row.description} [{note}]")
        return hr.row

    def recorded(self, hr: "HealthRun") -> None:
        """The re-run is on the ledger: under the noise gate it is one more measurement of the best,
        so the next candidates face the mean over all of them (unless a newer best was kept meanwhile)."""
        cfg, state = self.cfg, self.state
        rows = ledger.read_rows(cfg.ledger_path)
        state.update_sigma(rows)
        same = state.best_commit == hr.best_commit and hr.best_commit.startswith(str(hr.best["commit"]))
        if cfg.gate == "noise" and hr.value is not None and same:
            state.best_value, state.best_runs = decide.best_estimate(rows, hr.best)


@dataclass
class HealthRun:
    it: int
    best: dict[str, Any]
    best_commit: str
    value: float | None
    reason: str
    row: Row
