"""The scorers: the workload's `evaluate_command` (and a test job's `test_command`) on what a job
left, each from the baseline's protected files in a sandbox of its own (evaluation.py's steps 5-6).

A scorer sees its copy of the baseline's files, the job's output folder read-only and the data
cache; nothing of the slot's worktree (where the next job may train now) nor of the run folder.
A scorer runs in the idle scheduling class (IDLE_CLASS: it gets only the CPU time no training job
beside it wants) and, on a GPU, within EVAL_GPU_MEMORY_FRACTION of it; its deadline is calibrated
on the baseline's evaluation (limits.py).
"""
from __future__ import annotations

import contextlib
import json
import math
import shutil
import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..workload.runner import TrainResult, run_training, tail
from ..ledger import atomic
from . import limits, view
from .launch import harness_env, state_dir, wrapper

if TYPE_CHECKING:
    from .evaluation import Trained

# How a scorer is started: Linux's SCHED_IDLE class (chrt, util-linux), so that a training job
# beside it loses no step to it (benchmarks/overlap_step_time.py: x1.02 of its step time alone,
# against x1.31 at nice 10 and x8.9 at the same priority on 2 CPUs); nice 19 where chrt is missing.
# Inherited by everything it starts, and never raised again: nothing in it can leave the class
# without CAP_SYS_NICE (sched(7): RLIMIT_NICE), which no sandboxed process has.
IDLE_CLASS = ("chrt", "--idle", "0")
IDLE_FALLBACK = ("nice", "-n", "19")


def idle_prefix() -> list[str]:
    """The argv prefix that starts a command in the idle class (IDLE_CLASS, else IDLE_FALLBACK)."""
    for prefix in (IDLE_CLASS, IDLE_FALLBACK):
        path = shutil.which(prefix[0])
        if path:
            return [path, *prefix[1:]]
    return []


EVAL_GPU_MEMORY_FRACTION = 0.1  # of the slot's GPU a scorer may allocate (HARNESS_GPU_MEMORY_FRACTION)


def evaluate(t: Trained, cancel: threading.Event | None = None, overlap_s: float = 0.0) -> TrainResult:
    """Run evaluate_command from the baseline's files on what the job left; its result is the metric.

    It has its own deadline (eval_deadline, longer by overlap_s), bounds (limits.of) and
    the job's cancel event; a failed evaluation's row carries no figure of the job's metric."""
    cfg, job, space = t.cfg, t.result, t.space
    eval_log = t.log_path.with_suffix(".eval.log")
    done, figures, why = run_scorer(t, cfg.evaluate_command, eval_log, (space.evaluator, space.eval_tmp,
                                                                         space.eval_out), t.at_base, cancel, overlap_s)
    logged = {k: v for k, v in job.metrics.items()  # the job's own figures: a log, never the metric
              if k != cfg.metric and isinstance(v, float)}
    job = replace(job, metrics=logged)  # whatever the evaluation says, the job's printed metric is gone
    if figures is not None and "refused" in figures:
        return replace(job, status="invalid", sealed=True, reason=f"the evaluation refused the model: "
                                                                  f"{str(figures['refused'])[:400]}")
    if done.status == "timeout":
        return replace(job, status="timeout", sealed=True, reason=f"the evaluation was {done.reason} ({why})")
    if done.status == "invalid":  # a bound the evaluation of the job's model ran into
        return replace(job, status="invalid", sealed=True,
                       reason=f"the evaluation of its model ran into a bound: {done.reason}")
    value = None if figures is None else figures.get(cfg.metric)
    if done.returncode != 0 or not isinstance(value, (int, float)) or not math.isfinite(value):
        return replace(job, status="crash", sealed=True,
                       reason=f"the evaluation gave no finite {cfg.metric} ({done.reason or 'no result file'}): "
                              f"{tail(eval_log, 400)}")
    if t.at_base:
        calibrate_eval(state_dir(cfg, t.log_path), t.base, done.train_s)
    metrics = {**logged, **{k: float(v) for k, v in figures.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)}}
    return replace(job, status="ok", metrics=metrics, sealed=True, reason="")


def run_scorer(t: Trained, command: str, scorer_log: Path, folders: tuple[Path, Path, Path], at_base: bool,
               cancel: threading.Event | None, overlap_s: float = 0.0) -> tuple[TrainResult, dict | None, str]:
    """Run a scorer (evaluate_command, test_command) from the baseline's protected files (written
    from git by train_job) in its own sandbox, the job's output folder read-only; (how it ended, its
    result file, what its deadline is). folders: its copy of the baseline's files, its private /tmp,
    its result folder. It sees nothing of the slot's worktree (where the next job may train now) nor
    of any other job's folders: the run folder is hidden, and only its own folders are shown. It runs
    in the idle scheduling class (idle_prefix), so a training job beside it keeps the CPU it would
    have alone; on a GPU, within EVAL_GPU_MEMORY_FRACTION of it. overlap_s: how long training
    jobs beside it may starve it, on top of its deadline."""
    cfg, space = t.cfg, t.space
    files, tmp, out = folders
    result_file = out / "result.json"
    extra = {"HARNESS_OUTPUT_DIR": str(space.out), "HARNESS_RESULT_FILE": str(result_file),
             "HARNESS_GPU_MEMORY_FRACTION": f"{EVAL_GPU_MEMORY_FRACTION:g}"}
    if t.gpu is not None:  # the slot's GPU, as its job had it
        extra["CUDA_VISIBLE_DEVICES"] = t.gpu
    env = harness_env(extra)
    hidden = [p for p in (cfg.run_dir, cfg.repo / "runs", cfg.repo / ".git", view.HARNESS_PACKAGE, Path(t.worktree))
              if p.exists()]
    sandboxed = wrapper(t.choice, worktree=files, tmp_dir=tmp, output_dir=out,
                        readonly=[space.out, view.data_cache()], hidden=hidden, network=False)
    idle = idle_prefix()

    def wrap(argv: list[str]) -> list[str]:
        return [*idle, *(sandboxed(argv) if sandboxed is not None else argv)]
    where = state_dir(cfg, t.log_path)
    deadline_s, why = eval_deadline(cfg.eval_kill_after, where, t.base, at_base)
    if overlap_s and cfg.eval_kill_after is None:
        deadline_s, why = deadline_s + overlap_s, f"{why}, and {overlap_s:.0f}s for the training beside it"
    bounds = limits.of(cfg, where).watching(private_tmp=tmp, output_folder=out)
    done = run_training(command, files, env, scorer_log, cfg.metric, kill_after_s=deadline_s,
                        wrap=wrap, cancel=cancel, limits=bounds)
    return done, read_json(result_file), why


def score_test(t: Trained, cancel: threading.Event | None = None, overlap_s: float = 0.0) -> dict[str, Any]:
    """test_command on the model the job left: {metric: figure} (finite), or {"error": why}. Its own
    log (`.test.log`); the job's code never runs in it, and nothing it says decides anything."""
    cfg, space = t.cfg, t.space
    test_log = t.log_path.with_suffix(".test.log")
    done, figures, why = run_scorer(t, str(cfg.test_command), test_log, (space.tester, space.test_tmp,
                                                                          space.test_out), False, cancel, overlap_s)
    if figures is not None and "refused" in figures:
        return {"error": f"the test evaluation refused the model: {str(figures['refused'])[:400]}"}
    if done.status in ("timeout", "invalid"):
        return {"error": f"the test evaluation was stopped: {done.reason} ({why})"}
    value = None if figures is None else figures.get(cfg.metric)
    if done.returncode != 0 or not isinstance(value, (int, float)) or isinstance(value, bool) \
            or not math.isfinite(value):
        return {"error": f"the test evaluation gave no finite {cfg.metric} ({done.reason or 'no result file'}): "
                         f"{tail(test_log, 400)}"}
    return {cfg.metric: float(value), "test_s": done.train_s}


def read_json(path: Path) -> dict | None:
    """A result file's object, or None (missing, unreadable, not a JSON object)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# ---------------------------------------------------------------------------
# The evaluation's deadline, calibrated on the baseline's own evaluation

EVAL_FILE = "evaluation.json"  # in the run folder: the baseline's evaluation times, never visible to a job
EVAL_MIN_S = 120.0  # s: the shortest calibrated deadline (a candidate's model may be a little larger)
EVAL_FACTOR = 4.0  # the slowest baseline evaluation, times this
EVAL_UNCALIBRATED_S = 3600.0  # s, the baseline's own evaluation (the user's code; nothing measured yet)
_EVAL_LOCK = threading.Lock()  # baseline runs on several slots at once calibrate one file


def read_eval_times(where: Path, commit: str) -> list[float]:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        data = json.loads((Path(where) / EVAL_FILE).read_text())
        if data.get("commit") == commit:
            return [float(s) for s in data.get("eval_s", [])]
    return []


def calibrate_eval(where: Path, commit: str, eval_s: float) -> None:
    """Record one evaluation of the baseline's model (its wall seconds)."""
    path = Path(where) / EVAL_FILE
    with _EVAL_LOCK:
        times = read_eval_times(where, commit) + [round(eval_s, 3)]
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.atomic_write(path, json.dumps({"commit": commit, "eval_s": times}) + "\n")


def eval_deadline(setting_s: float | None, where: Path, commit: str, at_base: bool) -> tuple[float, str]:
    """(seconds, what they are) an evaluation may run: eval_kill_after when set; else, for a
    candidate, max(EVAL_MIN_S, EVAL_FACTOR x the slowest baseline evaluation); for the baseline
    (or before it was measured), EVAL_UNCALIBRATED_S. Never the training's kill_after: a slow
    machine's honest evaluation is not a slow training job."""
    if setting_s is not None:
        return setting_s, "eval_kill_after; raise it with --eval-kill-after"
    times = [] if at_base else read_eval_times(where, commit)
    if not times:
        return EVAL_UNCALIBRATED_S, "the baseline's evaluation is not measured yet; set it with --eval-kill-after"
    return (max(EVAL_MIN_S, EVAL_FACTOR * max(times)),
            f"{EVAL_FACTOR:g}x the baseline's {max(times):.1f}s evaluation; set it with --eval-kill-after")
