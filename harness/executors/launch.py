"""How a training job starts: its environment, its sandbox (the view and the mounts) and its bounds.

`launch` builds them for one job, from the run's settings and the slot it has; a cold start runs
the command with them (runner.run_training), a warm one (warm.py) is used only when the interpreter
waiting for the job was started with exactly these. The helpers here are shared with the
evaluation, the training-data export and the setup command: which paths a sandboxed job never sees,
the wrapper that puts a command under bwrap, a harness-side command's environment.
"""
from __future__ import annotations

import os
import shlex
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import RunConfig
from ..integrity import seal
from ..ledger import events
from ..workload.runner import TrainResult, training_env
from . import limits, sandbox, traindata, uvenv, view

# A job without network: libraries that fetch from the Hugging Face hub take what is in their cache
# (shown through data_paths) at once, instead of trying the network first.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1"}
# Caches that tools write under $HOME, sent to the private /tmp (the home is not in the sandbox's view).
SANDBOX_ENV = {"TMPDIR": "/tmp", "TRITON_HOME": "/tmp", "TRITON_CACHE_DIR": "/tmp/.triton",
               "TORCHINDUCTOR_CACHE_DIR": "/tmp/.inductor", "CUDA_CACHE_PATH": "/tmp/.nv", "MPLCONFIGDIR": "/tmp/.mpl"}


JOB_ONLY_ENV = ("HARNESS_DATA_DIR", "HARNESS_MAX_STEPS", "HARNESS_SEED", "HARNESS_TIME_BUDGET")  # not for evaluations



def state_dir(cfg: RunConfig, log_path: Path) -> Path:
    """The run folder, or (for `harness check`'s throwaway runs) the log's folder."""
    return cfg.run_dir if cfg.run_dir.exists() else log_path.parent


@dataclass
class Launch:
    """One job's start: what a cold start runs its command with, and what a warm interpreter must
    have been started with to take the job (warm.py)."""
    env: dict[str, str]  # the job's environment, before the seal channel's variables
    wrap: Callable[[list[str]], list[str]] | None  # the sandbox (None: unsandboxed)
    bounds: limits.Limits
    on_gpu: bool  # the job may use a GPU (its time is NVML's, not the CPU's: integrity/budget.py)
    legacy_seal: bool  # the job's figures are sealed by a key only this job gets (no evaluate_command)
    testing: bool  # a test job: test_command scores it too

    def environ(self, ch: seal.Channel | None = None) -> dict[str, str]:
        return seal.job_env(self.env, ch or seal.Channel(None))


def launch(cfg: RunConfig, worktree: Path, space, base: str, choice: sandbox.Choice, seed: int, result_file: Path,
           cancel: threading.Event | None = None, gpu: str | None = None, job_env: dict[str, str] | None = None,
           protected_sha256: dict[str, str] | None = None) -> Launch | TrainResult:
    """The job's start in worktree with its folders (evaluation.Space) on the slot's gpu; a
    TrainResult (crash) when it cannot start: the training split's export or the uv environment failed."""
    worktree = Path(worktree)
    where = state_dir(cfg, result_file)
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
        data_dir = traindata.export(cfg, worktree, where, base, choice, result_file, cancel, protected_sha256)
        if isinstance(data_dir, TrainResult):
            return data_dir
        extra["HARNESS_DATA_DIR"] = str(data_dir)
        readonly.append(data_dir)
    if uvenv.is_uv(cfg.train_command):  # `uv run`: the run's environment, built once, read-only
        uv = uvenv.prepare(cfg.setup_command, worktree, where, lambda **kw: wrapper(choice, worktree=worktree, **kw),
                           harness_env({}), cfg.setup_timeout, cancel)
        if isinstance(uv, TrainResult):
            return uv
        extra.update(uv.env, UV_CACHE_DIR="/tmp/.uv-cache" if choice.on else str(space.tmp / ".uv-cache"))
        readonly += list(uv.readonly)
    readonly += shown_data(cfg)
    if choice.on:
        extra.update(SANDBOX_ENV, HARNESS_RESULT_FILE=str(space.out / "result.json"))
        if not cfg.network:  # the Hugging Face hub's libraries (karpathy's `kernels`) read their cache only
            extra.update(OFFLINE_ENV)
    wrap = wrapper(choice, worktree=worktree, tmp_dir=space.tmp, output_dir=space.out, readonly=readonly,
                   hidden=hidden_paths(cfg, worktree, bool(cfg.train_data_command)), network=cfg.network)
    bounds = limits.of(cfg, where).watching(private_tmp=space.tmp, output_folder=space.out, worktree=worktree)
    legacy_seal = not cfg.evaluate_command and seal.enabled(cfg.sealed, worktree, cfg.protected)
    return Launch(training_env(dict(os.environ), extra), wrap, bounds, on_gpu, legacy_seal, testing)


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


def shown_data(cfg: RunConfig) -> list[Path]:
    """The folders outside the repo the workload names for its job to read (`data_paths`, ~
    expanded), read-only; one that does not exist is not shown (the job's own error names it)."""
    return [Path(os.path.expanduser(p)).resolve() for p in cfg.data_paths]


def has_gpu(visible: str | None) -> bool:
    """Could the job use a GPU: an NVIDIA device node here and CUDA_VISIBLE_DEVICES (the slot's,
    else inherited) not empty. Such a job's work is not CPU time (integrity/budget.py)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return any(Path("/dev").glob("nvidia[0-9]*"))


def harness_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a harness-side command: the harness's own, without job variables."""
    env = seal.job_env(training_env(dict(os.environ), {}), seal.Channel(None))
    for key in JOB_ONLY_ENV:
        env.pop(key, None)
    env.update(SANDBOX_ENV)
    env.update(extra)
    return env
