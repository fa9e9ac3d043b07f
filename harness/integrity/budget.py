"""The time budget, measured by the harness: the job's own `training_seconds` is only a log.

The harness times every job itself (from starting it to its exit). What a job spends before
and after training (imports, compilation, saving the model) is the start-up allowance,
calibrated on the baseline's runs: their wall time minus the training time they reported
(the baseline is the user's own committed code, so its figure is trusted there and only there).
A candidate may run for budget + slack + allowance; beyond that it is `invalid`, with a message
that tells a slow machine (the last step ran past the slack) from code that ignores the budget.
A loaded machine is not cheating: a CPU job past that wall-clock limit is judged by what it
consumed. The kernel accounts the CPU time of the job's whole process tree (its cgroup, which
also holds what it left unreaped), and /proc/stat says how much of the machine stood idle while it
ran, and the kernel's scheduler statistics how long its threads waited for a CPU. The job passes
when all hold: its CPU time is within what the baseline's CPU rate (CPU
seconds per wall second, measured on the baseline's runs) buys in the wall limit, so it did no
more work than an honest job could on a quiet machine; and the machine had (almost) no idle CPU,
and one of its threads waited on a run queue for at least the time it ran past the limit, so
the wall time went to other work and not to a job that waited on purpose. Busy threads the job
starts to slow itself count against its CPU time; they earn it nothing. A GPU job is judged the
same way by its GPU time, which the driver accounts (NVML, executors/gputime.py): it passes when its kernels
ran no longer than the baseline's did (within GPU_MARGIN) and other processes' kernels held its
devices at least as long as it ran past the limit; a job that idles or works more is still
`invalid`. Where NVML cannot say, or no cgroup accounts a CPU job, the wall clock alone judges.
The hard deadline (kill_after) is enforced by the runner as before. The supervisor calibrates
(runs.calibrate, on the results its executor brought back) and hands the allowance to every
other job in its Job: a job, local or on a Ray worker, never reads startup.json.
"""
from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..ledger import events, guard as ledgerguard
from ..errors import RepoError

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..workload.runner import TrainResult

FILE = "startup.json"  # in the run folder: the calibration, never visible to a job, checked on every read
SLACK_FRACTION = 0.05  # of the budget: the step that was running when the budget ran out
ALLOWANCE_FACTOR = 1.5  # the baseline's start-up time, times this ...
ALLOWANCE_EXTRA_S = 2.0  # ... plus this many seconds: start-up varies from run to run
DEFAULT_ALLOWANCE_S = 60.0  # s, for a job judged before any baseline run of its commit was measured
IGNORES_FRACTION = 0.25  # over the budget by more than this fraction: not one slow step
GPU_MARGIN = 1.3  # a job on a shared GPU may use this times the baseline's GPU time
CPU_MARGIN = 1.3  # a job on a busy machine may use this times the baseline's CPU time (contention alone adds up to ~15%; a model may be larger)
BUSY_IDLE_FRACTION = 0.15  # of the CPUs: idle on average below this while the job ran = a busy machine
LOADED_OTHERS_FRACTION = 0.25  # of the CPUs used by other work during a baseline run: its allowance is a loaded one
_LOCK = threading.Lock()  # baseline runs on several slots at once calibrate one file


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""
    limit_s: float = 0.0


def startup_s(wall_s: float, reported_train_s: float | None, time_budget_s: float) -> float:
    """What a (baseline) job spent outside its training loop."""
    trained = reported_train_s if reported_train_s is not None else time_budget_s
    return max(0.0, wall_s - min(trained, wall_s))


@dataclass(frozen=True)
class Usage:
    """What a job consumed, by the kernel's accounting (runner.TrainResult's figures)."""
    cpu_s: float | None = None  # CPU seconds of its process tree; None = not accounted
    idle_cpus: float | None = None  # mean CPUs the machine left idle while it ran
    cpus: int = 0  # the CPUs it could run on
    gpu: bool = False  # it had a GPU: its work is not CPU time
    stall_s: float | None = None  # s its most-delayed thread waited on a run queue
    gpu_s: float | None = None  # GPU seconds of its own kernels (NVML); None = not measured
    gpu_others_s: float | None = None  # GPU seconds of other processes' kernels on its devices meanwhile

    @classmethod
    def of(cls, result, gpu: bool = False) -> "Usage":
        return cls(getattr(result, "cpu_s", None), getattr(result, "idle_cpus", None), getattr(result, "cpus", 0), gpu,
                   getattr(result, "stall_s", None), getattr(result, "gpu_s", None),
                   getattr(result, "gpu_others_s", None))


def calibrate(state_dir: Path, commit: str, wall_s: float, reported_train_s: float | None,
              time_budget_s: float, usage: Usage | None = None) -> float:
    """Record one baseline run (the supervisor's, on the result a job brought back); the allowance
    is taken from the slowest start-up seen, its CPU time recorded. startup.json is a
    trusted file (ledgerguard). A run while other work held the machine is marked `loaded`."""
    path = Path(state_dir) / FILE
    usage = usage or Usage()
    with _LOCK:
        data = read(state_dir) or {}
        if data.get("commit") != commit:
            data = {"commit": commit, "startup_s": []}
        data["startup_s"] = data["startup_s"] + [round(startup_s(wall_s, reported_train_s, time_budget_s), 3)]
        data["allowance_s"] = allowance_of(data["startup_s"])
        if usage.cpu_s is not None:
            data["cpu_s"] = data.get("cpu_s", []) + [round(usage.cpu_s, 3)]
        if usage.gpu_s is not None:
            data["gpu_s"] = data.get("gpu_s", []) + [round(usage.gpu_s, 3)]
        if usage.idle_cpus is not None and usage.cpus and usage.cpu_s is not None and wall_s > 0:
            others = max(0.0, usage.cpus - usage.idle_cpus - usage.cpu_s / wall_s)
            data["others_cpus"] = data.get("others_cpus", []) + [round(others, 3)]
            data["loaded"] = bool(data.get("loaded")) or others > LOADED_OTHERS_FRACTION * usage.cpus
        path.parent.mkdir(parents=True, exist_ok=True)
        ledgerguard.write_trusted(path, (json.dumps(data) + "\n").encode())
    return data["allowance_s"]


def allowance_of(startups_s: list[float]) -> float:
    return round(max(startups_s) * ALLOWANCE_FACTOR + ALLOWANCE_EXTRA_S, 3)


def read(state_dir: Path) -> dict | None:
    """The calibration, checked against the harness's record (RepoError when changed or deleted);
    None when no baseline run was measured yet."""
    path = Path(state_dir) / FILE
    raw = ledgerguard.read_trusted(path)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not (isinstance(data, dict) and isinstance(data.get("startup_s"), list)
            and isinstance(data.get("allowance_s"), (int, float))):
        raise RepoError(f"{path} is not a calibration the harness wrote; restore it from a backup, or start a "
                        f"new run from the run's branch (harness run --tag NEW --from <its branch>).")
    return data


def allowance(state_dir: Path, commit: str) -> float | None:
    """The allowance measured on commit's runs, None when none was measured (raises as read)."""
    data = read(state_dir)
    return float(data["allowance_s"]) if data and data.get("commit") == commit else None


def baseline_cpu_s(state_dir: Path, commit: str, key: str = "cpu_s") -> float | None:
    """The most CPU seconds (key="gpu_s": GPU seconds) one of commit's baseline runs used; None when
    not accounted."""
    data = read(state_dir)
    used = data.get(key) if data and data.get("commit") == commit else None
    if not (isinstance(used, list) and used and all(isinstance(c, (int, float)) and c > 0 for c in used)):
        return None
    return float(max(used))


def reported_seconds(metrics: dict) -> float | None:
    """The training time a job printed (a log, believed for the baseline's calibration only)."""
    value = metrics.get("training_seconds")
    return value if isinstance(value, float) and math.isfinite(value) else None


def judge(wall_s: float, time_budget_s: float, allowance_s: float, reported_train_s: float | None,
          usage: Usage | None = None, baseline_cpu_s: float | None = None,
          baseline_gpu_s: float | None = None) -> Verdict:
    """Was the job within its budget, by the harness's clock or, on a busy machine, by the CPU (or
    GPU) time it consumed? Pure. A passing verdict past the wall limit says why in reason."""
    slack_s = time_budget_s * SLACK_FRACTION
    limit_s = time_budget_s + slack_s + allowance_s
    if wall_s <= limit_s:
        return Verdict(True, limit_s=limit_s)
    loaded = (shared_gpu(wall_s, limit_s, usage, baseline_gpu_s) if usage is not None and usage.gpu
              else loaded_machine(wall_s, limit_s, usage, baseline_cpu_s))
    if loaded.ok:
        return loaded
    unit = "GPU" if usage is not None and usage.gpu else "CPU"
    trained_s = wall_s - allowance_s
    over_s = trained_s - time_budget_s
    head = (f"the job ran {wall_s:.1f}s by the harness's clock: about {trained_s:.1f}s of training after the "
            f"{allowance_s:.1f}s start-up allowance measured on the baseline, against a {time_budget_s:g}s budget")
    if over_s <= time_budget_s * IGNORES_FRACTION:
        return Verdict(False, f"{head}, over by {over_s:.1f}s: more than the {slack_s:.1f}s slack for the last "
                              f"step but under a quarter of the budget, as when one training step takes longer "
                              f"than the slack on a slow machine; raise --time-budget, or make a step shorter. "
                              f"By its {unit} time: {loaded.reason}", limit_s)
    claim = ""
    if reported_train_s is not None and reported_train_s <= time_budget_s * (1 + SLACK_FRACTION):
        claim = f"; it reported training_seconds {reported_train_s:.1f}, which the harness does not believe"
    return Verdict(False, f"{head}, over by {over_s:.1f}s (more than a quarter of the budget): the code does not "
                          f"stop when HARNESS_TIME_BUDGET is spent{claim}. By its {unit} time: {loaded.reason}", limit_s)


def loaded_machine(wall_s: float, limit_s: float, usage: Usage | None, baseline_cpu_s: float | None) -> Verdict:
    """A CPU job past the wall limit: ok when it consumed no more CPU than the baseline did (within
    CPU_MARGIN), the machine had no idle CPU to give it, and its threads waited for a CPU at least
    as long as it ran past the limit (module docstring); else not ok, with the figures in reason
    for the wall-clock verdict to add. Pure."""
    if usage is None or usage.cpu_s is None or not baseline_cpu_s:
        why = ("no cgroup accounted its CPU time" if usage is None or usage.cpu_s is None else
               "the baseline's CPU time was not measured")
        return Verdict(False, f"judged by the wall clock alone: {why}", limit_s)
    allowed_cpu_s = baseline_cpu_s * CPU_MARGIN
    rate = usage.cpu_s / wall_s if wall_s > 0 else 0.0
    figures = f"it used {usage.cpu_s:.1f} CPU-s against the baseline's {baseline_cpu_s:.1f}"
    if usage.cpu_s > allowed_cpu_s:
        return Verdict(False, f"{figures}: more work than the baseline did, so the extra time is not the machine's "
                              f"(a larger model on a busy machine looks the same: run it on a quieter one)", limit_s)
    if usage.idle_cpus is None or not usage.cpus or usage.idle_cpus > BUSY_IDLE_FRACTION * usage.cpus:
        idle = "unknown" if usage.idle_cpus is None else f"{usage.idle_cpus:.2f} of {usage.cpus}"
        return Verdict(False, f"{figures}, but the machine had CPUs idle while it ran ({idle} on average), so "
                              f"the extra time is the job's own, not another's load", limit_s)
    over_s = wall_s - limit_s
    if usage.stall_s is None or usage.stall_s < over_s:
        waited = "unknown" if usage.stall_s is None else f"{usage.stall_s:.1f}s"
        return Verdict(False, f"{figures}, but its threads waited for a CPU less than the {over_s:.1f}s it ran "
                              f"past the limit (the longest wait: {waited}), so the extra time is the job's own",
                       limit_s)
    slower = wall_s / max(wall_s - usage.stall_s, 1e-3)  # its busiest thread ran only wall - wait
    return Verdict(True, f"the machine was busy, about {slower:.1f}x slower for this job: it got {rate:.2f} CPUs on "
                         f"average and one of its threads waited {usage.stall_s:.1f}s for a CPU; it ran {over_s:.1f}s past the {limit_s:.1f}s wall limit on {usage.cpu_s:.1f} "
                         f"CPU-s (the baseline used {baseline_cpu_s:.1f}); not held against it. It trained fewer "
                         f"steps than on a quiet machine: raise --time-budget or --kill-after, or run on a quieter "
                         f"machine", limit_s)


def shared_gpu(wall_s: float, limit_s: float, usage: Usage, baseline_gpu_s: float | None) -> Verdict:
    """A GPU job past the wall limit: ok when its kernels ran no longer than the baseline's (within
    GPU_MARGIN) and other processes' kernels held its devices at least as long as it ran past the
    limit (NVML, executors/gputime.py); else not ok, the figures in reason. Pure."""
    if usage.gpu_s is None or usage.gpu_others_s is None or not baseline_gpu_s:
        why = ("the driver (NVML) reported no GPU time for it" if usage.gpu_s is None else
               "the baseline's GPU time was not measured")
        return Verdict(False, f"judged by the wall clock alone: {why}", limit_s)
    figures = f"its kernels ran {usage.gpu_s:.1f} GPU-s against the baseline's {baseline_gpu_s:.1f}"
    if usage.gpu_s > baseline_gpu_s * GPU_MARGIN:
        return Verdict(False, f"{figures}: more work than the baseline did, so the extra time is not another's "
                              f"(a larger model on a shared GPU looks the same: run it on a GPU of its own)", limit_s)
    over_s = wall_s - limit_s
    if usage.gpu_others_s < over_s:
        return Verdict(False, f"{figures}, but other processes' kernels held its GPU only {usage.gpu_others_s:.1f}s, "
                              f"less than the {over_s:.1f}s it ran past the limit, so the extra time is the job's own",
                       limit_s)
    return Verdict(True, f"the GPU was shared: other processes' kernels held it {usage.gpu_others_s:.1f}s while this "
                         f"job ran {over_s:.1f}s past the {limit_s:.1f}s wall limit on {usage.gpu_s:.1f} GPU-s (the "
                         f"baseline used {baseline_gpu_s:.1f}); not held against it. It trained fewer steps than on a "
                         f"GPU of its own: raise --time-budget or --kill-after, or give the run a GPU to itself",
                   limit_s)


def within(cfg: RunConfig, result: TrainResult, allowance_s: float | None, baseline_cpu_s: float | None = None,
           gpu: bool = False, baseline_gpu_s: float | None = None) -> TrainResult:
    """A trained job judged by the start-up allowance and CPU rate the supervisor measured on the
    baseline. A baseline run (allowance None) is not judged: the supervisor calibrates on its
    result. A job let off for a busy machine keeps its reason, and the run's events say so."""
    if result.status != "ok" or allowance_s is None:
        return result
    verdict = judge(result.train_s, cfg.time_budget, allowance_s, reported_seconds(result.metrics),
                    Usage.of(result, gpu), baseline_cpu_s, baseline_gpu_s)
    if verdict.ok and verdict.reason:
        events.record(cfg.run_dir, "loaded_machine", verdict.reason)
        return replace(result, reason=verdict.reason)
    return result if verdict.ok else replace(result, status="invalid", reason=verdict.reason)
