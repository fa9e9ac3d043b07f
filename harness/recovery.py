"""Jobs a killed supervisor leaves behind: found and stopped on resume.

Training jobs and CLI researchers run in their own process groups (so a deadline can kill
grandchildren). If the supervisor itself is SIGKILLed, nobody kills them: a training job
would hold the GPU and write into the worktree while the resumed run uses it. So each
group's id is written next to its log (`<log>.pid`) while it runs, and on resume every
group still alive whose processes work inside the run's worktree is killed.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from pathlib import Path
from typing import Iterator

from .errors import RepoError

LOCK_NAME = "supervisor.lock"


def pid_file(log_path: Path) -> Path:
    return log_path.with_name(log_path.name + ".pid")


def track(log_path: Path, pgid: int) -> None:
    try:
        pid_file(log_path).write_text(str(pgid))
    except OSError:
        pass  # bookkeeping only: never fail a run over it


def untrack(log_path: Path) -> None:
    pid_file(log_path).unlink(missing_ok=True)


def group_members(pgid: int) -> list[int]:
    """Live processes in process group pgid (Linux /proc; empty elsewhere)."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _inside(pid: int, root: Path) -> bool:
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd")).resolve()
    except OSError:
        return False
    return cwd == root or root in cwd.parents


def reap(logs_dir: Path, worktree: Path) -> list[str]:
    """Kill the leftover groups recorded under logs_dir; return what was killed, for the events."""
    killed = []
    root = Path(worktree).resolve()
    for file in sorted(Path(logs_dir).glob("*.pid")):
        try:
            pgid = int(file.read_text().strip())
        except (OSError, ValueError):
            file.unlink(missing_ok=True)
            continue
        members = [p for p in group_members(pgid) if _inside(p, root)]
        if members:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(pgid, sig)
                except (ProcessLookupError, PermissionError):
                    break
                deadline = time.monotonic() + 2.0
                while time.monotonic() < deadline and group_members(pgid):
                    time.sleep(0.05)
            killed.append(f"{file.name[:-4]}: process group {pgid} ({len(members)} process(es))")
        file.unlink(missing_ok=True)
    return killed


def on_resume(run_dir: Path, logs_dir: Path, worktree: Path) -> None:
    """Before a resumed run touches its worktree: stop what the killed supervisor left running."""
    from . import events
    for what in reap(logs_dir, worktree):
        events.record(run_dir, "orphan_killed", f"stopped a job left running by the previous supervisor ({what})")


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
