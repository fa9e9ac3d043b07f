"""The one raw git call: `run_git`, with a timeout and the harness's settings over the user's.

The gitgate package is the only code that runs git; this is its plain half, without GitPython's
Repo (`gitgate/__init__.py` holds the verbs on a Repo). The package re-exports `run_git`, and
applies `harness_env` to its Repos.

Every git the harness starts:
- runs with `commit.gpgsign=false`, `tag.gpgsign=false` and `core.hooksPath=<an empty folder of
  the harness's own>` over the user's settings (GIT_CONFIG_COUNT/KEY_n/VALUE_n, which git reads
  after every config file): a signing prompt (pinentry) would hang the night, a failing gpg abort
  it, a pre-commit or commit-msg hook refuse a candidate or rewrite it. Everything else of the
  user's config holds (identity, attributes, filters, ...);
- has a deadline (`timeout_s`: GIT_TIMEOUT_S, or HARNESS_GIT_TIMEOUT_S from the environment):
  a git that hangs is killed with its process group and `GitTimeout` says which command, where,
  after how long, and what to do.
"""
from __future__ import annotations

import atexit
import os
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Sequence

from ..errors import HarnessError

GIT_TIMEOUT_S = 300.0  # a git command of the harness's that runs longer is hung (a prompt, a lock, a dead mount)
TIMEOUT_ENV = "HARNESS_GIT_TIMEOUT_S"
REAP_S = 5.0  # after the kill, how long to wait for the pipes to close


def timeout_s() -> float:
    """The deadline of one git command: HARNESS_GIT_TIMEOUT_S where set to a positive number, else GIT_TIMEOUT_S."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, "") or GIT_TIMEOUT_S)
    except ValueError:
        return GIT_TIMEOUT_S
    return value if value > 0 else GIT_TIMEOUT_S


class GitTimeout(HarnessError, subprocess.TimeoutExpired):
    """A git command of the harness's did not finish in time and was killed."""

    def __init__(self, argv: Sequence[Any], timeout: float, cwd: Any = None):
        subprocess.TimeoutExpired.__init__(self, list(argv), timeout)
        self.cwd = cwd
        HarnessError.__init__(self, self.message())

    def message(self) -> str:
        shown = " ".join(str(a) for a in self.cmd)
        where = f" in {self.cwd}" if self.cwd else ""
        return (f"`{shown}`{where} did not finish in {self.timeout:g}s and was killed. Something holds git up: "
                f"a prompt (credentials, a passphrase), a lock another git process holds, a slow or hung "
                f"filesystem. Run the command by hand there to see it; if the repository needs longer, set "
                f"{TIMEOUT_ENV} to more seconds. Then run the command again (a night: `harness run --resume`).")

    def __str__(self) -> str:
        return self.message()


class GitFailed(HarnessError, subprocess.CalledProcessError):
    """A git command of the harness's exited non-zero (run_git with check=True)."""

    def __init__(self, argv: Sequence[Any], returncode: int, stdout: Any, stderr: Any, cwd: Any = None):
        subprocess.CalledProcessError.__init__(self, returncode, list(argv), stdout, stderr)
        self.cwd = cwd
        HarnessError.__init__(self, str(self))

    def __str__(self) -> str:
        err = self.stderr.decode(errors="replace") if isinstance(self.stderr, bytes) else (self.stderr or "")
        where = f" in {self.cwd}" if self.cwd else ""
        return f"`{' '.join(str(a) for a in self.cmd)}`{where} failed (exit {self.returncode}): {err.strip()[:500]}"


_hooks: str | None = None
_hooks_lock = threading.Lock()


def hooks_dir() -> str:
    """An empty folder of this process's own for core.hooksPath: git finds no hook there (made once)."""
    global _hooks
    with _hooks_lock:
        if _hooks is None or not os.path.isdir(_hooks):
            try:
                _hooks = tempfile.mkdtemp(prefix="harness-nohooks-")
                atexit.register(_remove_hooks_dir, _hooks)
            except OSError:  # no writable temporary folder: a path git cannot open as a folder finds no hook either
                _hooks = os.devnull
        return _hooks


def _remove_hooks_dir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def settings() -> tuple[tuple[str, str], ...]:
    """The settings of the harness's git over the user's (see the module's doc)."""
    return (("commit.gpgsign", "false"), ("tag.gpgsign", "false"), ("core.hooksPath", hooks_dir()))


def harness_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The GIT_CONFIG_* variables that put settings() over the user's config, after any the
    environment (env, else os.environ) already has: only the added variables are returned."""
    source = os.environ if env is None else env
    try:
        base = int(source.get("GIT_CONFIG_COUNT", "0") or 0)
    except ValueError:
        base = 0
    pairs = settings()
    out = {"GIT_CONFIG_COUNT": str(base + len(pairs))}
    for i, (key, value) in enumerate(pairs, start=base):
        out[f"GIT_CONFIG_KEY_{i}"], out[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return out


def run_git(args: Sequence[Any], cwd: Path | str | None = None, *, timeout: float | None = None,
            check: bool = True, text: bool = True, input: Any = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`git *args` in cwd, output captured, under the harness's settings and a deadline (timeout,
    else timeout_s()). A hung git is killed with its process group: GitTimeout. check: a non-zero
    exit raises GitFailed (a CalledProcessError too)."""
    argv = ["git", *(str(a) for a in args)]
    limit = timeout if timeout is not None else timeout_s()
    full_env = dict(os.environ if env is None else env)
    full_env.update(harness_env(full_env))
    proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text, start_new_session=True)
    try:
        out, err = proc.communicate(input, timeout=limit)
    except subprocess.TimeoutExpired:
        kill_git(proc)
        raise GitTimeout(argv, limit, cwd) from None
    except BaseException:  # a Ctrl-C while git runs: git does not outlive the call
        kill_git(proc)
        raise
    if check and proc.returncode != 0:
        raise GitFailed(argv, proc.returncode, out, err, cwd)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def kill_git(proc: subprocess.Popen) -> None:
    """Kill a git started in a session of its own (start_new_session) with its process group, and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.communicate(timeout=REAP_S)
    except (subprocess.TimeoutExpired, ValueError, OSError):  # a child that left the group holds a pipe
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        try:
            proc.wait(timeout=REAP_S)
        except subprocess.TimeoutExpired:
            pass
