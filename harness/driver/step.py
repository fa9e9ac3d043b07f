"""One candidate: propose -> check -> commit -> train -> decide -> keep/reset -> row.

Every part takes explicit inputs (the parent commit, the worktree), so the driver can overlap
a proposal with a training run. Training goes through the run's executor, by commit. Here: the
run's state and a worktree's context, propose / check / preflight / train, the in-flight journal,
and `prepare_candidate` (propose, check, commit); the candidate's training runs and rows are in
training.py.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..ledger import atomic, events
from . import decide, prompt
from ..lifecycle import disk
from .. import ledger
from ..integrity import pysource
from ..lifecycle import faults
from ..integrity import guard, seal
from ..agents import pricing
from ..agents import Proposal, Researcher, Task, Usage, sandboxed
from ..agents.base import printable
from ..config import RunConfig
from ..gitgate import Worktree, content_hash, sha256_file
from ..ledger import Row
from ..executors import Job
from ..workload.runner import TrainResult, tail

INTERRUPTED = "interrupted"


@dataclass
class RunState:
    """What the loop knows between iterations; all of it can be rebuilt from disk."""
    baseline_commit: str
    best_commit: str
    best_value: float
    iteration: int  # the last iteration number used (0 = baseline)
    protected_hashes: dict[str, str | None]
    tried: set[str] = field(default_factory=set)
    last_failure_log: Path | None = None
    best_runs: int = 1  # training runs behind best_value (a mean when more than one)
    sigma: float | None = None  # pooled run-to-run noise of identical code; None = unknown
    tried_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def update_sigma(self, rows: list[dict]) -> None:
        groups = decide.repeat_groups(rows)
        self.sigma = decide.pooled_sigma(groups)


@dataclass
class Context:
    cfg: RunConfig
    wt: Worktree
    researcher: Researcher
    program_text: str
    journal: str = "inflight.json"  # this worktree's in-flight journal (lanes have one per worktree)
    executor: Any = None  # where training runs (executors.Executor)
    cancel: threading.Event | None = None  # the run's stop: a researcher still thinking is cancelled
    trusted: Any = None  # the run's baseline held by the supervisor (trust.Baseline); None = a throwaway run


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def rel(cfg: RunConfig, path: Path) -> str:
    try:
        return str(path.relative_to(cfg.run_dir))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------
# The parts


def propose(ctx: Context, state: RunState, iteration: int, note: str = "") -> Proposal:
    """Ask the researcher for one change to the worktree (prepare_candidate has reset it to parent)."""
    cfg = ctx.cfg
    rows = ledger.read_rows(cfg.ledger_path, copy=False)  # looked at, never changed
    text = prompt.render(
        ctx.program_text, metric=cfg.metric, direction=cfg.direction,
        best=ledger.best_row(rows), rows=rows, history_rows=cfg.history_rows,
        last_failure=tail(state.last_failure_log) if state.last_failure_log else "",
        editable=cfg.editable, note=note)
    task = Task(worktree=ctx.wt.path, prompt=text, editable=cfg.editable,
                timeout_s=cfg.agent_timeout, log_path=cfg.logs_dir / f"iter-{iteration:04d}-agent.log",
                iteration=iteration, seed=cfg.seed, tried=frozenset(state.tried), cancel=ctx.cancel,
                jail=sandboxed.for_run(cfg))  # the researcher's own sandbox (agents/sandboxed.py)
    start = time.monotonic()
    try:
        proposal = ctx.researcher.propose(task)
    except Exception as e:  # a researcher bug must cost one iteration, not the night
        proposal = Proposal("", error=f"researcher raised {type(e).__name__}: {e}")
    if not proposal.agent_s:
        proposal.agent_s = time.monotonic() - start
    return proposal


def check(ctx: Context, parent: str, state: RunState) -> str | None:
    """Why the worktree's change is not acceptable, or None. Out-of-scope work is undone by the caller."""
    cfg = ctx.cfg
    if ctx.wt.head() != parent:
        return "the researcher moved HEAD (git commit/reset/checkout); only edit files"
    # Bytecode caches appear whenever anything imports the code; they are not a change.
    changes = [c for c in ctx.wt.changes() if "__pycache__/" not in c.path]
    if not changes:
        return "no change to the editable files"
    outside = sorted({c.path for c in changes if c.path not in cfg.editable})
    if outside:
        return "changed files outside the editable set: " + ", ".join(outside[:10])
    for c in changes:
        p = ctx.wt.path / c.path
        if "D" in c.status or not p.exists():
            return f"deleted {c.path}"
        if p.is_symlink():
            return f"{c.path} became a symlink"
    left_out = ctx.wt.left_out()  # the protected data: not in the researcher's worktree at all
    for path, digest in state.protected_hashes.items():
        if path not in left_out and sha256_file(ctx.wt.path / path) != digest:
            return f"protected file {path} changed"
    return None


def preflight(ctx: Context) -> str | None:
    """A syntax error is a crash found in milliseconds, not after a training run."""
    for path in ctx.cfg.editable:
        if path.endswith(".py"):
            source = (ctx.wt.path / path).read_bytes()
            try:
                pysource.compile_check(source, path)
            except (SyntaxError, ValueError) as e:
                return f"syntax error in {path}: {e}"[:400]
    return None


def train(ctx: Context, commit: str, log_path: Path, seed: int, cancel: threading.Event | None = None,
          iteration: int | None = None, successor: bool = True) -> TrainResult:
    """Train commit once on the run's executor (cancel set, or Ctrl-C while waiting = KeyboardInterrupt);
    successor: whether the run foresees another job after it (executors.Job.successor).

    The Job carries the run's trusted baseline from the supervisor's memory (ctx.trusted); a
    trusted file changed since the last job (a researcher's doing) is restored and the job refused."""
    refused = ctx.trusted.refused(log_path) if ctx.trusted is not None else None
    if refused is not None:
        return refused
    job = Job(ctx.cfg, commit, seed, log_path, iteration=iteration, successor=successor,
              **(ctx.trusted.job_fields(commit) if ctx.trusted is not None else {}))
    if cancel is not None:
        job.cancel.follow(cancel)
    result = ctx.executor.run(job)
    if result.status == "crash" and result.reason.startswith(disk.REASON):  # not the candidate's fault
        raise disk.DiskFull(disk.stop_message(log_path.parent, ctx.cfg.tag, "while a job trained"))
    return result


def memory_gb(result: TrainResult) -> float | None:
    mb = result.metrics.get("peak_vram_mb")
    return None if mb is None else mb / 1024


# ---------------------------------------------------------------------------
# Journal of the in-flight candidate: lets resume record it instead of losing it


def journal_path(cfg: RunConfig, name: str = "inflight.json") -> Path:
    return cfg.run_dir / name


def write_journal(cfg: RunConfig, data: dict, name: str = "inflight.json") -> None:
    """Write-and-rename, fsynced: a kill leaves the old journal or the new one."""
    atomic.atomic_write(journal_path(cfg, name), json.dumps(data))


def clear_journal(cfg: RunConfig, name: str = "inflight.json") -> None:
    journal_path(cfg, name).unlink(missing_ok=True)


def pending(run_dir: Path, rows: list[dict[str, Any]]) -> list[tuple[Path, dict[str, Any]]]:
    """Committed candidates an interruption left without a row (the loop's journal and each lane
    worktree's), in iteration order: --resume trains them first."""
    seen = {r.get("iteration") for r in rows if r.get("status") != "repeat"}
    found = []
    for path in run_dir.glob("inflight*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a torn journal: its write never finished, so nothing was committed after it
        if data.get("commit") and data.get("iteration") not in seen:
            found.append((path, data))
    # A candidate being trained on resume has the loop's journal (attempts 1) and, for a moment,
    # its lane's (attempts 0): the one that counts the attempt wins.
    latest: dict[int, tuple[Path, dict[str, Any]]] = {}
    for path, data in sorted(found, key=lambda pd: pd[1].get("attempts", 0)):
        latest[data["iteration"]] = (path, data)
    return [latest[i] for i in sorted(latest)]


# ---------------------------------------------------------------------------
# The whole iteration


@dataclass
class Candidate:
    """A proposal on its way through the step: prepared (proposed, checked, committed), then judged."""
    iteration: int
    parent: str
    best_before: float
    started_at: str
    t0: float  # monotonic start, for wall_s
    proposal: Proposal
    model: str | None
    cost_usd: float | None
    description: str
    commit: str = ""  # empty until committed
    outcome: Row | None = None  # set when the candidate ended before training (crash/invalid/skip)
    digest: str = ""  # content hash of the editable files, once committed
    kind: str = "candidate"  # its rows' kind (ledger.KINDS): a re-evaluation's are "reeval"

    def journal_entry(self, **extra: Any) -> dict[str, Any]:
        """What a resume needs to train this committed candidate, or to record it: its proposal's
        spend included, so an interruption loses neither the proposal nor what it cost."""
        tokens_in, cached, tokens_out = self.proposal.usage.cells()  # None when never reported
        return {"iteration": self.iteration, "parent": self.parent, "started_at": self.started_at,
                "phase": "train", "commit": self.commit, "description": self.description,
                "model": self.model, "agent_s": round(self.proposal.agent_s, 3), "retries": self.proposal.retries,
                "input_tokens": tokens_in, "cached_tokens": cached,
                "output_tokens": tokens_out, "cost_usd": self.cost_usd, **extra}

    @classmethod
    def from_journal(cls, data: dict[str, Any], best_before: float) -> "Candidate":
        """A committed candidate an interruption left untrained, rebuilt from its journal entry."""
        usage = Usage(data.get("input_tokens") or 0, data.get("cached_tokens") or 0, data.get("output_tokens") or 0,
                      known=data.get("input_tokens", 0) is not None)
        proposal = Proposal(data.get("description", ""), usage, data.get("agent_s") or 0.0, data.get("retries") or 0)
        return cls(data["iteration"], data["parent"], best_before, data["started_at"], time.monotonic(), proposal,
                   data.get("model"), data.get("cost_usd"), data.get("description", ""), commit=data["commit"])

    def row(self, ctx: Context, status: str, description: str, result: TrainResult | None = None,
            log: Path | None = None, reason: str = "", kind: str = "") -> Row:
        """reason: the harness's own words for why (a short code is taken from them, ledger.reason_code)."""
        cfg = ctx.cfg
        tokens_in, cached, tokens_out = self.proposal.usage.cells()  # None when never reported
        value = result.value(cfg.metric) if result else None
        log = log or cfg.logs_dir / f"iter-{self.iteration:04d}-agent.log"
        return Row(commit=self.commit, metric=value, status=status, description=ledger.one_line(description),
                   iteration=self.iteration, memory_gb=memory_gb(result) if result else None,
                   arm=cfg.arm, agent=ctx.researcher.name, model=self.model or "", parent=self.parent[:12],
                   best_before=self.best_before, delta=None if value is None else value - self.best_before,
                   started_at=self.started_at, agent_s=round(self.proposal.agent_s, 3),
                   train_s=round(result.train_s, 3) if result else None,
                   wall_s=round(time.monotonic() - self.t0, 3), input_tokens=tokens_in,
                   cached_tokens=cached, output_tokens=tokens_out,
                   cost_usd=self.cost_usd, retries=self.proposal.retries, log=rel(cfg, log),
                   sealed=seal.cell(result), node=result.node if result else "", kind=kind or self.kind,
                   start=result.start if result else "",
                   reason=ledger.reason_code(status, reason or (result.reason if result else "")))


def prepare_candidate(ctx: Context, state: RunState, iteration: int, parent: str,
                      best_before: float, note: str = "") -> Candidate:
    """Propose, check and commit one candidate on parent. Never trains; never writes the ledger."""
    cfg = ctx.cfg
    started_at, t0 = now_iso(), time.monotonic()
    write_journal(cfg, {"iteration": iteration, "parent": parent, "started_at": started_at,
                        "phase": "propose"}, ctx.journal)
    ctx.wt.reset_hard(parent)  # a lane's detached worktree may still be at its previous candidate
    before = guard.snapshot(ctx.wt, cfg.branch)
    proposal = propose(ctx, state, iteration, note)
    faults.point("after_propose")
    guard.clear_stale_lock(ctx.wt)
    git_reason = guard.git_problem(ctx.wt, cfg.branch, parent, cfg.editable, before)
    if git_reason:  # refs, HEAD and .git files back as they were, before any reset
        guard.restore(ctx.wt, cfg.branch, parent, before)
    model = pricing.resolve_model(cfg.model)
    usage = proposal.usage
    cost, _ = pricing.call_cost(model, usage)  # the price table wins over the researcher's figure
    differs = pricing.cost_difference(model, usage)
    if differs:  # both figures kept where a person looks: the table's on the row, the CLI's here
        events.record(cfg.run_dir, "cost_differs", f"iteration {iteration}: the price table says ${differs[0]:.6f}, "
                      f"the researcher reported ${differs[1]:.6f}; the ledger keeps the table's",
                      iteration=iteration, table_usd=differs[0], researcher_usd=differs[1])
    for problem in proposal.problems:  # its report's numbers were unusable: unknown, never taken as given
        events.record(cfg.run_dir, "researcher_report", f"iteration {iteration}: {problem}; taken as unknown")
    cand = Candidate(iteration, parent, best_before, started_at, t0, proposal, model, cost,
                     printable(proposal.description) or "(no description)")
    agent_log = cfg.logs_dir / f"iter-{iteration:04d}-agent.log"
    if proposal.error:
        ctx.wt.reset_hard(parent)
        state.last_failure_log = agent_log if agent_log.exists() else state.last_failure_log
        cand.outcome = cand.row(ctx, "crash", f"researcher failed: {proposal.error}",
                                reason="researcher failed")
        return cand
    reason = git_reason or check(ctx, parent, state) or (cfg.policy and guard.policy_problem(
        ctx.wt, parent, cfg.editable, cfg.metric, cfg.protected,
        seal.enabled(cfg.sealed, ctx.wt.path, cfg.protected) or bool(cfg.evaluate_command))) or None
    if reason:
        ctx.wt.reset_hard(parent)
        cand.outcome = cand.row(ctx, "invalid", f"{cand.description} [invalid: {reason}]", reason=reason)
        return cand
    if not commit_candidate(ctx, state, cand):
        return cand
    write_journal(cfg, cand.journal_entry(), ctx.journal)
    record_tried(cfg, cand.digest)
    faults.point("after_commit")
    return cand


def record_tried(cfg: RunConfig, digest: str) -> None:
    """tried.txt: written once the candidate is committed and journalled (a resume rebuilds the rest)."""
    atomic.append_line(cfg.run_dir / "tried.txt", digest)  # fsynced: a resume trusts it


def commit_candidate(ctx: Context, state: RunState, cand: Candidate, trailers: str = "") -> bool:
    """Commit the worktree's change as cand, or, when identical code was evaluated before in this
    run, reset to cand.parent and make cand a `skip` (False)."""
    cfg = ctx.cfg
    digest = content_hash(ctx.wt.path, cfg.editable)
    with state.tried_lock:  # two lanes with the same change: one trains it, the other skips
        seen = digest in state.tried
        state.tried.add(digest)
    if seen:
        ctx.wt.reset_hard(cand.parent)
        cand.outcome = cand.row(ctx, "skip", f"{cand.description} [already evaluated in this run]",
                                reason="already evaluated")
        return False
    cand.digest = digest
    message = (f"{ledger.one_line(cand.description, 200)}\n\nHarness-Run: {cfg.tag}\n"
               f"Harness-Iteration: {cand.iteration}\nHarness-Agent: {ctx.researcher.name}\n"
               f"Harness-Model: {cand.model or '-'}\n{trailers}")
    cand.commit = ctx.wt.commit(cfg.editable, message)
    ctx.wt.keep_reachable(cfg.tag, cand.iteration, cand.commit)  # survives the reset and `git gc`
    return True
