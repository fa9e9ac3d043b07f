"""The training job: a subprocess in its own process group, under a hard deadline.

The job's whole output goes to a log file; the result comes from the final `---` block of
`key: value` lines (or from the JSON file that the workload's protected code writes).
"""
from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..lifecycle import faults, supervise

if TYPE_CHECKING:
    from ..executors.limits import Cgroup, Limits, Watch

# Variables that must never reach the training job (the researcher's code runs there).
SECRET_RE = re.compile(r"(_API_KEY|_TOKEN|_SECRET|_PASSWORD|_CREDENTIALS?)$|^(AWS_|AZURE_|GH_|GITHUB_TOKEN)", re.I)
TERM_GRACE_S = 5.0  # s between SIGTERM and SIGKILL of the process group
POLL_S = 0.2  # s between checks of the job
RESULT_TAIL_BYTES = 256 * 1024  # of the log read for the result block: never the whole log (it may be large)


@dataclass
class TrainResult:
    status: str  # "ok", "crash" or "timeout"
    metrics: dict[str, float] = field(default_factory=dict)
    train_s: float = 0.0  # wall seconds of the job
    returncode: int | None = None
    reason: str = ""
    sealed: bool | None = None  # True: figures from a verified sealed result; False: from stdout
    node: str = ""  # the machine that trained it (executors fill it in)
    cpu_s: float | None = None  # CPU seconds of the job's whole process tree (its cgroup's accounting); None = not measured
    idle_cpus: float | None = None  # mean CPUs the machine left idle while it ran (/proc/stat), of `cpus`
    cpus: int = 0  # the CPUs it could run on
    stall_s: float | None = None  # s its most-delayed thread waited on a run queue (cpuload.Stalls)
    gpu_s: float | None = None  # GPU seconds its processes' kernels ran (NVML, gputime.py); None = not measured
    gpu_others_s: float | None = None  # GPU seconds other processes' kernels ran on its devices meanwhile
    test_metrics: dict = field(default_factory=dict)  # a test job's figure on the test split (never decides)

    start: str = ""  # "warm": handed to a pre-started interpreter (executors/warm.py); "cold": started for it; "": not trained

    def value(self, metric: str) -> float | None:
        """The metric of an ok job only: a crash's, a timeout's or an invalid job's figures are the
        job's own print, never a row's metric."""
        if self.status != "ok":
            return None
        v = self.metrics.get(metric)
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


# ---------------------------------------------------------------------------
# Parsing: pure functions on strings


def parse_summary(text: str) -> dict[str, float | str]:
    """The `key: value` lines after the last line that is exactly `---`.

    Numbers become floats (nan stays nan); other values stay strings. No `---` = {}.
    """
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == "---"]
    if not starts:
        return {}
    out: dict[str, float | str] = {}
    for line in lines[starts[-1] + 1:]:
        key, sep, raw = line.partition(":")
        key = key.strip()
        if not sep or not key or " " in key:
            continue
        raw = raw.strip()
        try:
            out[key] = float(raw)
        except ValueError:
            out[key] = raw
    return out


def judge(text: str, returncode: int | None, metric: str) -> tuple[str, dict, str]:
    """Decide ok/crash from the job's output and exit code: (status, metrics, reason)."""
    metrics = parse_summary(text)
    if returncode not in (0, None):
        errors = re.findall(r"^(\w+(?:Error|Exception|Interrupt)\b.*)$", text, re.M)
        detail = f": {errors[-1][:200]}" if errors else ""
        return "crash", metrics, f"exit code {returncode}{detail}"
    if re.search(r"^FAIL\b", text, re.M):
        return "crash", metrics, "the job printed FAIL"
    value = metrics.get(metric)
    if value is None:
        return "crash", metrics, f"no '{metric}:' line after a '---' line in the output"
    if not isinstance(value, float) or math.isnan(value) or math.isinf(value):
        return "crash", metrics, f"{metric} is not a finite number: {value!r}"
    return "ok", {k: v for k, v in metrics.items() if isinstance(v, float)}, ""


def tail(path: Path, max_bytes: int = 4000) -> str:
    """The last max_bytes of a log file (for the researcher's prompt and error messages)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return data if size <= max_bytes else "...\n" + data.split("\n", 1)[-1]


# ---------------------------------------------------------------------------
# Running


@dataclass
class Started:
    """A job process already running under its bounds, handed its job just now (a warm start,
    executors/warm.py): run_training watches it from here, its clock and its CPU counted from the
    handover, its log already at log_path."""
    proc: subprocess.Popen
    group: Cgroup | None
    cpu_before_s: float | None  # CPU seconds its cgroup used before the handover (its imports): not the job's


def training_env(base: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not SECRET_RE.search(k)}
    env.update(extra)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the whole process group, then SIGKILL whatever is left after a grace period."""
    supervise.stop(proc, TERM_GRACE_S)


def run_training(command: str, cwd: Path, env: dict[str, str], log_path: Path, metric: str,
                 kill_after_s: float, stall_after_s: float | None = None,
                 pass_fds: tuple[int, ...] = (), cancel: threading.Event | None = None,
                 wrap: Callable[[list[str]], list[str]] | None = None, limits: Limits | None = None,
                 gpu: bool = False, started: Started | None = None,
                 on_start: Callable[[], None] | None = None) -> TrainResult:
    """Run the job to completion, a crash, the hard deadline, a stall or a bound; never raises for job failures.

    A KeyboardInterrupt while waiting (or cancel set, from another thread) kills the job's
    process group and propagates as KeyboardInterrupt. pass_fds are inherited by the job (the
    seal key's pipe). wrap turns the job's argv into the sandbox's (executors/sandbox.py). limits
    (executors/limits.Limits; None = only the log's default cap) bound its memory, processes, disk
    and log; a job that ran into one is `invalid`, the bound named. gpu: the job may use a GPU, whose
    time NVML accounts (gputime.py). The job is started through the
    run's supervisor (supervise.py): it is on disk before it runs, so a resumed supervisor can stop
    a job its killed predecessor left behind. started: the job's process is already running (a warm
    start, its sandbox and bounds those of the command's: executors/warm.py); command and wrap
    unused. on_start: called once the job's process runs (the local executor readies the next job's interpreter then).
    """
    from ..executors import limits as bounds  # executors/ imports this module: bound here, not at import
    from ..executors.cpuload import Stalls, idle_cpus, idle_ticks
    from ..executors.gputime import GpuTime, cgroup_pids
    limits = limits or bounds.Limits()
    argv = shlex.split(command)
    argv = wrap(argv) if wrap is not None and started is None else argv
    log_path.parent.mkdir(parents=True, exist_ok=True)
    group = started.group if started is not None else bounds.Cgroup.make(limits)
    idle_before = idle_ticks()
    start = time.monotonic()
    try:
        if started is not None:
            proc = started.proc
        else:  # the job writes its log itself (a file, not a pipe to the harness): a job outlives a
            # killed supervisor as before, for the resumed one to stop; the poll loop bounds its size
            with open(log_path, "wb") as log:
                try:
                    proc = supervise.spawn(f"train {log_path.name}", bounds.prefix(limits, group) + argv, cwd=cwd,
                                           env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           pass_fds=pass_fds)
                except OSError as e:
                    log.write(f"could not start {argv!r}: {e}\n".encode())
                    return TrainResult("crash", reason=f"could not start the training command: {e}")
        if on_start is not None:
            on_start()
        faults.point("during_train")  # tests: the supervisor dies while the job runs
        watch, stalls = bounds.Watch(limits, start, log_path), Stalls(group)
        gpu_time = GpuTime(env.get("CUDA_VISIBLE_DEVICES"),
                           cgroup_pids(group.procs_files() if group else [], proc.pid)) if gpu else None
        try:
            status, reason = _wait(proc, log_path, watch, start, kill_after_s, stall_after_s, cancel,
                                   (stalls, gpu_time) if gpu_time else (stalls,))
        finally:
            kill_group(proc)
            if gpu_time is not None:
                gpu_time.close()
            bounds.trim_log(log_path, limits.log_mb)  # head and tail kept, the cut said
        if status is None:  # it exited: did it run into a bound?
            status, reason = _exceeded(proc, group, watch, limits, log_path)
        cpu_s = group.cpu_seconds() if group is not None else None  # all of it is gone: the total is final
        if cpu_s is not None and started is not None:  # a warm start's imports are not the job's
            cpu_s = None if started.cpu_before_s is None else max(0.0, cpu_s - started.cpu_before_s)
    finally:
        if group is not None:
            group.remove()
    train_s = time.monotonic() - start
    idle_after = idle_ticks()
    used = {"cpu_s": cpu_s, "idle_cpus": idle_cpus(idle_before, idle_after, train_s),
            "cpus": idle_after[1] if idle_after else 0, "stall_s": stalls.max_s,
            "gpu_s": gpu_time.gpu_s if gpu_time else None, "gpu_others_s": gpu_time.others_s if gpu_time else None}
    used["start"] = "warm" if started is not None else "cold"
    if status is not None:
        return TrainResult(status, train_s=train_s, returncode=proc.returncode, reason=reason, **used)
    status, metrics, reason = judge(tail(log_path, RESULT_TAIL_BYTES), proc.returncode, metric)
    return TrainResult(status, metrics, train_s, proc.returncode, reason, **used)


def _exceeded(proc: subprocess.Popen, group: Cgroup | None, watch: Watch, limits: Limits,
              log_path: Path) -> tuple[str | None, str]:
    """("invalid", the bound) of a job that exited past a bound, else (None, "")."""
    from ..executors import limits as bounds
    over = watch.over(float("inf"))  # a filler faster than the watch's period, measured once more
    if over is None and proc.returncode != 0:
        over = (group.exceeded(limits) if group else None) or bounds.file_too_large(
            proc.returncode, tail(log_path, RESULT_TAIL_BYTES), limits)
    return ("invalid", over) if over else (None, "")


def _wait(proc: subprocess.Popen, log_path: Path, watch: Watch, start: float, kill_after_s: float,
          stall_after_s: float | None, cancel: threading.Event | None,
          samplers: tuple = ()) -> tuple[str | None, str]:
    """Poll the job until it exits (None, "") or must be killed: (status, reason). samplers
    (cpuload.Stalls, gputime.GpuTime) look at it at every poll."""
    last_size, last_change = 0, start
    while True:
        for sampler in samplers:
            sampler.sample(time.monotonic())
        if supervise.wait_exit(proc, POLL_S):  # returns the moment the job exits
            return None, ""
        if cancel is not None and cancel.is_set():
            raise KeyboardInterrupt("training cancelled")
        now = time.monotonic()
        if now - start > kill_after_s:
            return "timeout", f"still running after {kill_after_s:.0f}s (kill_after)"
        over = watch.over(now)
        if over:
            return "invalid", over
        size = log_path.stat().st_size
        if size != last_size:
            last_size, last_change = size, now
        elif stall_after_s and now - last_change > stall_after_s:
            return "timeout", f"no output for {stall_after_s:.0f}s (stall)"
