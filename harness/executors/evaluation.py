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
   its start (environment, view, bounds) built by launch.py, started cold or handed to the
   interpreter its slot readied for it (warm.py), timed by the harness and judged (integrity/budget.py);
4. protected files checked again, the budget judged, the scorers' copies of the baseline's
   files written from git;
5. with `evaluate_command`: the baseline's protected files are written from git into a folder
   the job never saw, and the command runs there, sandboxed, with the job's output folder
   read-only; its result file, in a folder only it can write, is the metric (`sealed` = yes;
   the scorers are scoring.py).
   Without one (a foreign workload): the printed block is the metric, `sealed` = no.
6. for a test job (cfg.score_test, testsplit.py) with `test_command`: the same, once more, from
   another fresh copy of the baseline's files, on the private test split; its figure is the
   result's `test_metrics`, which no decision reads.
"""
from __future__ import annotations

import re
import shutil
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..lifecycle import disk
from ..ledger import events
from ..integrity import budget, guard, seal
from ..config import RunConfig
from ..gitgate import Worktree
from ..workload.runner import RESULT_TAIL_BYTES, TrainResult, run_training, tail
from . import sandbox, scoring, view
from .launch import choose, launch, state_dir, unshowable

if TYPE_CHECKING:
    from .warm import Warm

SUMMARY_LINE_RE = re.compile(r"^\w+:\s*[-+0-9.eE]+$|^\w+:\s*(nan|inf)$", re.I)  # a `key: number` result line


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
    return make_space(log_path.with_suffix(".job"))


def make_space(root: Path) -> Space:
    """A job's folders under root, empty."""
    space = Space(root)
    shutil.rmtree(space.root, ignore_errors=True)
    for folder in (space.tmp, space.out, space.eval_tmp, space.eval_out, space.evaluator, space.test_tmp,
                   space.test_out, space.tester):
        folder.mkdir(parents=True)
    return space


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
              baseline_cpu_s: float | None = None, baseline_gpu_s: float | None = None,
              warm: "Warm | None" = None, on_start: Callable[[], None] | None = None) -> Trained | TrainResult:
    """The training half: the job sandboxed and timed, the protected files checked after it, the
    budget judged, the scorers' files written from git. A TrainResult when nothing is left to
    evaluate before anything trained (a refused baseline, a failed export); else a Trained.

    warm: an interpreter started for this slot's next job (warm.py), handed this job when it was
    started with this job's sandbox, bounds and environment, else discarded for a cold start;
    on_start: called once the job's process runs (the local executor starts the next warm one)."""
    worktree = Path(worktree)
    base = guard.baseline_commit(cfg.protected, worktree, baseline, protected_sha256 or {})
    if isinstance(base, TrainResult):
        return base
    result_file = log_path.with_suffix(".result.json")
    where = state_dir(cfg, log_path)
    choice = choose(cfg, where)
    space = warm.space if warm is not None else fresh_space(log_path)
    how = launch(cfg, worktree, space, base, choice, seed, result_file, cancel, gpu, job_env, protected_sha256)
    unfit = warm and ("its start failed" if isinstance(how, TrainResult) else warm.unfit(how, cfg.train_command))
    if unfit:  # not the job it was started for: a cold start
        warm.discard()
        events.record(where, "warm_start_unused", f"{log_path.stem} started cold: {unfit}")
        warm, space = None, fresh_space(log_path)
        how = launch(cfg, worktree, space, base, choice, seed, result_file, cancel, gpu, job_env, protected_sha256)
    if isinstance(how, TrainResult):
        log_path.write_text(how.reason + "\n")
        return how
    committed = guard.before_training(cfg.run_dir, worktree, cfg.protected, result_file)
    refused = unshowable(choice, cfg.train_command)
    if refused is not None:
        log_path.write_text(refused.reason + "\n")
        return refused
    started = warm.hand_over(how, cfg.train_command, log_path) if warm is not None else None
    if warm is not None and started is None:  # it died while it waited: a cold start, in a space of its own
        events.record(where, "warm_start_unused", f"{log_path.stem} started cold: {warm.why}")
        return train_job(cfg, worktree, log_path, seed, cancel, gpu, job_env, baseline, protected_sha256,
                         allowance_s, baseline_cpu_s, baseline_gpu_s, on_start=on_start)
    with seal.channel(how.legacy_seal) as ch:
        result = run_training(cfg.train_command, worktree, how.environ(ch), log_path, cfg.metric,
                              kill_after_s=cfg.kill_after, stall_after_s=cfg.stall_after_min * 60, pass_fds=ch.fds,
                              cancel=cancel, wrap=how.wrap, limits=warm.how.bounds if started else how.bounds,
                              gpu=how.on_gpu, started=started,
                              on_start=on_start)
    on_gpu, testing = how.on_gpu, how.testing
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
    result = guard.after_training(cfg.run_dir, worktree, result, committed)
    judged = budget.within(cfg, result, allowance_s, baseline_cpu_s, on_gpu, baseline_gpu_s)
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
           overlap_s: float = 0.0) -> TrainResult:
    """The evaluation half: evaluate_command (and test_command for a test job) on what the job
    left; the job's folders removed after. overlap_s: how much longer the evaluation may take
    because training jobs may run beside it (local.py lets the next job train meanwhile), which
    its idle scheduling class yields the CPU to (scoring.idle_prefix)."""
    if isinstance(trained, TrainResult):
        return trained
    t, result = trained, trained.result
    try:
        if t.cfg.evaluate_command and result.status == "ok":
            result = scoring.evaluate(t, cancel, overlap_s)
        if t.testing and result.status == "ok":
            result = replace(result, test_metrics=scoring.score_test(t, cancel, overlap_s))
    finally:
        shutil.rmtree(t.space.root, ignore_errors=True)  # the saved model can be large; the logs stay
    return result


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
    refused = scoring.read_json(log_path.with_suffix(".result.json")) or {}
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


# ---------------------------------------------------------------------------
# The baseline's protected files, and what runs from them


def materialise(worktree: Path, commit: str, protected: tuple[str, ...], dest: Path) -> list[str]:
    """The protected files as committed at commit (from git's objects, not the worktree) in dest."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with Worktree(worktree) as wt:
        return wt.export(commit, protected, dest)
