"""A run on disk: refuse, create or re-attach it; measure its baseline; rebuild its state on
--resume (reconcile); summarize it. Its manifest (run.json) and trusted baseline: manifest.py.
The driver (driver/) schedules the iterations.

All state lives on disk (the run branch, the ledger, the journals), so the supervisor can be
killed at any point and resumed.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import ledger
from ..driver import decide
from ..ledger import events, guard as ledgerguard, trust
from ..agents import pricing
from ..integrity import seal
from ..reporting import figures
from ..agents import Researcher, make_researcher, routing_mismatch
from ..config import RunConfig
from ..config.resume import compare_resume, refusal_message
from ..errors import RepoError
from ..integrity import budget
from ..gitgate import GitCommandError, GitGate, Worktree, data_files
from ..ledger import Row
from ..workload.runner import TrainResult, tail
from .manifest import read_manifest, trusted_baseline, write_manifest
from ..driver.step import INTERRUPTED, Candidate, Context, RunState, memory_gb, now_iso, pending, rel, train
from ..driver.training import conflict_row, rebased, repeat_row

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
    return gate.show(base, cfg.program)


def calibrate(ctx: Context, result: TrainResult) -> None:
    """A baseline run's result, back from its executor: the supervisor measures the allowance on it."""
    if result.status == "ok" and ctx.trusted is not None:
        ctx.trusted.allowance_s = budget.calibrate(ctx.cfg.run_dir, ctx.trusted.commit, result.train_s,
                                                   budget.reported_seconds(result.metrics), ctx.cfg.time_budget,
                                                   budget.Usage.of(result))
        ctx.trusted.baseline_cpu_s = budget.baseline_cpu_s(ctx.cfg.run_dir, ctx.trusted.commit)
        ctx.trusted.baseline_gpu_s = budget.baseline_cpu_s(ctx.cfg.run_dir, ctx.trusted.commit, "gpu_s")
        ctx.trusted.hold(ctx.cfg.run_dir / budget.FILE)


def link_results(cfg: RunConfig) -> None:
    """results.tsv at the repo root points at the latest run's ledger (as karpathy/autoresearch has it)."""
    link = cfg.repo / "results.tsv"
    if cfg.arm:  # A/B arms keep their ledgers under the A/B run's folder
        return
    if link.is_symlink() or not link.exists():
        link.unlink(missing_ok=True)
        link.symlink_to(cfg.ledger_path.relative_to(cfg.repo))


def first_state(cfg: RunConfig, base: str, worktree: Path) -> RunState:
    """The state before the baseline is measured: the parent of the first proposals is known."""
    with Worktree(worktree) as wt:  # from git's objects: the worktree leaves the protected data out
        hashes = {p: wt.committed_sha256(base, p) for p in cfg.protected}
    return RunState(base, base, float("nan"), 0, hashes)


@dataclass
class Baseline:
    """The baseline's runs, back from the executor: its rows (the loop appends them), its value and
    noise, or why it failed (raised once the rows are on the ledger)."""
    rows: list[Row]
    value: float | None = None
    runs: int = 0
    sigma: float | None = None
    error: RepoError | None = None


def baseline(ctx: Context, state: RunState, progress: Progress) -> Baseline:
    """Train the unmodified code --baseline-runs times (the spread is the first noise estimate).
    A worker's part: it writes no row and changes no state (the driver's loop does both)."""
    cfg, base = ctx.cfg, state.baseline_commit
    progress("baseline", {"commit": base, "runs": cfg.baseline_runs})
    log = cfg.logs_dir / "iter-0000.log"
    started_at, t0 = now_iso(), time.monotonic()
    result = train(ctx, base, log, cfg.seed, iteration=0)
    calibrate(ctx, result)
    model = pricing.resolve_model(cfg.model) or ""
    repeats, values = [], [result.value(cfg.metric)]
    for j in range(1, cfg.baseline_runs if result.status == "ok" else 1):
        log_j = cfg.logs_dir / f"iter-0000-r{j}.log"
        rerun = train(ctx, base, log_j, cfg.seed + j, iteration=0)
        calibrate(ctx, rerun)
        repeats.append(repeat_row(cfg, rerun, 0, base, cfg.seed + j, log_j, ctx.researcher.name, model, "baseline"))
        if rerun.status != "ok":
            result, log = rerun, log_j
            break
        values.append(rerun.value(cfg.metric))
    status = "keep" if result.status == "ok" else result.status
    sigma = decide.pooled_sigma([values])
    row = Row(commit=base, metric=values[0], status=status,
              description="baseline" if status == "keep" else f"baseline [{result.reason}]",
              iteration=0, arm=cfg.arm, memory_gb=memory_gb(result), agent=ctx.researcher.name,
              model=model, started_at=started_at, train_s=round(result.train_s, 3),
              wall_s=round(time.monotonic() - t0, 3), log=rel(cfg, log), seed=cfg.seed,
              runs=len(values), mean=statistics.fmean(values) if len(values) > 1 else None, sigma=sigma,
              sealed=seal.cell(result), node=result.node, kind="baseline", start=result.start,
              reason="" if status == "keep" else ledger.reason_code(result.status, result.reason))
    if status != "keep":
        return Baseline([row, *repeats], error=RepoError(baseline_failed_message(cfg, base, result, log)))
    return Baseline([row, *repeats], statistics.fmean(values), len(values), sigma)


def reconcile(ctx: Context, base: str, verify: bool = False) -> RunState | None:
    """Rebuild the state from disk and reset the worktree to the best commit (None: no baseline yet).

    Journals of committed candidates that an interruption left untrained stay: on --resume the
    loop trains them first (waiting_candidate); after a stop they wait for the next --resume.
    """
    cfg = ctx.cfg
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
    if verify and base:  # on --resume, a keep row is believed only when its commit is on the run branch
        trust.verify(cfg.run_dir, cfg.branch, rows, ctx.wt.first_parent(base, cfg.branch))
    best_commit = ctx.wt.resolve(best["commit"])
    ctx.wt.reset_hard(best_commit)
    tried_file = cfg.run_dir / "tried.txt"
    tried = set(tried_file.read_text().split()) if tried_file.exists() else set()
    hashes = {p: ctx.wt.committed_sha256(base or best_commit, p) for p in cfg.protected}
    last = max((r.get("iteration") or 0) for r in rows)
    if cfg.gate == "noise":
        best_value, best_runs = decide.best_estimate(rows, best)
    else:
        best_value, best_runs = ledger.decided_value(best), best.get("runs") or 1
    state = RunState(base, best_commit, best_value, last, hashes, tried, best_runs=best_runs)
    state.update_sigma(rows)
    return state


def waiting_candidate(ctx: Context, state: RunState, data: dict[str, Any]) -> tuple[Candidate, Row | None]:
    """A committed candidate an interruption left untrained: ready to train again on the best (None),
    or the row that records why it cannot be (an attempt already made, its commit gone, a conflict
    with the best). A candidate proposed on an older best (the second of two in flight, when the
    first was kept) is moved onto the best first, as the lanes do. Called by the driver's loop."""
    cfg = ctx.cfg
    cand = Candidate.from_journal(data, state.best_value)
    cand.model = cand.model or pricing.resolve_model(cfg.model)  # journals before the model was kept
    commit = existing_commit(ctx, data["commit"])
    if data.get("attempts", 0) >= 1 or not commit:
        why = "again while it was trained on resume" if commit else "and its commit no longer exists"
        return cand, cand.row(ctx, "crash", f"{cand.description} [{INTERRUPTED} {why}]", reason="interrupted")
    cand.commit = commit
    if state.best_commit.startswith(str(data["parent"])):
        ctx.wt.reset_hard(commit)
        return cand, None
    onto = state.best_commit
    moved = rebased(ctx, state, cand, onto, cand.iteration)
    if isinstance(moved, list):
        return cand, conflict_row(ctx, cand, onto, moved)
    return moved, moved.outcome


def existing_commit(ctx: Context, commit: str) -> str:
    """The full sha of a journal's commit, or "" when git says it is gone. Any other git error
    (an index.lock, too many open files) is raised: the candidate waits for the next --resume."""
    try:
        return ctx.wt.resolve(commit)
    except GitCommandError as e:
        text = f"{e.stderr or ''} {e.stdout or ''}".lower()
        if any(m in text for m in ("needed a single revision", "unknown revision", "bad revision",
                                   "not a valid object", "bad object")):
            return ""
        raise


def rebaseline(cfg: RunConfig, gate: GitGate, start: str, manifest: dict[str, Any]) -> str:
    """--resume --rebaseline: the run's branch and worktree moved to start (the user's fixed HEAD, or
    --from), the settings taken as they are now; only while no baseline has succeeded (a kept
    baseline is what every decision of the run was measured against)."""
    rows = ledger.read_rows(cfg.ledger_path)
    if any(r["status"] == "keep" for r in rows):
        raise RepoError(f"run {cfg.tag} has a baseline that succeeded: --rebaseline only restarts one that "
                        f"failed. Resume without it, or start a new run: harness run --tag NEW --from {cfg.branch}")
    old = str(manifest.get("baseline_commit") or "")
    with Worktree(cfg.worktree) as wt:
        wt.reset_hard(start)  # the worktree is on the run's branch: it moves with it
    changed, _ = compare_resume(manifest.get("config", {}), cfg)
    renamed = ledger.rename_metric(cfg.ledger_path, cfg.metric)  # results.tsv's header names the metric now used
    events.record(cfg.run_dir, "rebaseline",
                  f"the baseline starts again from {start[:12]} (was {old[:12]}, which never succeeded)"
                  + (f"; settings now: {'; '.join(changed)}" if changed else "")
                  + (f"; results.tsv's metric column is now {cfg.metric}" if renamed else ""))
    return start


def baseline_failed_message(cfg: RunConfig, base: str, result: TrainResult, log: Path) -> str:
    """What a failed baseline says: what it trained, what to fix where, and the exact command."""
    if result.status == "crash" and f"no '{cfg.metric}:' line" in result.reason:
        what = (f"The job ran but printed no `{cfg.metric}:` line: if the metric has another name, set "
                f"`metric` in [tool.harness]; else make train.py print it after a `---` line.")
    else:
        what = "Fix the training code so that it runs on its own."
    last = next((line.strip() for line in reversed(tail(log, 2000).splitlines()) if line.strip()), "")
    ended = f" Its log ends: {last[:300]}." if last and last not in result.reason else ""
    return (f"the baseline did not produce {cfg.metric} ({result.reason}).{ended} It trained commit {base[:12]} "
            f"(your {cfg.from_rev} when the run started); see {log}. {what} Commit the fix (code or "
            f"settings) in your checkout {cfg.repo}, then: harness run --tag {cfg.tag} --resume --rebaseline")


def open_run(cfg: RunConfig, resume: bool, progress: Progress = no_progress,
             researcher: Researcher | None = None, executor: Any = None) -> tuple[Context, RunState | None]:
    """Refuse, create or re-attach the run's worktree. The state is None until the baseline is
    measured (runs.baseline); on --resume, reconcile rebuilds it (without training anything)."""
    gate = GitGate(cfg.repo)
    base = preflight_repo(cfg, gate, resume)
    researcher = researcher or make_researcher(cfg.agent, cfg.model, cfg.agent_options)
    gate.ensure_excluded()
    cfg.logs_dir.mkdir(parents=True, exist_ok=True)
    if resume and cfg.rebaseline:
        gate.attach_worktree(cfg.worktree, cfg.branch, data_files(cfg.protected))
        base, manifest = rebaseline(cfg, gate, base, read_manifest(cfg)), None
    elif resume:
        gate.attach_worktree(cfg.worktree, cfg.branch, data_files(cfg.protected))
        manifest = read_manifest(cfg)
        base = str(manifest.get("baseline_commit") or "")
        changed = routing_mismatch(manifest, researcher.name, pricing.resolve_model(cfg.model),
                                   researcher.describe())
        if changed and not cfg.agent_options.get("force"):
            raise RepoError(f"run {cfg.tag} was started with other researcher routing ({'; '.join(changed)}). "
                            f"Resume with the run's own --agent/--model/--base-url, key and CLI version, "
                            f"or pass --force.")
        if changed:  # --force: continued all the same, and said so where the run's history is
            events.record(cfg.run_dir, "resume_forced", "researcher changed on resume: " + "; ".join(changed))
        refused, limits = compare_resume(manifest.get("config", {}), cfg)  # config/: budget, metric, gate...
        if refused:
            raise RepoError(refusal_message(cfg.tag, refused))
        if limits:
            events.record(cfg.run_dir, "resume_settings", "limits changed on resume: " + "; ".join(limits))
    else:
        if cfg.worktree.exists() or cfg.ledger_path.exists():
            raise RepoError(f"{cfg.run_dir} already holds a run; choose another --tag or remove it.")
        base = gate.create_worktree(cfg.worktree, cfg.branch, cfg.from_rev, data_files(cfg.protected))
        manifest = None
    wt = gate.worktree(cfg.worktree)
    trusted = trusted_baseline(cfg, wt, base, manifest)
    program = program_text(cfg, gate, base)
    if manifest is None:  # a new run, or a baseline started again
        write_manifest(cfg, researcher, base, program, trusted.protected_sha256)
    for name in ("run.json", budget.FILE):
        trusted.hold(cfg.run_dir / name)
    link_results(cfg)
    ctx = Context(cfg, wt, researcher, program, executor=executor, trusted=trusted)
    state = reconcile(ctx, base, verify=True) if resume else None
    return ctx, state


# ---------------------------------------------------------------------------
# The summary


def summarize(cfg: RunConfig, state: RunState | None, stopped: str) -> Summary:
    """The run's figures from its ledger, by the one definition in figures.py."""
    h = figures.headline(ledger.read_rows(cfg.ledger_path), cfg.metric, cfg.direction)
    counts = {**h.counts, **({"budget": 1} if h.budget_stop else {})}
    return Summary(
        tag=cfg.tag, branch=cfg.branch, baseline_value=h.baseline, best_value=h.best,
        best_commit=h.best_commit, iterations=h.experiments, counts=counts,
        input_tokens=h.input_tokens, output_tokens=h.output_tokens, cost_usd=h.cost_usd,
        stopped=stopped, headline=h)


def interrupted(cfg: RunConfig, why: str = "Ctrl-C") -> str:
    """Why the run stopped after a signal, and what --resume will do first."""
    waiting = len(pending(cfg.run_dir, ledger.read_rows(cfg.ledger_path)))
    first = f" ({waiting} committed candidate{'s' if waiting > 1 else ''} will be trained first)" if waiting else ""
    return f"interrupted ({why}); continue with --resume{first}"
