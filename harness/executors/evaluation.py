"""One training job, sandboxed, and the metric from an evaluation the job cannot reach.

`train(...)` is what an executor runs (explicit inputs, so it can move into an executor), in two
halves: `train_job` (steps 1-4, while the job holds its slot) and `finish` (steps 5-6, which the
local executor runs after it has handed the slot to the next job: docs/pipeline.md):

1. protected files restored as committed, the sandbox chosen (sandbox.resolve);
2. for a workload with `train_data_command`: the training split exported once per baseline (its
   commit and protected files' sha256) from the baseline's protected files, into the run folder,
   given to every job read-only (HARNESS_DATA_DIR), while the protected data files and the data
   cache are hidden from it;
3. the job runs in the sandbox with a private /tmp and an output folder (HARNESS_OUTPUT_DIR),
   timed by the harness (budget.py);
4. protected files checked again, the budget judged, the scorers' copies of the baseline's
   files written from git;
5. with `evaluate_command`: the baseline's protected files are written from git into a folder
   the job never saw, and the command runs there, sandboxed, with the job's output folder
   read-only; its result file, in a folder only it can write, is the metric (`sealed` = yes).
   Without one (a foreign workload): the printed block is the metric, `sealed` = no.
6. for a test job (cfg.score_test, testsplit.py) with `test_command`: the same, once more, from
   another fresh copy of the baseline's files, on the private test split; its figure is the
   result's `test_metrics`, which no decision reads.
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from ..lifecycle import disk
from ..ledger import events, trust
from ..integrity import guard, seal
from ..config import RunConfig
from ..gitgate import Worktree
from ..workload.runner import RESULT_TAIL_BYTES, TrainResult, run_training, tail, training_env
from . import budget, limits, sandbox, traindata, uvenv, view

# A job without network: libraries that fetch from the Hugging Face hub take what is in their cache
# (shown through data_paths) at once, instead of trying the network first.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1"}
# Caches that tools write under $HOME, sent to the private /tmp (the home is not in the sandbox's view).
SANDBOX_ENV = {"TMPDIR": "/tmp", "TRITON_HOME": "/tmp", "TRITON_CACHE_DIR": "/tmp/.triton",
               "TORCHINDUCTOR_CACHE_DIR": "/tmp/.inductor", "CUDA_CACHE_PATH": "/tmp/.nv", "MPLCONFIGDIR": "/tmp/.mpl"}
SUMMARY_LINE_RE = re.compile(r"^\w+:\s*[-+0-9.eE]+$|^\w+:\s*(nan|inf)$", re.I)  # a `key: number` result line
JOB_ONLY_ENV = ("HARNESS_DATA_DIR", "HARNESS_MAX_STEPS", "HARNESS_SEED", "HARNESS_TIME_BUDGET")  # not for evaluations


@dataclass(frozen=True)
class Space:
    """One job's folders, inside the run folder (which every job sees as an empty folder)."""
    root: Path

    @property
    def tmp(self) -> Path: return self.root / "tmp"
    @property
    def out(self) -> Path: return self.root / "out"
    @property
    def eval_tmp(self) -> Path: return self.root / "eval-tmp"
    @property
    def eval_out(self) -> Path: return self.root / "eval-out"
    @property
    def evaluator(self) -> Path: return self.root / "evaluator"
    @property
    def test_tmp(self) -> Path: return self.root / "test-tmp"
    @property
    def test_out(self) -> Path: return self.root / "test-out"
    @property
    def tester(self) -> Path: return self.root / "tester"


def fresh_space(log_path: Path) -> Space:
    space = Space(log_path.with_suffix(".job"))
    shutil.rmtree(space.root, ignore_errors=True)
    for folder in (space.tmp, space.out, space.eval_tmp, space.eval_out, space.evaluator, space.test_tmp,
                   space.test_out, space.tester):
        folder.mkdir(parents=True)
    return space


def state_dir(cfg: RunConfig, log_path: Path) -> Path:
    """The run folder, or (for `harness check`'s throwaway runs) the log's folder."""
    return cfg.run_dir if cfg.run_dir.exists() else log_path.parent


def baseline_commit(cfg: RunConfig, worktree: Path, baseline: str,
                    protected_sha256: dict[str, str]) -> str | TrainResult:
    """The commit whose protected files evaluate this job: the run's baseline as the supervisor
    holds it (never a file the job or the researcher could write), checked (trust.py) to be an
    ancestor of the job's commit with the protected files recorded at the start; a mismatch is
    an `invalid` result. A throwaway run (`harness check`, baseline "") is its own baseline."""
    with Worktree(worktree) as wt:
        head = wt.head()
        if not baseline:
            return head
        problem = trust.baseline_problem(wt.repo, baseline, head, protected_sha256, cfg.protected)
    if problem:
        return TrainResult("invalid", reason=f"{problem}: refused by the trusted baseline check, the evaluator "
                                             f"runs only from the run's own baseline")
    return baseline


def hidden_paths(cfg: RunConfig, worktree: Path, hide_data: bool) -> list[Path]:
    """What a sandboxed job must not see even where a folder it is shown holds it: the run folders,
    git's objects, the harness itself and, when the training split is exported for it, the data it
    was exported from. (Host sockets under /run need no cover: the view never shows /run.)"""
    paths = [cfg.run_dir, cfg.repo / "runs", cfg.repo / ".git", view.HARNESS_PACKAGE]
    if hide_data:
        data = [p for p in cfg.protected if not p.endswith(".py")]
        paths += [root / p for root in (cfg.repo, Path(worktree)) for p in data] + [view.data_cache()]
    return [p for p in paths if p.exists()]


def wrapper(choice: sandbox.Choice, **kw) -> Callable[[list[str]], list[str]] | None:
    bwrap = sandbox.bwrap_path()
    if not choice.on or bwrap is None:
        return None
    return lambda argv: sandbox.wrap(argv, bwrap=bwrap, **kw)


def unshowable(choice: sandbox.Choice, command: str) -> TrainResult | None:
    """A crash that says what to fix when the sandbox cannot show the command's program (a venv
    that is gone, a command not on PATH), before anything runs; None when it can."""
    if not choice.on:
        return None
    try:
        view.interpreter(shlex.split(command))
    except (view.ViewError, ValueError) as e:
        return TrainResult("crash", reason=f"the sandbox cannot run {command!r}: {e}")
    return None


def choose(cfg: RunConfig, where: Path) -> sandbox.Choice:
    choice = sandbox.resolve(cfg.sandbox)
    warning = sandbox.warn_once(choice)
    if warning:
        events.record(where, "sandbox_off", warning)
    return choice


# ---------------------------------------------------------------------------
# The training job


@dataclass
class Trained:
    """A job whose training process is over and checked (protected files, budget): what its
    evaluation still needs, none of it in the slot's worktree, so the slot can take the next job
    while this one is evaluated (local.py). The scorers' copies of the baseline's files are
    already written from git; the worktree's path is kept only to be hidden from them."""
    cfg: RunConfig
    worktree: Path
    log_path: Path
    space: Space
    base: str
    choice: sandbox.Choice
    result: TrainResult
    at_base: bool  # the job trained the baseline's own code (its evaluation calibrates the deadline)
    testing: bool  # a test job: test_command scores it too
    gpu: str | None  # the slot's CUDA_VISIBLE_DEVICES, None = inherited

    @property
    def scored(self) -> bool:
        """Does an evaluation still have to run (the job trained cleanly and the workload scores it)?"""
        return self.result.status == "ok" and (bool(self.cfg.evaluate_command) or self.testing)


def train(cfg: RunConfig, worktree: Path, log_path: Path, seed: int,
          cancel: threading.Event | None = None, gpu: str | None = None,
          job_env: dict[str, str] | None = None, baseline: str = "",
          protected_sha256: dict[str, str] | None = None, allowance_s: float | None = None,
          baseline_cpu_s: float | None = None, baseline_gpu_s: float | None = None) -> TrainResult:
    """Train the code in worktree once, sandboxed; the metric from the separate evaluation if any
    (train_job, then finish, one after the other).

    gpu: the executor slot's GPU (CUDA_VISIBLE_DEVICES); job_env: more variables for the job
    (the tracker's HARNESS_RUN, HARNESS_ITERATION, HARNESS_COMMIT); baseline, protected_sha256,
    allowance_s, baseline_cpu_s, baseline_gpu_s: the run's trusted baseline as the Job carries it (executors/base.py)."""
    return finish(train_job(cfg, worktree, log_path, seed, cancel, gpu, job_env, baseline, protected_sha256,
                            allowance_s, baseline_cpu_s, baseline_gpu_s), cancel)


def train_job(cfg: RunConfig, worktree: Path, log_path: Path, seed: int,
              cancel: threading.Event | None = None, gpu: str | None = None,
              job_env: dict[str, str] | None = None, baseline: str = "",
              protected_sha256: dict[str, str] | None = None, allowance_s: float | None = None,
              baseline_cpu_s: float | None = None, baseline_gpu_s: float | None = None) -> Trained | TrainResult:
    """The training half: the job sandboxed and timed, the protected files checked after it, the
    budget judged, the scorers' files written from git. A TrainResult when nothing is left to
    evaluate before anything trained (a refused baseline, a failed export); else a Trained."""
    worktree = Path(worktree)
    base = baseline_commit(cfg, worktree, baseline, protected_sha256 or {})
    if isinstance(base, TrainResult):
        return base
    result_file = log_path.with_suffix(".result.json")
    where = state_dir(cfg, log_path)
    choice = choose(cfg, where)
    space = fresh_space(log_path)
    extra = {"HARNESS_TIME_BUDGET": f"{cfg.time_budget:g}", "HARNESS_SEED": str(seed),
             "HARNESS_RESULT_FILE": str(result_file)}
    testing = cfg.score_test and bool(cfg.test_command)
    if cfg.evaluate_command or testing:  # where the job leaves what the evaluation scores
        extra["HARNESS_OUTPUT_DIR"] = str(space.out)
    extra.update(job_env or {})
    if cfg.max_steps is not None:
        extra["HARNESS_MAX_STEPS"] = str(cfg.max_steps)
    if gpu is not None:  # the executor slot's GPU
        extra["CUDA_VISIBLE_DEVICES"] = gpu
    on_gpu = has_gpu(extra.get("CUDA_VISIBLE_DEVICES"))
    readonly = [worktree / ".git"]  # the job may not point the worktree at another repository
    if cfg.train_data_command:
        data_dir = traindata.export(cfg, worktree, where, base, choice, log_path, cancel, protected_sha256)
        if isinstance(data_dir, TrainResult):
            return data_dir
        extra["HARNESS_DATA_DIR"] = str(data_dir)
        readonly.append(data_dir)
    if uvenv.is_uv(cfg.train_command):  # `uv run`: the run's environment, built once, read-only
        uv = uvenv.prepare(cfg.setup_command, worktree, where, lambda **kw: wrapper(choice, worktree=worktree, **kw),
                           harness_env({}), cfg.setup_timeout, cancel)
        if isinstance(uv, TrainResult):
            log_path.write_text(uv.reason + "\n")
            return uv
        extra.update(uv.env, UV_CACHE_DIR="/tmp/.uv-cache" if choice.on else str(space.tmp / ".uv-cache"))
        readonly += list(uv.readonly)
    readonly += shown_data(cfg)
    if choice.on:
        extra.update(SANDBOX_ENV, HARNESS_RESULT_FILE=str(space.out / "result.json"))
        if not cfg.network:  # the Hugging Face hub's libraries (karpathy's `kernels`) read their cache only
            extra.update(OFFLINE_ENV)
    guard.before_training(cfg.run_dir, worktree, cfg.protected, result_file)
    refused = unshowable(choice, cfg.train_command)
    if refused is not None:
        log_path.write_text(refused.reason + "\n")
        return refused
    wrap = wrapper(choice, worktree=worktree, tmp_dir=space.tmp, output_dir=space.out, readonly=readonly,
                   hidden=hidden_paths(cfg, worktree, bool(cfg.train_data_command)), network=cfg.network)
    legacy_seal = not cfg.evaluate_command and seal.enabled(cfg.sealed, worktree, cfg.protected)
    with seal.channel(legacy_seal) as ch:
        env = seal.job_env(training_env(dict(os.environ), extra), ch)
        result = run_training(cfg.train_command, worktree, env, log_path, cfg.metric, kill_after_s=cfg.kill_after,
                              stall_after_s=cfg.stall_after_min * 60, pass_fds=ch.fds, cancel=cancel, wrap=wrap,
                              limits=limits.of(cfg, where).watching(private_tmp=space.tmp, output_folder=space.out,
                                                                    worktree=worktree),
                              gpu=on_gpu)
    if choice.on:  # what the job wrote, where the legacy checks look
        copy_job_file(space.out / "result.json", result_file)
    if result.status == "crash" and disk.job_hit_it(space.root):  # before its files go
        shutil.rmtree(space.root, ignore_errors=True)
        return replace(result, reason=f"{disk.REASON} ({disk.free_mb(log_path.parent)} MB free under "
                                      f"{log_path.parent}) while it trained")
    if result.status == "crash" and choice.on:
        result = replace(result, reason=unseen_hint(result.reason, log_path, cfg))
    if cfg.evaluate_command:
        result = job_outcome(result, log_path)
    elif result.status != "invalid":  # a bound the job ran into (limits.py) stays its verdict
        result = seal.judge(result, result_file, ch.key, cfg.metric, cfg.time_budget)
    result = guard.after_training(cfg.run_dir, worktree, cfg.protected, result)
    judged = within_budget(cfg, result, allowance_s, baseline_cpu_s, on_gpu, baseline_gpu_s)
    if judged.reason != result.reason:  # the whole verdict, figures included, where the row's cut one points
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"\nharness: {judged.reason}\n")
    trained = Trained(cfg, worktree, log_path, space, base, choice, judged, False, testing, gpu)
    if trained.scored:  # from git, while the slot's worktree is still this job's
        with Worktree(worktree) as wt:
            trained.at_base = wt.head() == base
        if cfg.evaluate_command:
            materialise(worktree, base, cfg.protected, space.evaluator)
        if testing:
            materialise(worktree, base, cfg.protected, space.tester)
    return trained


def finish(trained: Trained | TrainResult, cancel: threading.Event | None = None,
           overlap_s: float = 0.0, beside: bool = False) -> TrainResult:
    """The evaluation half: evaluate_command (and test_command for a test job) on what the job
    left; the job's folders removed after. overlap_s: how much longer the evaluation may take
    because training jobs may run beside it (local.py lets the next job train meanwhile); beside:
    one does now, so the scorers yield the CPU to it (EVAL_NICE)."""
    if isinstance(trained, TrainResult):
        return trained
    t, result = trained, trained.result
    try:
        if t.cfg.evaluate_command and result.status == "ok":
            result = evaluate(t, cancel, overlap_s, beside)
        if t.testing and result.status == "ok":
            result = replace(result, test_metrics=score_test(t, cancel, overlap_s, beside))
    finally:
        shutil.rmtree(t.space.root, ignore_errors=True)  # the saved model can be large; the logs stay
    return result


def shown_data(cfg: RunConfig) -> list[Path]:
    """The folders outside the repo the workload names for its job to read (`data_paths`, ~
    expanded), read-only; one that does not exist is not shown (the job's own error names it)."""
    return [Path(os.path.expanduser(p)).resolve() for p in cfg.data_paths]


# A path the job failed to open: Python's FileNotFoundError, or a C library's "PATH: No such file"
MISSING_RE = re.compile(r"No such file or directory: '(/[^'\n]+)'|(/[^\s:'\"]+): No such file or directory")


def unseen_hint(reason: str, log_path: Path, cfg: RunConfig) -> str:
    """A crash on a file that exists on this machine but outside the sandbox's view (data a
    prepare.py cached in the home, say) says what to change, not only the traceback's last line."""
    for match in MISSING_RE.finditer(tail(log_path, RESULT_TAIL_BYTES)):
        path = Path(match.group(1) or match.group(2))
        kept = (cfg.repo, cfg.run_dir, view.data_cache())  # what the job is denied on purpose
        if path.exists() and not any(path.is_relative_to(k) for k in kept):
            folder = path if path.is_dir() else path.parent
            hint = (f"the job cannot see {path}: the sandbox shows it only the worktree, its interpreter "
                    f"and the system; add its folder to data_paths in the repo's settings "
                    f"(data_paths = [\"{folder}\"]) to show it read-only")
            return f"{reason}; {hint}" if reason else hint
    return reason


MAX_JOB_FILE_BYTES = 1 << 20  # a job's result file is a few hundred bytes


def copy_job_file(src: Path, dest: Path) -> None:
    """Copy a file the job wrote, outside the sandbox: a regular file only (a symlink the job
    planted would make the harness read whatever it points at), and a small one."""
    try:
        if src.is_symlink() or not src.is_file() or src.stat().st_size > MAX_JOB_FILE_BYTES:
            return
        shutil.copyfile(src, dest)
    except OSError:
        return


def job_outcome(result: TrainResult, log_path: Path) -> TrainResult:
    """With a separate evaluation the job only has to exit cleanly: its printed figures are a log."""
    refused = _read(log_path.with_suffix(".result.json")) or {}
    if "refused" in refused:  # the workload's own code refused to go on (prepare.py's checks)
        return replace(result, status="invalid", reason=f"prepare.py refused: {str(refused['refused'])[:400]}")
    if result.status in ("timeout", "invalid"):  # the deadline, or a bound (limits.py) the job ran into
        return result
    text = tail(log_path, RESULT_TAIL_BYTES)  # never the whole log: a flood makes it large
    if result.returncode not in (0, None):  # its last words, but never a figure it printed (`val_bpb: 0.0001`)
        last = next((line.strip() for line in reversed(text.splitlines())
                     if line.strip() and line.strip() != "---" and not SUMMARY_LINE_RE.match(line.strip())), "")
        if last and ":" not in result.reason:  # a SystemExit message is no "...Error" line
            return replace(result, reason=f"{result.reason}: {last[:300]}")
        return result
    if re.search(r"^FAIL\b", text, re.M):
        return replace(result, status="crash", reason="the job printed FAIL")
    return replace(result, status="ok", reason="")


def within_budget(cfg: RunConfig, result: TrainResult, allowance_s: float | None, baseline_cpu_s: float | None = None,
                  gpu: bool = False, baseline_gpu_s: float | None = None) -> TrainResult:
    """Judged by the start-up allowance and CPU rate the supervisor measured on the baseline
    (budget.py). A baseline run (allowance None) is not judged: the supervisor calibrates on its
    result. A job let off for a busy machine keeps its reason, and the run's events say so."""
    if result.status != "ok" or allowance_s is None:
        return result
    reported = budget.reported_seconds(result.metrics)
    verdict = budget.judge(result.train_s, cfg.time_budget, allowance_s, reported, budget.Usage.of(result, gpu),
                           baseline_cpu_s, baseline_gpu_s)
    if verdict.ok and verdict.reason:
        events.record(cfg.run_dir, "loaded_machine", verdict.reason)
        return replace(result, reason=verdict.reason)
    return result if verdict.ok else replace(result, status="invalid", reason=verdict.reason)


def has_gpu(visible: str | None) -> bool:
    """Could the job use a GPU: an NVIDIA device node here and CUDA_VISIBLE_DEVICES (the slot's,
    else inherited) not empty. Such a job's work is not CPU time (budget.py)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return any(Path("/dev").glob("nvidia[0-9]*"))


# ---------------------------------------------------------------------------
# The baseline's protected files, and what runs from them


def materialise(worktree: Path, commit: str, protected: tuple[str, ...], dest: Path) -> list[str]:
    """The protected files as committed at commit (from git's objects, not the worktree) in dest."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with Worktree(worktree) as wt:
        return wt.export(commit, protected, dest)


def harness_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a harness-side command: the harness's own, without job variables."""
    env = seal.job_env(training_env(dict(os.environ), {}), seal.Channel(None))
    for key in JOB_ONLY_ENV:
        env.pop(key, None)
    env.update(SANDBOX_ENV)
    env.update(extra)
    return env


EVAL_NICE = 10  # the scorers' niceness: on a CPU they take what the training job beside them leaves
EVAL_GPU_MEMORY_FRACTION = 0.1  # of the slot's GPU a scorer may allocate (HARNESS_GPU_MEMORY_FRACTION)


def evaluate(t: Trained, cancel: threading.Event | None = None, overlap_s: float = 0.0,
             beside: bool = False) -> TrainResult:
    """Run evaluate_command from the baseline's files on what the job left; its result is the metric.

    It has its own deadline (limits.eval_deadline, longer by overlap_s), bounds (limits.of) and
    the job's cancel event; a failed evaluation's row carries no figure of the job's metric."""
    cfg, job, space = t.cfg, t.result, t.space
    eval_log = t.log_path.with_suffix(".eval.log")
    done, figures, why = run_scorer(t, cfg.evaluate_command, eval_log, (space.evaluator, space.eval_tmp,
                                                                         space.eval_out), t.at_base, cancel, overlap_s, beside)
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
        limits.calibrate_eval(state_dir(cfg, t.log_path), t.base, done.train_s)
    metrics = {**logged, **{k: float(v) for k, v in figures.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)}}
    return replace(job, status="ok", metrics=metrics, sealed=True, reason="")


def run_scorer(t: Trained, command: str, scorer_log: Path, folders: tuple[Path, Path, Path], at_base: bool,
               cancel: threading.Event | None, overlap_s: float = 0.0,
               beside: bool = False) -> tuple[TrainResult, dict | None, str]:
    """Run a scorer (evaluate_command, test_command) from the baseline's protected files (written
    from git by train_job) in its own sandbox, the job's output folder read-only; (how it ended, its
    result file, what its deadline is). folders: its copy of the baseline's files, its private /tmp,
    its result folder. It sees nothing of the slot's worktree (where the next job may train now) nor
    of any other job's folders: the run folder is hidden, and only its own folders are shown. With a
    training job beside it (beside) it runs at a lower CPU priority (EVAL_NICE); on a GPU, always
    within EVAL_GPU_MEMORY_FRACTION of it."""
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
    nice = shutil.which("nice") if beside else None

    def wrap(argv: list[str]) -> list[str]:
        argv = sandboxed(argv) if sandboxed is not None else argv
        return [nice, "-n", str(EVAL_NICE), *argv] if nice else argv
    where = state_dir(cfg, t.log_path)
    deadline_s, why = limits.eval_deadline(cfg.eval_kill_after, where, t.base, at_base)
    if overlap_s and cfg.eval_kill_after is None:
        deadline_s, why = deadline_s + overlap_s, f"{why}, and {overlap_s:.0f}s for the training beside it"
    bounds = limits.of(cfg, where).watching(private_tmp=tmp, output_folder=out)
    done = run_training(command, files, env, scorer_log, cfg.metric, kill_after_s=deadline_s,
                        wrap=wrap, cancel=cancel, limits=bounds)
    return done, _read(result_file), why


def score_test(t: Trained, cancel: threading.Event | None = None, overlap_s: float = 0.0,
               beside: bool = False) -> dict[str, Any]:
    """test_command on the model the job left: {metric: figure} (finite), or {"error": why}. Its own
    log (`.test.log`); the job's code never runs in it, and nothing it says decides anything."""
    cfg, space = t.cfg, t.space
    test_log = t.log_path.with_suffix(".test.log")
    done, figures, why = run_scorer(t, str(cfg.test_command), test_log, (space.tester, space.test_tmp,
                                                                          space.test_out), False, cancel, overlap_s, beside)
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


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
