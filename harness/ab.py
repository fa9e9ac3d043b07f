"""`harness ab`: two researcher arms from the same baseline commit, then the comparison report.

Each arm is an ordinary run (its own branch `autoresearch/<tag>-<arm>`, worktree and ledger
under runs/<tag>/<arm>/) driven iteration by iteration through loop.open_run and
step.run_step. Schedules:

- interleave: A, B, A, B, ... so both arms see the same machine (a GPU's speed drifts over a
  night) and get the same GPU time; the default on one GPU.
- sequential: arm A until it stops, then arm B (the classic).
- parallel: both arms at once, one GPU each (threads; each arm's training gets its own
  CUDA_VISIBLE_DEVICES).

--hours is per arm and counted from the arm's ledger (the sum of its rows' wall_s), so an
interleaved run takes about twice --hours of wall clock and --resume continues the budget
instead of restarting it.
"""
from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import events, health, ledger, loop, pricing, recovery, report
from .loop import Progress, no_progress
from .agents import Researcher, make_researcher
from .config import RunConfig, resolve
from .errors import ConfigError, RepoError
from .gitgate import GitGate
from .step import Context, RunState, now_iso, run_step

SCHEDULES = ("interleave", "sequential", "parallel")
ARMS = ("a", "b")
JOIN_POLL_S = 0.5  # s between checks of the parallel arms' threads (lets Ctrl-C through)




@dataclass
class Arm:
    name: str
    cfg: RunConfig
    researcher: Researcher | None = None
    ctx: Context | None = None
    state: RunState | None = None
    stopped: str = ""
    error: BaseException | None = None
    monitor: health.Monitor | None = None  # health checkpoints, as in `harness run`


@dataclass
class ABResult:
    tag: str
    run_dir: Path
    schedule: str
    summaries: dict[str, loop.Summary] = field(default_factory=dict)
    report: report.Report | None = None
    stopped: str = "done"


# ---------------------------------------------------------------------------
# Set-up


def parse_gpus(gpus: str | None) -> list[str]:
    """'0,1' -> ['0', '1']; None or '' -> []."""
    out = [g.strip() for g in (gpus or "").split(",") if g.strip()]
    if len(set(out)) != len(out):
        raise ConfigError(f"--gpus {gpus!r} lists a GPU twice; give one GPU per arm, e.g. --gpus 0,1")
    return out


def choose_schedule(schedule: str | None, gpus: list[str]) -> str:
    schedule = schedule or ("parallel" if len(gpus) >= 2 else "interleave")
    if schedule not in SCHEDULES:
        raise ConfigError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if schedule == "parallel" and len(gpus) < 2:
        raise ConfigError("--schedule parallel runs one arm per GPU: pass two GPUs, e.g. --gpus 0,1 "
                          "(or use --schedule interleave on one GPU)")
    return schedule


def arm_gpu(gpus: list[str], index: int) -> str | None:
    if not gpus:
        return None
    return gpus[index] if index < len(gpus) else gpus[0]


def baseline_commit(repo: Path, from_rev: str | None, editable: tuple[str, ...],
                    protected: tuple[str, ...]) -> str:
    """Resolve --from once, so both arms start from exactly the same commit."""
    gate = GitGate(repo)
    if from_rev in (None, "HEAD"):
        dirty = gate.dirty_files((*editable, *protected))
        if dirty:
            raise RepoError("uncommitted changes in " + ", ".join(dirty) + ": commit or stash them "
                            "first, so both arms' baseline is exactly what you see.")
    return gate.require_commit(from_rev or "HEAD")


def arm_configs(repo: Path, tag: str, arms: dict[str, tuple[str | None, str | None]],
                overrides: dict[str, Any], base: str, gpus: list[str]) -> dict[str, RunConfig]:
    run_dir = Path(repo).resolve() / "runs" / tag
    out = {}
    for i, name in enumerate(ARMS):
        agent, model = arms.get(name, (None, None))
        out[name] = resolve(repo, f"{tag}-{name}", {
            **overrides, "agent": agent, "model": model, "arm": name, "from_rev": base,
            "run_root": run_dir / name, "gpu": arm_gpu(gpus, i)})
    return out


def write_setup(run_dir: Path, tag: str, base: str, schedule: str, gpus: list[str],
                arms: dict[str, Arm]) -> None:
    """runs/<tag>/ab.json: what was compared, how (kept from the first start across resumes)."""
    path = run_dir / "ab.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    setup = {
        "tag": tag, "repo": str(next(iter(arms.values())).cfg.repo), "baseline_commit": base,
        "schedule": schedule, "gpus": gpus, "created_at": old.get("created_at", now_iso()),
        "resumed_at": old.get("resumed_at", []) + ([now_iso()] if old else []),
        "arms": {name: {
            "agent": arm.cfg.agent, "researcher": arm.researcher.name if arm.researcher else arm.cfg.agent,
            "model": pricing.resolve_model(arm.cfg.model), "branch": arm.cfg.branch,
            "ledger": str(arm.cfg.ledger_path.relative_to(run_dir)), "gpu": arm.cfg.gpu,
            "hours": arm.cfg.hours, "iterations": arm.cfg.iterations,
        } for name, arm in arms.items()},
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(setup, indent=2) + "\n")


# ---------------------------------------------------------------------------
# Driving one arm


def open_arm(arm: Arm, resume: bool, progress: Progress, git_lock: threading.Lock) -> None:
    """loop.open_run for one arm. git_lock serialises the git set-up of parallel arms; it is
    released when the baseline (or a candidate left untrained) starts training, so both arms can train at once."""
    released = False

    def tagged(event: str, data: dict[str, Any]) -> None:
        nonlocal released
        if event in ("baseline", "resumed") and not released:  # training: the other arm may set up
            git_lock.release()
            released = True
        progress(event, {**data, "arm": arm.name})

    # An arm whose branch was never made (stopped before it started) starts fresh on --resume.
    resume_arm = resume and GitGate(arm.cfg.repo).branch_exists(arm.cfg.branch)
    git_lock.acquire()
    try:
        arm.ctx, arm.state = loop.open_run(arm.cfg, resume_arm, tagged, arm.researcher)
    finally:
        if not released:
            git_lock.release()
    arm.monitor = health.Monitor(arm.ctx, arm.state, lambda e, d: progress(e, {**d, "arm": arm.name}),
                                 events.size(arm.cfg.run_dir))
    progress("start", {"arm": arm.name, "best": arm.state.best_value, "iteration": arm.state.iteration})


def stop_reason(arm: Arm) -> str | None:
    """Why this arm must not start another iteration (--iterations, --hours, a budget), or None."""
    cfg, state = arm.cfg, arm.state
    if cfg.iterations is not None and state.iteration >= cfg.iterations:
        return f"reached --iterations {cfg.iterations}"
    rows = ledger.read_rows(cfg.ledger_path)
    if rows and rows[-1].get("status") == "budget":
        return rows[-1].get("description") or "stopped by a budget"
    if cfg.hours is not None:
        walls = [r.get("wall_s") or 0.0 for r in rows if r.get("status") != "repeat"]  # repeats: inside their candidate's
        spent_s, estimate_s = sum(walls), max(walls[-5:] or [0.0])
        if spent_s + estimate_s > cfg.hours * 3600:
            return f"reached --hours {cfg.hours:g} (the next iteration would not finish in time)"
    return arm.monitor.before_iteration() or loop.stop_for_budget(arm.ctx, state, rows, state.iteration + 1)


def step_arm(arm: Arm, progress: Progress, start: float) -> bool:
    """One iteration of one arm; False (and arm.stopped set) when the arm is done."""
    reason = stop_reason(arm)
    if reason:
        arm.stopped = reason
        return False
    progress("iteration", {"arm": arm.name, "iteration": arm.state.iteration + 1,
                           "elapsed_s": time.monotonic() - start})
    row = run_step(arm.ctx, arm.state)
    arm.monitor.after_row(row)
    progress("row", {"arm": arm.name, "row": row, "best": arm.state.best_value,
                     "elapsed_s": time.monotonic() - start, "eta_s": None})
    return True


# ---------------------------------------------------------------------------
# Schedules


def run_interleaved(arms: list[Arm], resume: bool, progress: Progress, start: float) -> None:
    lock = threading.Lock()
    for arm in arms:
        open_arm(arm, resume, progress, lock)
    active = list(arms)
    while active:
        for arm in list(active):
            if not step_arm(arm, progress, start):
                active.remove(arm)


def run_sequential(arms: list[Arm], resume: bool, progress: Progress, start: float) -> None:
    lock = threading.Lock()
    for arm in arms:
        open_arm(arm, resume, progress, lock)
        while step_arm(arm, progress, start):
            pass


def run_parallel(arms: list[Arm], resume: bool, progress: Progress, start: float) -> None:
    lock, stop, emit = threading.Lock(), threading.Event(), threading.Lock()

    def safe_progress(event: str, data: dict[str, Any]) -> None:
        with emit:  # progress printers are not thread-safe
            progress(event, data)

    def work(arm: Arm) -> None:
        try:
            open_arm(arm, resume, safe_progress, lock)
            while not stop.is_set() and step_arm(arm, safe_progress, start):
                pass
            if stop.is_set() and not arm.stopped:
                arm.stopped = "stopped with the other arm"
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            arm.error = e
            stop.set()

    threads = [threading.Thread(target=work, args=(arm,), name=f"arm-{arm.name}", daemon=True)
               for arm in arms]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(JOIN_POLL_S)
    except KeyboardInterrupt:
        # The training jobs run in their own sessions: let the in-flight iterations finish.
        # A second Ctrl-C abandons them; --resume then records them as interrupted.
        stop.set()
        progress("stopping", {"message": "Ctrl-C: finishing the in-flight iterations "
                                         "(Ctrl-C again to abandon them)"})
        for t in threads:
            t.join()
        raise
    errors = [a.error for a in arms if a.error is not None]
    interrupts = [e for e in errors if isinstance(e, KeyboardInterrupt)]
    if interrupts:
        raise interrupts[0]
    if errors:
        raise errors[0]


# ---------------------------------------------------------------------------
# The launcher


def run_ab(repo: Path, tag: str, arms: dict[str, tuple[str | None, str | None]],
           schedule: str | None = None, gpus: str | None = None, resume: bool = False,
           overrides: dict[str, Any] | None = None, progress: Progress = no_progress,
           researchers: dict[str, Researcher] | None = None, write_report: bool = True) -> ABResult:
    """Run arm A and arm B (agent, model) from the same baseline commit, then write the report.

    overrides are per-arm RunConfig settings (hours and iterations are per arm).
    researchers injects ready researcher objects by arm name (tests, custom backends).
    """
    repo = Path(repo).resolve()
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    run_dir = repo / "runs" / tag
    setup_path = run_dir / "ab.json"
    old = json.loads(setup_path.read_text()) if setup_path.exists() else None
    if old is not None and not resume:
        raise RepoError(f"{run_dir} already holds an A/B run: pass --resume to continue it, "
                        f"or choose another --tag.")
    if old is None and resume:
        raise RepoError(f"nothing to resume: {setup_path} does not exist. Drop --resume.")
    gpu_list = parse_gpus(gpus) if gpus is not None or old is None else list(old.get("gpus", []))
    schedule = choose_schedule(schedule or (old or {}).get("schedule"), gpu_list)
    probe = resolve(repo, f"{tag}-a", {k: v for k, v in overrides.items()
                                       if k not in ("hours", "iterations", "max_tokens", "max_cost")})
    base = old["baseline_commit"] if old else baseline_commit(
        repo, overrides.get("from_rev"), probe.editable, probe.protected)
    if old:  # an arm's agent and model cannot change under --resume
        arms = {name: (arms.get(name, (None, None))[0] or old["arms"][name]["agent"],
                       arms.get(name, (None, None))[1] or old["arms"][name]["model"]) for name in ARMS}
    cfgs = arm_configs(repo, tag, arms, overrides, base, gpu_list)
    researchers = researchers or {}
    pool = {name: Arm(name, cfg, researchers.get(name) or make_researcher(cfg.agent, cfg.model, cfg.agent_options))
            for name, cfg in cfgs.items()}
    with contextlib.ExitStack() as held:  # one driver per A/B run and per arm
        for folder in (run_dir, *(arm.cfg.run_dir for arm in pool.values())):
            held.enter_context(recovery.supervisor_lock(folder))
        write_setup(run_dir, tag, base, schedule, gpu_list, pool)
        result = ABResult(tag, run_dir, schedule)
        runner = {"interleave": run_interleaved, "sequential": run_sequential, "parallel": run_parallel}[schedule]
        try:
            runner(list(pool.values()), resume, progress, time.monotonic())
        except KeyboardInterrupt:
            result.stopped = "interrupted (Ctrl-C); continue with --resume"
            old_handler = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not tear the cleanup
            try:
                for arm in pool.values():
                    if arm.ctx is not None:
                        arm.state = loop.reconcile(arm.ctx, arm.state.baseline_commit if arm.state else base,
                                                    retrain=False) or arm.state
                        arm.stopped = arm.stopped or result.stopped
            finally:
                signal.signal(signal.SIGINT, old_handler)
        for name, arm in pool.items():
            result.summaries[name] = loop.summarize(arm.cfg, arm.state, arm.stopped or result.stopped)
        if write_report:
            result.report = report.build([run_dir])
        return result
