"""What a killed supervisor leaves behind: its processes stopped on resume, one supervisor per run.

Every child process of a run is started through supervise.py, which records it under
`runs/<tag>/procs/` before it runs and marks its environment; `on_resume` stops whatever an
earlier supervisor of the same run left running (a training job would otherwise hold the GPU
and write into a worktree the resumed run uses). `supervisor_lock` keeps a second harness off a
run that is still being driven.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Iterator

from . import supervise
from ..errors import RepoError

LOCK_NAME = "supervisor.lock"


def on_resume(run_dir: Path) -> None:
    """Before a resumed run touches its worktrees: stop what the killed supervisor left running."""
    from ..ledger import events
    for what in supervise.reap(run_dir):
        events.record(run_dir, "orphan_killed", f"stopped a process left running by the previous supervisor ({what})")


@contextlib.contextmanager
def supervisor_lock(run_dir: Path) -> Iterator[None]:
    """One supervisor per run: a second `harness run --resume` (another tmux pane, a cron job)
    while the first still drives the run would kill its jobs as orphans and race it for the
    worktree. The lock is an flock on runs/<tag>/supervisor.lock, so the kernel lets go of it
    when its holder dies, however it dies: a resume after a SIGKILL is never refused.
    """
    run_dir = Path(run_dir)
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by training jobs (O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise RepoError(f"run {run_dir.name} is already being driven by another harness ({holder}). "
                        f"Stop that one first (Ctrl-C in its terminal) or wait for it to end; "
                        f"`harness status {run_dir.name}` shows where it is.") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode())
        yield
    finally:
        os.close(fd)
        if created and [p.name for p in run_dir.iterdir()] == [LOCK_NAME]:  # nothing came of it
            path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                run_dir.rmdir()
