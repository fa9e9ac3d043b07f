"""A candidate's training runs and the rows they make, each run a worker's: `first_run` (preflight,
then training by commit on the run's executor), `confirm_run` (one confirmation and its `repeat`
row), `rebased` (a candidate merged onto a new best, or the files that conflict); `primary_row`
(the decision's row, for the driver to write), `conflict_row`, `repeat_row`. None decides or
writes a row."""
from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import decide, rebase
from .. import ledger
from ..integrity import seal
from ..agents import Proposal, Usage
from ..config import RunConfig
from ..ledger import Row
from ..workload.runner import TrainResult
from .step import Candidate, Context, RunState, commit_candidate, memory_gb, now_iso, preflight, record_tried, rel, train


@dataclass
class FirstRun:
    """A candidate's first training run, back from its executor (or the preflight's crash)."""
    result: TrainResult | None
    log: Path
    failure: Row | None = None  # a preflight crash or a run that did not end `ok`


def first_run(ctx: Context, cand: Candidate, cancel: threading.Event | None = None,
              successor: bool = True) -> FirstRun:
    """Preflight and train cand once (a worker's part: it decides nothing, writes no row); successor:
    the loop foresees another job after it (executors.Job.successor)."""
    cfg, description = ctx.cfg, cand.description
    train_log = cfg.logs_dir / f"iter-{cand.iteration:04d}.log"
    problem = preflight(ctx)
    if problem:
        train_log.write_text(problem + "\n")
        return FirstRun(None, train_log, cand.row(ctx, "crash", f"{description} [{problem}]", log=train_log,
                                                           reason=problem))
    result = train(ctx, cand.commit, train_log, cfg.seed, cancel=cancel, iteration=cand.iteration,
                   successor=successor)
    if result.status != "ok":
        return FirstRun(result, train_log, cand.row(ctx, result.status, f"{description} [{result.reason}]",
                                                    result, train_log))
    return FirstRun(result, train_log)


def confirm_run(ctx: Context, cand: Candidate, j: int, cancel: threading.Event | None = None
                ) -> tuple[TrainResult, Row]:
    """The j-th confirmation run of cand (seed + j) and its `repeat` row (a worker's part)."""
    cfg = ctx.cfg
    log_j = cfg.logs_dir / f"iter-{cand.iteration:04d}-r{j}.log"
    rerun = train(ctx, cand.commit, log_j, cfg.seed + j, cancel=cancel, iteration=cand.iteration)
    return rerun, repeat_row(cfg, rerun, cand.iteration, cand.commit, cfg.seed + j, log_j, ctx.researcher.name,
                             cand.model)


def primary_row(ctx: Context, cand: Candidate, verdict: str, description: str, values: list[float],
                first: FirstRun, sigma: float | None) -> Row:
    """The candidate's own row: the first run's value, and the mean over its runs."""
    mean = statistics.fmean(values)
    row = cand.row(ctx, "keep" if verdict == decide.KEEP else "discard", description, first.result, first.log)
    row.runs, row.seed, row.sigma = len(values), ctx.cfg.seed, sigma
    row.delta = mean - cand.best_before
    if len(values) > 1:
        row.mean = mean
        row.description = ledger.one_line(f"{description} [mean of {len(values)} runs]")
    return row


def rebased(ctx: Context, state: RunState, cand: Candidate, onto: str, iteration: int) -> Candidate | list[str]:
    """cand's change merged onto the commit onto and committed (as iteration), or the files that
    conflict. A change already in onto comes back as a `skip` (its outcome set)."""
    conflicts = rebase.merge_onto(ctx.wt, cand.commit, cand.parent, onto, ctx.cfg.editable)
    if conflicts:
        return conflicts
    new = dataclasses.replace(cand, iteration=iteration, parent=onto, commit="", outcome=None,
                              description=f"{cand.description} (rebased onto {onto[:12]})")
    if iteration != cand.iteration:  # a re-evaluation: the proposal's cost is on the first row
        new.proposal = Proposal(new.description, Usage(), 0.0)
        new.cost_usd, new.started_at, new.t0 = 0.0, now_iso(), time.monotonic()
        new.kind = "reeval"
    if not [c for c in ctx.wt.changes() if "__pycache__/" not in c.path]:
        new.outcome = new.row(ctx, "skip", f"{new.description} [its change is already in the best]",
                              reason="already in the best")
        return new
    if commit_candidate(ctx, state, new, trailers=f"Harness-Rebased-From: {cand.commit}\n"):
        record_tried(ctx.cfg, new.digest)
    return new


def conflict_row(ctx: Context, cand: Candidate, onto: str, files: list[str]) -> Row:
    """The `invalid` row of a candidate whose change conflicts with a newer best."""
    return cand.row(ctx, "invalid", f"{cand.description} [invalid: conflicts with the new best "
                                    f"{onto[:12]} after rebase: {', '.join(files)}]",
                    reason="conflicts with the new best")


def repeat_row(cfg: RunConfig, result: TrainResult, candidate: int, commit: str, seed: int,
               log: Path, agent: str, model: str | None, kind: str = "confirm") -> Row:
    """An extra training run of identical code: its own `repeat` row, linked to its candidate, failed
    or not (a failed one has no value; its reason says why): an iteration has one decision row."""
    reason = "" if result.status == "ok" else f" [{result.status}: {result.reason}]"
    return Row(commit=commit, metric=result.value(cfg.metric) if result.status == "ok" else None, status="repeat",
               description=f"repeat of iteration {candidate} (seed {seed}){reason}",
               iteration=candidate, arm=cfg.arm, agent=agent, model=model or "",
               memory_gb=memory_gb(result), started_at=now_iso(), train_s=round(result.train_s, 3),
               wall_s=round(result.train_s, 3), seed=seed, candidate=candidate, log=rel(cfg, log),
               sealed=seal.cell(result), node=result.node, kind=kind, start=result.start,
               reason="" if result.status == "ok" else ledger.reason_code(result.status, result.reason))
