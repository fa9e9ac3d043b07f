"""A uv project's environment for sandboxed jobs: built once per run, outside the worktree, read-only.

karpathy/autoresearch trains with `uv run train.py`. In the sandbox the home folder does not exist
and the worktree has no `.venv` (it is untracked in the user's checkout), so uv would try to build
an environment, fail on a read-only cache, or reach for the network. Instead, before the run's
first job, the project's environment is made once in the run folder (`runs/<tag>/uv/venv`) by the
run's `setup_command` (default `uv sync --frozen`), in the sandbox with the network allowed and
the user's uv cache writable (downloads are reused). Each job then gets that environment
read-only (`UV_PROJECT_ENVIRONMENT`) with `UV_NO_SYNC`, `UV_FROZEN` and `UV_OFFLINE`, so `uv run`
only starts the environment's Python, and a private uv cache under its /tmp.

The environment is keyed by the baseline's `pyproject.toml` and `uv.lock` (their sha256): a run
whose lock did not change reuses it across --resume.
"""
from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..workload.runner import TrainResult, run_training, tail
from . import view

DEFAULT_SETUP = "uv sync --frozen"
LOCK_FILES = ("pyproject.toml", "uv.lock")
CACHE_QUERY_TIMEOUT_S = 30.0  # s for `uv cache dir`
INSTALL_HINT = "install uv (`pip install uv`, or see https://docs.astral.sh/uv/getting-started/installation/)"
_LOCK = threading.Lock()  # two slots' first jobs would both build the environment


@dataclass(frozen=True)
class UvEnv:
    venv: Path | None  # None: a script run with no project (uv's own pick of a Python)
    env: dict[str, str] = field(default_factory=dict)  # the job's variables
    readonly: tuple[Path, ...] = ()  # what the job must see to run it


def is_uv(command: str) -> bool:
    """`uv run ...` (after `env A=1`, if any)."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return False
    while argv and (Path(argv[0]).name == "env" or "=" in argv[0]):
        argv = argv[1:]
    return len(argv) >= 2 and Path(argv[0]).name == "uv" and "run" in argv[1:3]


def key(worktree: Path) -> str:
    digest = hashlib.sha256()
    for name in LOCK_FILES:
        path = Path(worktree) / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"-") + b"\0")
    return digest.hexdigest()[:16]


def venv_path(where: Path, worktree: Path) -> Path:
    """Where the run's environment for this lock lives (the run folder: never seen by a researcher)."""
    return Path(where) / "uv" / key(worktree) / "venv"


def user_cache() -> Path | None:
    """uv's own cache folder (where it keeps downloads), or None when uv does not say."""
    uv = shutil.which("uv")
    if uv is None:
        return None
    try:
        out = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True, timeout=CACHE_QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = out.stdout.strip()
    return Path(path) if out.returncode == 0 and path else None


def pythons(worktree: Path, env: dict[str, str]) -> list[Path]:
    """What the setup must see to make the environment: the Python uv picks for the project (its
    .python-version and requires-python) and uv's own managed Pythons."""
    uv = shutil.which("uv")
    shown: list[Path] = []
    for args in (["python", "find"], ["python", "dir"]):
        try:
            out = subprocess.run([uv, *args], cwd=worktree, env=env, capture_output=True, text=True,
                                 timeout=CACHE_QUERY_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            continue
        path = out.stdout.strip()
        if out.returncode != 0 or not path:
            continue
        if args[1] == "dir":
            shown.append(Path(path))
            continue
        try:
            shown += [Path(r) for r in view.interpreter([path]).roots] + [Path(path)]
        except view.ViewError:
            continue
    return shown


def prepare(setup_command: str | None, worktree: Path, where: Path, wrapper, env: dict[str, str],
            timeout_s: float, cancel=None) -> UvEnv | TrainResult:
    """The run's uv environment, built on first use (a `crash` that says what to do when it cannot be).

    wrapper(tmp_dir=..., readonly=..., writable=..., network=True) -> a wrap function, or None (no sandbox).
    The job's UV_CACHE_DIR is for the caller to set (its private /tmp)."""
    if shutil.which("uv") is None:
        return TrainResult("crash", reason=f"train_command runs uv, which is not installed: {INSTALL_HINT}")
    if not (Path(worktree) / "pyproject.toml").is_file():  # a script, not a project: uv picks a Python
        return UvEnv(None, {"UV_OFFLINE": "1", "UV_PYTHON_DOWNLOADS": "never"}, tuple(pythons(worktree, env)))
    venv = venv_path(where, worktree)
    root = venv.parent
    with _LOCK:
        if not (root / ".done").exists():
            failed = _build(setup_command or DEFAULT_SETUP, worktree, root, venv, wrapper, env, timeout_s, cancel)
            if failed is not None:
                return failed
    try:
        roots = view.interpreter([str(venv / "bin" / "python")]).roots
    except view.ViewError as e:
        return TrainResult("crash", reason=f"the run's uv environment {venv} does not run: {e}")
    job_env = {"UV_PROJECT_ENVIRONMENT": str(venv), "UV_NO_SYNC": "1", "UV_FROZEN": "1", "UV_OFFLINE": "1",
               "UV_PYTHON_DOWNLOADS": "never"}
    return UvEnv(venv, job_env, (venv, *[Path(r) for r in roots]))


def _build(command: str, worktree: Path, root: Path, venv: Path, wrapper, env: dict[str, str],
           timeout_s: float, cancel) -> TrainResult | None:
    shutil.rmtree(root, ignore_errors=True)
    (root / "tmp").mkdir(parents=True)
    cache = user_cache() or root / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    setup_env = {**env, "UV_PROJECT_ENVIRONMENT": str(venv), "UV_CACHE_DIR": str(cache),
                 "UV_PYTHON_DOWNLOADS": "never"}
    wrap = wrapper(tmp_dir=root / "tmp", readonly=pythons(worktree, setup_env), writable=[root, cache],
                   network=True)
    log = root / "setup.log"
    done = run_training(command, worktree, setup_env, log, metric="-", kill_after_s=timeout_s, wrap=wrap,
                        cancel=cancel)
    if done.returncode != 0:
        return TrainResult("crash", reason=f"setup_command {command!r} failed ({done.reason or 'exit code'}; the "
                                           f"project's environment for `uv run`): {tail(log, 600)}")
    (root / ".done").write_text(command + "\n")
    return None
