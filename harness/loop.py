"""The supervisor: set a run up (or resume it), then iterate until the deadline, cap or budget.

All state lives on disk (the run branch, the ledger, the journal), so the supervisor can be
killed at any point and resumed.
"""
from __future__ import annotations

import hashlib
import json
import platform
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from . import __version__, decide, events, figures, health, ledger, ledgerguard, pricing, recovery, seal
from .agents import Researcher, make_researcher, routing_mismatch
from .config import RunConfig, compare_resume, refusal_message
from .errors import RepoError
from .gitgate import GitGate, sha256_file
from .ledger import Row
from .step import (INTERRUPTED, Candidate, Context, RunState, conflict_row, evaluate, judge_candidate,
                   memory_gb, now_iso, pending, rebased, rel, repeat_row, run_step, write_journal)

Progress = Callable[[str, dict[str, Any]], None]


def no_progress(event: str, data: dict[str, Any]) -> None:
    pass


@dataclass
class Summary:
    tag: str
    branch: str
    baseline_value: float | None
    best_value: float | None
    best_commit: str
    iterations: int
    counts: dict[str, int] = field(default_factory=dict)
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    stopped: str = ""
    headline: figures.Headline | None = None  # figures.py: the one definition of these figures

    @property
    def keep_rate(self) -> float:
        done = sum(v for k, v in self.counts.items() if k != "budget")
        return self.counts.get("keep", 0) / done if done else 0.0


# ---------------------------------------------------------------------------
# Set-up, refusals and resume


def preflight_repo(cfg: RunConfig, gate: GitGate, resume: bool) -> str:
    """Refuse a run that cannot be trusted; return the commit the run starts from."""
    base = gate.require_commit(cfg.from_rev)
    for path in (*cfg.editable, *cfg.protected):
        if not gate.tracked_at(base, path):
            raise RepoError(f"{path} is not committed at {cfg.from_rev} in {gate.root}. The run needs "
                            f"every editable and protected file committed; check [tool.harness] "
                            f"editable/protected or commit the file.")
    dirty = gate.dirty_files((*cfg.editable, *cfg.protected))
    if dirty and cfg.from_rev == "HEAD":
        raise RepoError("uncommitted changes in " + ", ".join(dirty) + ": commit or stash them "
                        "first, so the run's baseline is exactly what you see.")
    if not (gate.root / cfg.program).exists() and not gate.tracked_at(base, cfg.program):
        raise RepoError(f"the program file {cfg.program} is missing; `harness init` writes one.")
    exists = gate.branch_exists(cfg.branch)
    if exists and not resume:
        raise RepoError(f"branch {cfg.branch} already exists: pass --resume to continue that run, "
                        f"or choose another --tag.")
    if resume and not exists:
        raise RepoError(f"nothing to resume: branch {cfg.branch} does not exist. Drop --resume.")
    return base


def program_text(cfg: RunConfig, gate: GitGate, base: str) -> str:
    path = gate.root / cfg.program
    if path.exists():
        return path.read_text()
    return gate.repo.git.show(f"{base}:{cfg.program}")


def device_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return f"cpu ({platform.machine()})"


def write_manifest(cfg: RunConfig, researcher: Researcher, base: str, program: str) -> None:
    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    manifest = {
        "harness_version": __version__, "tag": cfg.tag, "branch": cfg.branch,
        "baseline_commit": base, "created_at": now_iso(), "config": cfg.to_json(),
        "python": sys.version.split()[0], "torch": version("torch"), "device": device_name(),
        "agent": researcher.name, "model": pricing.resolve_model(cfg.model),
        "researcher": researcher.describe(),
        "program_sha256": hashlib.sha256(program.encode()).hexdigest(),
    }
    (cfg.run_dir / "run.json").write_text(json.dumps(manifest, indent=2) + "\n")


def link_results(cfg: RunConfig) -> None:
    """results.tsv at the repo root points at the latest run's ledger (as karpathy/autoresearch has it)."""
    link = cfg.repo / "results.tsv"
    if cfg.arm:  # A/B arms keep their ledgers under the A/B run's folder
        return
    if link.is_symlink() or not link.exists():
        link.unlink(missing_ok=True)
        link.symlink_to(cfg.ledger_path.relative_to(cfg.repo))


def baseline(ctx: Context, state_base: str, progress: Progress) -> RunState:
    """Train the unmodified code --baseline-runs times; the spread is the first noise estimate."""
    cfg = ctx.cfg
    progress("baseline", {"commit": state_base, "runs": cfg.baseline_runs})
    log = cfg.logs_dir / "iter-0000.log"
    started_at, t0 = now_iso(), time.monotonic()
    result = evaluate(cfg, cfg.worktree, log, cfg.seed)
    model = pricing.resolve_model(cfg.model) or ""
    repeats, values = [], [result.value(cfg.metric)]
    for j in range(1, cfg.baseline_runs if result.status == "ok" else 1):
        log_j = cfg.logs_dir / f"iter-0000-r{j}.log"
        rerun = evaluate(cfg, cfg.worktree, log_j, cfg.seed + j)
        repeats.append(repeat_row(cfg, rerun, 0, state_base, cfg.seed + j, log_j, ctx.researcher.name, model))
        if rerun.status != "ok":
            result, log = rerun, log_j
            break
        values.append(rerun.value(cfg.metric))
    status = "keep" if result.status == "ok" else result.status
    sigma = decide.pooled_sigma([values])
    row = Row(commit=state_base, metric=values[0], status=status,
              description="baseline" if status == "keep" else f"baseline [{result.reason}]",
              iteration=0, arm=cfg.arm, memory_gb=memory_gb(result), agent=ctx.researcher.name,
              model=model, started_at=started_at, train_s=round(result.train_s, 3),
              wall_s=round(time.monotonic() - t0, 3), log=rel(cfg, log), seed=cfg.seed,
              runs=len(values), mean=statistics.fmean(values) if len(values) > 1 else None, sigma=sigma,
              sealed=seal.cell(result))
    for r in (row, *repeats):
        ledger.append(cfg.ledger_path, cfg.metric, r)
    if status != "keep":
        raise RepoError(f"the baseline did not produce {cfg.metric} ({result.reason}). Fix the training "
                        f"code so it runs on its own; see {log}. Then run again with --resume.")
    hashes = {p: sha256_file(cfg.worktree / p) for p in cfg.protected}
    return RunState(state_base, state_base, statistics.fmean(values), 0, hashes,
                    best_runs=len(values), sigma=sigma)


def reconcile(ctx: Context, base: str, progress: Progress = no_progress, retrain: bool = True) -> RunState | None:
    """Rebuild the state from disk and reset the worktree to the best commit.

    retrain: a committed candidate that an interruption left untrained is trained now, once (a
    second interruption while it trains records it as an interrupted crash), so neither the
    proposal nor what it cost is lost. Without retrain (the cleanup after Ctrl-C), its journal
    stays for the next --resume.
    """
    cfg = ctx.cfg
    recovery.on_resume(cfg.run_dir, cfg.logs_dir, cfg.worktree)  # jobs a killed supervisor left behind
    ledgerguard.sync(cfg.ledger_path)  # a torn last line repaired, rows changed behind our back restored
    rows = ledger.read_rows(cfg.ledger_path)
    waiting = pending(cfg.run_dir, rows)
    keep = {path for path, _ in waiting}
    for path in cfg.run_dir.glob("inflight*.json"):  # torn ones too: nothing was committed after those
        if path not in keep:
            path.unlink(missing_ok=True)
    best = ledger.best_row(rows)
    if best is None:
        return None
    best_commit = ctx.wt.resolve(best["commit"])
    ctx.wt.reset_hard(best_commit)
    tried_file = cfg.run_dir / "tried.txt"
    tried = set(tried_file.read_text().split()) if tried_file.exists() else set()
    hashes = {p: sha256_file(cfg.worktree / p) for p in cfg.protected}
    last = max((r.get("iteration") or 0) for r in rows)
    if cfg.gate == "noise":
        best_value, best_runs = decide.best_estimate(rows, best)
    else:
        best_value, best_runs = ledger.decided_value(best), best.get("runs") or 1
    state = RunState(base, best_commit, best_value, last, hashes, tried, best_runs=best_runs)
    state.update_sigma(rows)
    if retrain:
        for path, data in waiting:  # each journal goes only once its candidate is taken care of
            train_interrupted(ctx, state, path, data, progress)
    return state


def train_interrupted(ctx: Context, state: RunState, path: Path, data: dict[str, Any],
                      progress: Progress) -> None:
    """Train a committed candidate an interruption left untrained, or record why it cannot be.

    A candidate proposed on an older best (the second of two in flight, when the first was
    kept) is moved onto the best first, as the lanes do; a conflict is an `invalid` row.
    """
    cfg = ctx.cfg
    cand = Candidate.from_journal(data, state.best_value)
    cand.model = cand.model or pricing.resolve_model(cfg.model)  # journals before the model was kept
    try:
        commit = ctx.wt.resolve(data["commit"])
    except Exception:  # noqa: BLE001  (git's own error: the commit is gone)
        commit = ""
    if data.get("attempts", 0) >= 1 or not commit:
        why = "again while it was trained on resume" if commit else "and its commit no longer exists"
        row = cand.row(ctx, "crash", f"{cand.description} [{INTERRUPTED} {why}]")
    elif state.best_commit.startswith(str(data["parent"])):
        cand.commit = commit
        ctx.wt.reset_hard(commit)
        row = None
    else:  # proposed on an older best: moved onto the best first, as the lanes do
        cand.commit, onto = commit, state.best_commit
        moved = rebased(ctx, state, cand, onto, cand.iteration)
        if isinstance(moved, list):
            row = conflict_row(ctx, cand, onto, moved)
        else:
            cand, row = moved, moved.outcome
    if row is not None:
        row.lane = data.get("lane")
        ctx.wt.reset_hard(state.best_commit)
        ledger.append(cfg.ledger_path, cfg.metric, row)
        path.unlink(missing_ok=True)
        state.iteration = max(state.iteration, cand.iteration)
        return
    write_journal(cfg, cand.journal_entry(attempts=1), ctx.journal)  # a second kill records it
    if path.name != ctx.journal:
        path.unlink(missing_ok=True)
    progress("resumed", {"iteration": cand.iteration, "commit": cand.commit})
    try:
        row = judge_candidate(ctx, state, cand)
    except KeyboardInterrupt:  # the user's Ctrl-C is no crash: the next --resume trains it again
        write_journal(cfg, cand.journal_entry(), ctx.journal)
        ctx.wt.reset_hard(state.best_commit)
        raise
    progress("row", {"row": row, "best": state.best_value})


def open_run(cfg: RunConfig, resume: bool, progress: Progress = no_progress,
             researcher: Researcher | None = None) -> tuple[Context, RunState]:
    """Refuse, create or re-attach the run's worktree, and measure the baseline if needed."""
    gate = GitGate(cfg.repo)
    base = preflight_repo(cfg, gate, resume)
    researcher = researcher or make_researcher(cfg.agent, cfg.model, cfg.agent_options)
    gate.ensure_excluded()
    cfg.logs_dir.mkdir(parents=True, exist_ok=True)
    if resume:
        gate.attach_worktree(cfg.worktree, cfg.branch)
        manifest = json.loads((cfg.run_dir / "run.json").read_text()) if (cfg.run_dir / "run.json").exists() else {}
        base = manifest.get("baseline_commit", base)
        changed = routing_mismatch(manifest, researcher.name, pricing.resolve_model(cfg.model),
                                   researcher.describe())
        if changed and not cfg.agent_options.get("force"):
            raise RepoError(f"run {cfg.tag} was started with other researcher routing ({'; '.join(changed)}). "
                            f"Resume with the run's own --agent/--model/--base-url and key, or pass --force.")
        refused, limits = compare_resume(manifest.get("config", {}), cfg)  # config.py: budget, metric, gate...
        if refused:
            raise RepoError(refusal_message(cfg.tag, refused))
        if limits:
            events.record(cfg.run_dir, "resume_settings", "limits changed on resume: " + "; ".join(limits))
    else:
        if cfg.worktree.exists() or cfg.ledger_path.exists():
            raise RepoError(f"{cfg.run_dir} already holds a run; choose another --tag or remove it.")
        base = gate.create_worktree(cfg.worktree, cfg.branch, cfg.from_rev)
    program = program_text(cfg, gate, base)
    if not resume:
        write_manifest(cfg, researcher, base, program)
    link_results(cfg)
    ctx = Context(cfg, gate.worktree(cfg.worktree), researcher, program)
    state = reconcile(ctx, base, progress) if resume else None
    if state is None:
        state = baseline(ctx, base, progress)
    return ctx, state


# ---------------------------------------------------------------------------
# The loop


def summarize(cfg: RunConfig, state: RunState | None, stopped: str) -> Summary:
    """The run's figures from its ledger, by the one definition in figures.py."""
    h = figures.headline(ledger.read_rows(cfg.ledger_path), cfg.metric, cfg.direction)
    counts = {**h.counts, **({"budget": 1} if h.budget_stop else {})}
    return Summary(
        tag=cfg.tag, branch=cfg.branch, baseline_value=h.baseline, best_value=h.best,
        best_commit=h.best_commit, iterations=h.experiments, counts=counts,
        input_tokens=h.input_tokens, output_tokens=h.output_tokens, cost_usd=h.cost_usd,
        stopped=stopped, headline=h)


def budget_reason(cfg: RunConfig, rows: list[dict[str, Any]], in_flight: int = 0) -> str | None:
    """Would the next iteration, at the mean spend so far, go past --max-tokens or --max-cost?

    in_flight: proposals already spending but not yet on the ledger (pipelining, lanes).
    """
    done = [r for r in rows if (r.get("iteration") or 0) > 0 and r.get("agent_s") is not None]
    if not done or (cfg.max_tokens is None and cfg.max_cost is None):
        return None
    tokens = [(r.get("input_tokens") or 0) + (r.get("output_tokens") or 0) for r in done]
    if cfg.max_tokens is not None and sum(tokens) + (1 + in_flight) * sum(tokens) / len(tokens) > cfg.max_tokens:
        return f"the next iteration would pass --max-tokens {cfg.max_tokens} (spent {sum(tokens)})"
    if cfg.max_cost is not None and any(r.get("cost_usd") is None and t for r, t in zip(done, tokens)):
        return (f"--max-cost {cfg.max_cost:g} cannot be enforced: model {cfg.model or '?'} has no price "
                f"(add one with --prices FILE)")
    costs = [r.get("cost_usd") or 0.0 for r in done]
    if cfg.max_cost is not None and sum(costs) + (1 + in_flight) * sum(costs) / len(costs) > cfg.max_cost:
        return f"the next iteration would pass --max-cost {cfg.max_cost:g} USD (spent {sum(costs):.4f})"
    return None


def stop_for_budget(ctx: Context, state: RunState, rows: list[dict[str, Any]], iteration: int,
                    in_flight: int = 0) -> str | None:
    """When the next iteration would pass --max-tokens/--max-cost: the final `budget` row, and why."""
    cfg = ctx.cfg
    reason = budget_reason(cfg, rows, in_flight=in_flight)
    if reason:
        ledger.append(cfg.ledger_path, cfg.metric, Row(
            commit=state.best_commit, metric=None, status="budget", iteration=iteration, arm=cfg.arm,
            description=f"stopped: {reason}", agent=ctx.researcher.name,
            model=pricing.resolve_model(cfg.model) or "", started_at=now_iso()))
    return reason


def run(cfg: RunConfig, resume: bool = False, progress: Progress = no_progress,
        researcher: Researcher | None = None, max_steps: int | None = None) -> Summary:
    """Run iterations until --hours, --iterations, a budget cap, or Ctrl-C.

    max_steps bounds the iterations of this call alone (`harness step` passes 1).
    """
    with recovery.supervisor_lock(cfg.run_dir):
        return _run(cfg, resume, progress, researcher, max_steps)


def _run(cfg: RunConfig, resume: bool, progress: Progress, researcher: Researcher | None,
         max_steps: int | None) -> Summary:
    start = time.monotonic()
    deadline = start + cfg.hours * 3600 if cfg.hours else None
    state: RunState | None = None
    ctx: Context | None = None
    stopped = "done"
    events_from = events.size(cfg.run_dir)
    try:
        ctx, state = open_run(cfg, resume, progress, researcher)
        progress("start", {"best": state.best_value, "iteration": state.iteration})
        monitor = health.Monitor(ctx, state, progress, events_from)
        walls: list[float] = []
        steps = 0
        while True:
            if cfg.iterations is not None and state.iteration >= cfg.iterations:
                stopped = f"reached --iterations {cfg.iterations}"
                break
            if max_steps is not None and steps >= max_steps:
                stopped = "step done"
                break
            unhealthy = monitor.before_iteration()
            if unhealthy:
                stopped = unhealthy
                break
            rows = ledger.read_rows(cfg.ledger_path)
            if deadline is not None:
                estimate = max(walls[-5:]) if walls else (rows[0].get("wall_s") or 0) if rows else 0
                if time.monotonic() + estimate > deadline:
                    stopped = f"reached --hours {cfg.hours:g} (the next iteration would not finish in time)"
                    break
            reason = stop_for_budget(ctx, state, rows, state.iteration + 1)
            if reason:
                stopped = reason
                break
            progress("iteration", {"iteration": state.iteration + 1, "elapsed_s": time.monotonic() - start})
            row = run_step(ctx, state)
            walls.append(row.wall_s or 0.0)
            monitor.after_row(row)
            steps += 1
            eta = (deadline - time.monotonic()) if deadline else None
            progress("row", {"row": row, "best": state.best_value, "elapsed_s": time.monotonic() - start,
                             "eta_s": eta})
    except KeyboardInterrupt:
        if ctx is not None:
            old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not tear the cleanup
            try:
                state = reconcile(ctx, state.baseline_commit if state else "", retrain=False) or state
            finally:
                signal.signal(signal.SIGINT, old)
        stopped = interrupted(cfg)
    return summarize(cfg, state, stopped)


def interrupted(cfg: RunConfig) -> str:
    """Why the run stopped after Ctrl-C, and what --resume will do first."""
    waiting = len(pending(cfg.run_dir, ledger.read_rows(cfg.ledger_path)))
    first = f" ({waiting} committed candidate{'s' if waiting > 1 else ''} will be trained first)" if waiting else ""
    return f"interrupted (Ctrl-C); continue with --resume{first}"
