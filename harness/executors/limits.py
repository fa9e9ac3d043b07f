"""Bounds on what one job may spend (a training job, an evaluation, a training-data export).

- Memory and processes: a cgroup per job (v2 at /sys/fs/cgroup, or v1's `memory` and `pids`
  controllers), made before the child starts; a tiny /bin/sh wrapper writes its own pid into the
  cgroup and only then execs the command, so every descendant (the sandbox's included) is inside
  from its first instruction; removed after. Where no cgroup can be written (an unprivileged user
  without a delegated subtree), `prlimit` sets RLIMIT_NPROC instead (counted per user and user
  namespace, and not enforced for root) and memory is unbounded: RLIMIT_AS would refuse the huge
  address ranges CUDA reserves, so it is never used.
- Each file the job writes: RLIMIT_FSIZE at the disk bound (through `prlimit`).
- The folders bound into the sandbox (private /tmp, output folder, worktree) are host folders:
  `Watch` measures their growth every WATCH_EVERY_S from the runner's poll loop, and the runner
  kills the job's group when one is over the disk bound.
- The log: the job writes it (a file, so a job outlives a killed supervisor as before); the poll
  loop kills a job whose log is past the bound, and `trim_log` keeps its head and tail, the cut
  said in it, reading only the tail: neither the disk nor the supervisor grows with a flood.
Each bound has a default derived from the machine (`defaults`), a config key and a `harness run` flag.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import threading
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from ..lifecycle import supervise


MB = 1 << 20  # bytes
MEMORY_FRACTION = 0.5  # of MemTotal, per job: a runaway job leaves the machine (and its supervisor) alive
DEFAULT_PIDS = 4096  # processes and threads per job: data-loader workers and their threads use hundreds
DISK_FRACTION = 0.25  # of the free space where the run lives, per watched folder
DISK_CAP_MB = 50 * 1024  # MB: the disk bound's default never exceeds this, however large the disk
DEFAULT_LOG_MB = 128  # MB of log per job: a line per step for hours is far less; a flood is killed here
TAIL_BYTES = 1 * MB  # of a cut log's end, kept (the result block and the last error are there)
WATCH_EVERY_S = 2.0  # s between measurements of the watched folders
MAX_ENTRIES = 200_000  # files and folders a watched folder may hold: a million tiny files would stall the walk
CGROUP_ROOT = Path("/sys/fs/cgroup")
JOIN_SH = ('while [ "$1" != -- ]; do echo $$ > "$1" || { echo "harness: cannot join the cgroup $1" >&2; '
           'exit 125; }; shift; done; shift; exec "$@"')
FLAGS = {"memory": ("job_memory_mb", "--job-memory-mb"), "pids": ("job_pids", "--job-pids"),
         "disk": ("job_disk_mb", "--job-disk-mb"), "log": ("job_log_mb", "--job-log-mb")}


@dataclass(frozen=True)
class Limits:
    """One job's bounds; 0 = unbounded. watch: (label, folder) whose growth disk_mb bounds."""
    memory_mb: int = 0
    pids: int = 0
    disk_mb: int = 0
    log_mb: int = DEFAULT_LOG_MB
    watch: tuple[tuple[str, Path], ...] = ()
    disk_default: bool = False  # disk_mb is the machine's default (a share of the free disk: it drifts)

    def watching(self, **folders: Path) -> "Limits":
        return replace(self, watch=tuple((label.replace("_", " "), Path(p)) for label, p in folders.items()))


def raise_with(kind: str) -> str:
    key, flag = FLAGS[kind]
    return f"({key}; raise it with {flag})"


def mem_total_mb() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def defaults(where: Path) -> Limits:
    """The machine's defaults: half its memory, DEFAULT_PIDS, a quarter of the free disk (capped)."""
    try:
        free_mb = shutil.disk_usage(where if Path(where).exists() else "/").free // MB
    except OSError:
        free_mb = 0
    return Limits(memory_mb=int(mem_total_mb() * MEMORY_FRACTION), pids=DEFAULT_PIDS,
                  disk_mb=int(min(free_mb * DISK_FRACTION, DISK_CAP_MB)), log_mb=DEFAULT_LOG_MB)


def of(cfg, where: Path) -> Limits:
    """The run's bounds: each config key that is set (0 = unbounded), else the machine's default."""
    base = defaults(where)

    def pick(key: str, default: int) -> int:
        value = getattr(cfg, key, None)
        return default if value is None else int(value)
    return Limits(memory_mb=pick("job_memory_mb", base.memory_mb), pids=pick("job_pids", base.pids),
                  disk_mb=pick("job_disk_mb", base.disk_mb), log_mb=pick("job_log_mb", base.log_mb),
                  disk_default=getattr(cfg, "job_disk_mb", None) is None)


# ---------------------------------------------------------------------------
# cgroups


def _own_paths() -> dict[str, str]:
    """This process's cgroup per v1 controller (and "" for the v2 unified one)."""
    out = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                out[c] = path
    return out


def _make_dir(mount: Path, own: str, name: str) -> Path | None:
    """name under this process's own cgroup (nested bounds hold), else under the mount's root."""
    for parent in (mount / own.lstrip("/"), mount):
        with contextlib.suppress(OSError):
            path = parent / name
            path.mkdir()
            return path
    return None


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


def _counter(path: Path, key: str) -> int:
    """`key N` in a flat-keyed cgroup file (memory.events, pids.events, memory.oom_control)."""
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


def _number(path: Path) -> int:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().split()[0])
    return 0


STALE = re.compile(r"harness-(\d+)-[0-9a-f]{12}")  # Cgroup.make's names: the supervisor's PID
_swept = threading.Event()  # this process has removed the groups of dead supervisors once


def sweep_stale(own: dict[str, str]) -> list[Path]:
    """Remove the empty job cgroups of harness processes that are gone: a supervisor killed with
    SIGKILL never removes its jobs' groups (recovery stops their processes on --resume; the empty
    groups stayed, one per job, for good). Only where the PID in the name is no process now (a
    live one may be making its group this moment) and the group is empty (rmdir refuses one that
    is not). The folders removed."""
    removed = []
    mounts = [CGROUP_ROOT] if (CGROUP_ROOT / "cgroup.controllers").exists() else \
        [CGROUP_ROOT / c for c in ("memory", "pids", "cpuacct")]
    for mount in mounts:
        key = "" if mount == CGROUP_ROOT else mount.name
        for parent in {mount / own.get(key, "/").lstrip("/"), mount}:
            with contextlib.suppress(OSError):
                for entry in os.scandir(parent):
                    found = STALE.fullmatch(entry.name)
                    if found and entry.is_dir(follow_symlinks=False) and not supervise.alive(int(found.group(1))):
                        with contextlib.suppress(OSError):
                            os.rmdir(entry.path)
                            removed.append(Path(entry.path))
    return removed


class Cgroup:
    """One job's cgroup: dirs per controller ("memory", "pids"; v2: one dir for both)."""

    def __init__(self, version: int, dirs: dict[str, Path]):
        self.version, self.dirs = version, dirs

    @classmethod
    def make(cls, limits: Limits) -> "Cgroup | None":
        """The cgroup for limits' memory and pids bounds and for the job's CPU accounting (the
        budget's judge reads it: integrity/budget.py), or None where none can be made here."""
        name, own = f"harness-{os.getpid()}-{uuid.uuid4().hex[:12]}", _own_paths()
        if not _swept.is_set():  # once per process: what a killed predecessor left
            _swept.set()
            sweep_stale(own)
        if (CGROUP_ROOT / "cgroup.controllers").exists():
            group = cls._make_v2(name, own.get("", "/"), limits)
        else:
            group = cls._make_v1(name, own, limits)
        return group

    @classmethod
    def _make_v1(cls, name: str, own: dict[str, str], limits: Limits) -> "Cgroup | None":
        dirs: dict[str, Path] = {}
        for controller, wanted in (("memory", limits.memory_mb), ("pids", limits.pids), ("cpuacct", True)):
            mount = CGROUP_ROOT / controller
            if wanted and mount.is_dir():
                path = _make_dir(mount, own.get(controller, "/"), name)
                if path is not None:
                    dirs[controller] = path
        group = cls(1, dirs)
        ok = bool(dirs)
        if "memory" in dirs:
            ok &= _write(dirs["memory"] / "memory.limit_in_bytes", str(limits.memory_mb * MB))
            _write(dirs["memory"] / "memory.memsw.limit_in_bytes", str(limits.memory_mb * MB))  # no swap past it
        if "pids" in dirs:
            ok &= _write(dirs["pids"] / "pids.max", str(limits.pids))
        if not ok or not (limits.memory_mb or limits.pids) and "cpuacct" not in dirs:
            group.remove()
            return None
        return group

    @classmethod
    def _make_v2(cls, name: str, own: str, limits: Limits) -> "Cgroup | None":
        path = _make_dir(CGROUP_ROOT, own, name)
        if path is None:
            return None
        group = cls(2, {"memory": path, "pids": path, "cpuacct": path})  # cpu.stat is in every v2 cgroup
        enabled = (path / "cgroup.controllers").read_text().split() if path.exists() else []
        ok = all(c in enabled for c, wanted in (("memory", limits.memory_mb), ("pids", limits.pids)) if wanted)
        if ok and limits.memory_mb:
            ok = _write(path / "memory.max", str(limits.memory_mb * MB))
            _write(path / "memory.swap.max", "0")
        if ok and limits.pids:
            ok = _write(path / "pids.max", str(limits.pids))
        if not ok:  # controllers not delegated to this cgroup: the rlimit fallback
            group.remove()
            return None
        return group

    def cpu_seconds(self) -> float | None:
        """CPU seconds every process the cgroup ever held has used, by the kernel's accounting
        (a process the job left unreaped is counted too); None where the cgroup does not account."""
        path = self.dirs.get("cpuacct")
        if path is None:
            return None
        if self.version == 1:
            with contextlib.suppress(OSError, ValueError):
                return int((path / "cpuacct.usage").read_text().split()[0]) / 1e9
            return None
        usec = _counter(path / "cpu.stat", "usage_usec")
        return usec / 1e6 if (path / "cpu.stat").exists() else None

    def procs_files(self) -> list[str]:
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    def exceeded(self, limits: Limits) -> str | None:
        """Which bound the job ran into, from the kernel's own counters; None when none."""
        mem, pids = self.dirs.get("memory"), self.dirs.get("pids")
        if mem is not None:
            v1 = self.version == 1
            kills = _counter(mem / ("memory.oom_control" if v1 else "memory.events"), "oom_kill")
            peak = _number(mem / ("memory.max_usage_in_bytes" if v1 else "memory.peak"))
            if kills:
                return (f"it ran out of its {limits.memory_mb} MB memory bound (peak {peak // MB} MB, "
                        f"{kills} process(es) killed) {raise_with('memory')}")
        if pids is not None and _counter(pids / "pids.events", "max"):
            return f"it hit its bound of {limits.pids} processes and threads {raise_with('pids')}"
        return None

    def remove(self) -> None:
        """SIGKILL whatever is still inside (the cgroup holds every descendant, however it left the
        process group), then rmdir each dir (the kernel's files go with it)."""
        for path in set(self.dirs.values()):
            with contextlib.suppress(OSError, ValueError):
                for pid in (path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), signal.SIGKILL)
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    threading.Event().wait(0.05)


def prefix(limits: Limits, group: Cgroup | None) -> list[str]:
    """The argv before the command: join the cgroup, then the rlimits; [] when there is nothing."""
    out: list[str] = []
    if group is not None:
        out += ["/bin/sh", "-c", JOIN_SH, "harness-limits", *group.procs_files(), "--"]
    rlimits = []
    if limits.disk_mb:
        rlimits.append(f"--fsize={limits.disk_mb * MB}")
    if limits.pids and (group is None or "pids" not in group.dirs):
        rlimits.append(f"--nproc={limits.pids}")
    prlimit = shutil.which("prlimit")
    if rlimits and prlimit:
        out += [prlimit, *rlimits, "--"]
    return out


FILE_TOO_LARGE_RE = re.compile(r"\[Errno 27\]|File too large")  # EFBIG, as Python (which ignores SIGXFSZ) says it


def file_too_large(returncode: int | None, log_tail: str, limits: Limits) -> str | None:
    """The job wrote a file past RLIMIT_FSIZE: killed by SIGXFSZ (or the sandbox reporting it,
    128 + the signal), or its write failed with EFBIG and it said so."""
    if not limits.disk_mb:
        return None
    if returncode in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ) or FILE_TOO_LARGE_RE.search(log_tail):
        return f"it wrote a file larger than its {limits.disk_mb} MB disk bound {raise_with('disk')}"
    return None


# ---------------------------------------------------------------------------
# Disk: the watched folders' growth


def usage(folder: Path) -> tuple[int, int]:
    """(bytes on disk, entries) under folder, symlinks not followed, a hard-linked file once;
    the walk stops past MAX_ENTRIES."""
    total, entries, seen, stack = 0, 0, set(), [str(folder)]
    while stack and entries <= MAX_ENTRIES:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as it:
            for entry in it:
                entries += 1
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
    return total, entries


class Watch:
    """The log's size at every poll; the watched folders' growth since the job started, every
    WATCH_EVERY_S."""

    def __init__(self, limits: Limits, now: float, log_path: Path | None = None):
        self.limits, self.log_path = limits, log_path
        self.start = {label: usage(path) for label, path in limits.watch} if limits.disk_mb else {}
        self.next_s = now + WATCH_EVERY_S

    def over(self, now: float) -> str | None:
        """The bound the job is past, or None. now = inf: measure everything now (at its exit)."""
        if self.log_path is not None and self.limits.log_mb and now != float("inf"):
            with contextlib.suppress(OSError):
                if self.log_path.stat().st_size > self.limits.log_mb * MB:
                    return f"it printed more than its {self.limits.log_mb} MB log bound {raise_with('log')}"
        if not self.start or now < self.next_s:
            return None
        self.next_s = now + WATCH_EVERY_S
        for label, path in self.limits.watch:
            size, entries = usage(path)
            grown = size - self.start[label][0]
            if grown > self.limits.disk_mb * MB:
                return (f"it wrote more than its {self.limits.disk_mb} MB disk bound to its {label} "
                        f"({grown // MB} MB) {raise_with('disk')}")
            if entries > MAX_ENTRIES:
                return f"it made more than {MAX_ENTRIES} files and folders in its {label}"
        return None


# ---------------------------------------------------------------------------
# The log


def trim_log(path: Path, log_mb: int) -> int:
    """Cut a log past log_mb to its head and its last TAIL_BYTES, with a line that says so, reading
    only the tail (never the whole log); the bytes cut. The job is gone: nothing writes it now."""
    cap = log_mb * MB
    try:
        size = path.stat().st_size
        if not log_mb or size <= cap:
            return 0
        head = max(cap - TAIL_BYTES, cap // 2)
        with open(path, "r+b") as f:
            f.seek(size - TAIL_BYTES)
            tail = f.read(TAIL_BYTES)
            f.seek(head)
            f.truncate()
            cut = size - head - len(tail)
            f.write(f"\n[harness: {cut} bytes of output cut here: the log keeps its first {head // MB} MB and "
                    f"its last {len(tail) // 1024} KB {raise_with('log')}]\n".encode())
            f.write(tail)
        return cut
    except OSError:
        return 0
