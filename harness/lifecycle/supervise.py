"""One supervisor for every child process of a run: training jobs, researcher CLIs, re-runs.

Every child is started through `spawn`, which
- writes a record under `runs/<tag>/procs/` (write-and-rename, fsynced) BEFORE the process exists,
- starts the process in its own session (process group) with two variables in its environment:
  `HARNESS_PROC` (the record's token) and `HARNESS_SUPERVISOR` (the run folder), which every
  descendant inherits, so a child is findable in /proc from the moment it is exec'd, even if the
  supervisor dies before it learns the pid,
- and `stop` kills the whole group (SIGTERM, then SIGKILL after a grace period) plus any
  descendant that left the group (setsid) but still carries the token; the record is removed only
  once nothing of it is alive.

`reap(run_dir)` - on --resume and on the way out - stops every process that belongs to the run
(by record, by token, or by `HARNESS_SUPERVISOR` in its environment) and was not started by this
supervisor process, wherever in the run it worked (worktrees, lanes, scratch folders).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import psutil

from ..ledger import atomic

TOKEN_VAR = "HARNESS_PROC"
RUN_VAR = "HARNESS_SUPERVISOR"
OWNER_VAR = "HARNESS_SUPERVISOR_PID"
TERM_GRACE_S = 5.0  # s between SIGTERM and SIGKILL
KILL_WAIT_S = 5.0  # s to wait for SIGKILLed processes to disappear
POLL_S = 0.05


# ---------------------------------------------------------------------------
# the process table (psutil)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, pgid) of a process, or None when it is gone."""
    try:
        return psutil.Process(pid).status(), os.getpgid(pid)
    except (psutil.Error, OSError):
        return None


def _environ(pid: int) -> dict[str, str]:
    """The harness's marks in a process's environment ({} when it is gone or not ours to read)."""
    try:
        env = psutil.Process(pid).environ()
    except (psutil.Error, OSError):
        return {}
    return {k: env[k] for k in (TOKEN_VAR, RUN_VAR, OWNER_VAR) if k in env}


def alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] != psutil.STATUS_ZOMBIE


def started_after_now() -> float:
    """A bound for `members(since=...)`, taken just before a process is started: every process it
    starts, and theirs, starts after it (psutil's create_time: the boot time plus the process's
    start on the boot clock, which no change of the wall clock moves; a second of margin for the
    clock's ticks)."""
    return psutil.boot_time() + time.clock_gettime(time.CLOCK_BOOTTIME) - 1.0


def members(pgid: int | None = None, token: str | None = None, run_dir: str | None = None,
            not_owner: int | None = None, since: float | None = None) -> list[int]:
    """Live processes in group pgid, or carrying token, or belonging to run_dir (and not to the
    supervisor not_owner). since (started_after_now() before token's first process started): a
    process that started earlier cannot carry the token, and its environment is not read. On a
    machine of hundreds of processes that read was most of each job's and each researcher call's
    stop: every process's environment, twice."""
    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["status", "create_time"]):  # psutil keeps a table of the processes it has seen
        pid, status, created = proc.pid, proc.info["status"], proc.info["create_time"]
        if pid == me or status in (None, psutil.STATUS_ZOMBIE):
            continue
        try:
            group = os.getpgid(pid)
        except OSError:
            continue
        if pgid is not None and group == pgid:
            found.append(pid)
            continue
        if token is None and run_dir is None:
            continue
        if run_dir is None and since is not None and created is not None and created < since:
            continue
        env = _environ(pid)
        if token is not None and env.get(TOKEN_VAR) == token:
            found.append(pid)
        elif run_dir is not None and env.get(RUN_VAR) == run_dir and env.get(OWNER_VAR) != str(not_owner):
            found.append(pid)
    return found


def wait_exit(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait up to timeout seconds for proc to exit; True once it has (and is reaped). Wakes the
    moment it exits, through a pidfd (Linux 5.3+), where Popen.wait(timeout) polls with sleeps of
    up to 50 ms: on every job's and every researcher call's critical path, that was up to 50 ms
    (25 on average) between a process's end and the harness noticing it."""
    if proc.poll() is not None:
        return True
    try:
        fd = os.pidfd_open(proc.pid)  # not reaped yet (poll said so, and only proc reaps it)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:  # poll, not select: a supervisor with many open files (Ray's sockets) may hold fds over 1024
        waiter = select.poll()
        waiter.register(fd, select.POLLIN)
        waiter.poll(max(0, math.ceil(timeout * 1000)))
    finally:
        os.close(fd)
    return proc.poll() is not None


def _kill_all(pids_fn, grace_s: float) -> int:
    """SIGTERM what pids_fn() finds, wait up to grace_s, then SIGKILL what is left; how many it found."""
    return _kill_left(pids_fn, grace_s)[0]


def _kill_left(pids_fn, grace_s: float) -> tuple[int, list[int]]:
    """_kill_all, and what its last look still found (empty: nothing is left)."""
    first = pids_fn()
    if not first:
        return 0, []
    left = first
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        for pid in pids_fn():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        until = time.monotonic() + wait_s
        while time.monotonic() < until and pids_fn():
            time.sleep(POLL_S)
        left = pids_fn()
        if not left:
            break
    return len(first), left


def kill(proc: subprocess.Popen, grace_s: float = TERM_GRACE_S) -> bool:
    """SIGTERM proc's group, SIGKILL after grace_s; then whatever of its group or token is left.
    True when the last look found nothing of it alive."""
    token, since = getattr(proc, "harness_token", None), getattr(proc, "harness_since", None)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    if proc.poll() is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the leader is gone: children that ignored SIGTERM
    _, left = _kill_left(lambda: members(pgid=proc.pid, token=token, since=since), grace_s=0.5)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_WAIT_S)
    return not left


# ---------------------------------------------------------------------------
# Records


def _write_json(path: Path, data: dict[str, Any]) -> None:
    atomic.atomic_write(path, json.dumps(data))


class Supervisor:
    """The children of one run (or one A/B comparison): started, tracked on disk, stopped."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir).resolve()
        self.dir = self.run_dir / "procs"
        self.lock = threading.Lock()
        self.live: dict[str, subprocess.Popen] = {}  # token -> process
        self.closed = False

    def env(self, env: dict[str, str] | None, token: str) -> dict[str, str]:
        out = dict(os.environ if env is None else env)
        out.update({TOKEN_VAR: token, RUN_VAR: str(self.run_dir), OWNER_VAR: str(os.getpid())})
        return out

    def spawn(self, name: str, argv: list[str], **popen: Any) -> subprocess.Popen:
        """Popen(argv) in its own session, recorded on disk before it starts. Raises OSError as Popen does."""
        token = uuid.uuid4().hex
        self.dir.mkdir(parents=True, exist_ok=True)
        record = self.dir / f"{token}.json"
        data = {"name": name, "token": token, "argv": argv[:6], "supervisor": os.getpid(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        with self.lock:
            if self.closed:
                raise OSError("the run is stopping: no new process is started")
            _write_json(record, data)
        popen["env"] = self.env(popen.get("env"), token)
        since = started_after_now()
        try:
            proc = subprocess.Popen(argv, start_new_session=True, **popen)
        except BaseException:
            record.unlink(missing_ok=True)
            raise
        data["pgid"] = proc.pid
        _write_json(record, data)
        proc.harness_token = token  # type: ignore[attr-defined]
        proc.harness_since = since  # type: ignore[attr-defined]
        with self.lock:
            self.live[token] = proc
        return proc

    def stop(self, proc: subprocess.Popen, grace_s: float = TERM_GRACE_S) -> None:
        """Kill proc's whole group and every descendant carrying its token; then forget it (kill's
        last look found nothing of it: no second look)."""
        self.forget(proc, gone=kill(proc, grace_s))

    def forget(self, proc: subprocess.Popen, gone: bool = False) -> None:
        """Drop proc's record: only once nothing of it is alive (gone: the caller just looked)."""
        token = getattr(proc, "harness_token", None)
        if token is None or (not gone and members(pgid=proc.pid, token=token,
                                                  since=getattr(proc, "harness_since", None))):
            return
        with self.lock:
            self.live.pop(token, None)
        (self.dir / f"{token}.json").unlink(missing_ok=True)

    def stop_all(self) -> None:
        """On the way out (any stop): no new process, every live one killed. Idempotent."""
        with self.lock:
            self.closed = True
            live = list(self.live.values())
        for proc in live:
            self.stop(proc, grace_s=2.0)


def reap(run_dir: Path) -> list[str]:
    """Stop every process of the run that an earlier supervisor left behind; what was stopped."""
    run_dir = Path(run_dir).resolve()
    stopped = []
    folder = run_dir / "procs"
    for record in sorted(folder.glob("*.json")) if folder.exists() else []:
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            record.unlink(missing_ok=True)
            continue
        if data.get("supervisor") == os.getpid():
            continue
        pgid, token = data.get("pgid"), data.get("token")
        n = _kill_all(lambda: members(pgid=pgid, token=token), grace_s=2.0)
        if n:
            stopped.append(f"{data.get('name', '?')}: {n} process(es) of group {pgid}")
        record.unlink(missing_ok=True)
    for tmp in folder.glob("*.tmp") if folder.exists() else []:
        tmp.unlink(missing_ok=True)
    # Anything else of this run's that no record names (a record lost with a full disk).
    n = _kill_all(lambda: members(run_dir=str(run_dir), not_owner=os.getpid()), grace_s=2.0)
    if n:
        stopped.append(f"{n} unrecorded process(es) of the run")
    return stopped


# ---------------------------------------------------------------------------
# The active supervisor: the driver sets it once; the runner and the CLI researchers use it.

_active: list[Supervisor] = []


def current() -> Supervisor | None:
    return _active[-1] if _active else None


@contextlib.contextmanager
def active(run_dir: Path) -> Iterator[Supervisor]:
    """Make a supervisor for run_dir the one every spawn uses; on exit (any exit), stop its children."""
    sup = Supervisor(run_dir)
    _active.append(sup)
    try:
        yield sup
    finally:
        sup.stop_all()
        _active.remove(sup)


def spawn(name: str, argv: list[str], **popen: Any) -> subprocess.Popen:
    """Through the active supervisor, or (no run: `harness init`, tests) a plain own-session Popen."""
    sup = current()
    if sup is not None:
        return sup.spawn(name, argv, **popen)
    proc = subprocess.Popen(argv, start_new_session=True, **popen)
    return proc


def stop(proc: subprocess.Popen, grace_s: float = TERM_GRACE_S) -> None:
    sup = current()
    if sup is not None and getattr(proc, "harness_token", None):
        sup.stop(proc, grace_s)
    else:
        kill(proc, grace_s)
