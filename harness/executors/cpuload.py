"""How busy the machine was while a job ran, for the budget's loaded-machine rule (integrity/budget.py):
`Stalls`, the longest a thread of the job waited on a run queue; `idle_ticks` / `idle_cpus`, the
CPUs the machine left idle. Read by the runner's poll loop (workload/runner.py)."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .limits import Cgroup


class Stalls:
    """How long the job's most-delayed thread waited on a run queue (runnable, not running), from
    each thread's /proc/<pid>/task/<tid>/schedstat, sampled every STALL_EVERY_S while it runs (a
    thread that lived between two samples is missed: the figure errs low, never high). A job that
    sleeps past its budget waits on no run queue; one slowed by other work does."""

    def __init__(self, group: Cgroup | None):
        self.group, self.seen, self.next_s = group, {}, 0.0

    def sample(self, now: float) -> None:
        if self.group is None or now < self.next_s:
            return
        self.next_s = now + STALL_EVERY_S
        path = next(iter(self.group.dirs.values()), None)
        with contextlib.suppress(OSError):
            pids = (path / "cgroup.procs").read_text().split() if path is not None else []
            for pid in pids:
                with contextlib.suppress(OSError), os.scandir(f"/proc/{pid}/task") as tasks:
                    for task in tasks:
                        with contextlib.suppress(OSError, ValueError, IndexError):
                            delay = int(Path(task.path, "schedstat").read_text().split()[1])
                            key = (pid, task.name)
                            self.seen[key] = max(self.seen.get(key, 0), delay)

    @property
    def max_s(self) -> float | None:
        return max(self.seen.values()) / 1e9 if self.seen else None


STALL_EVERY_S = 1.0  # s between samples of the job's threads' run-queue waits


def idle_ticks() -> tuple[int, int] | None:
    """(idle + iowait ticks, CPUs) summed over the CPUs this process may run on, from /proc/stat
    (USER_HZ ticks): what the machine left unused, whoever else runs on it."""
    try:
        cpus = os.sched_getaffinity(0)
        idle = 0
        for line in Path("/proc/stat").read_text().splitlines():
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                idle += int(fields[3]) + int(fields[4])
        return idle, len(cpus)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def idle_cpus(before: tuple[int, int] | None, after: tuple[int, int] | None, wall_s: float) -> float | None:
    """The mean number of CPUs left idle between two idle_ticks() readings wall_s apart."""
    if before is None or after is None or wall_s <= 0 or before[1] != after[1]:
        return None
    return max(0.0, (after[0] - before[0]) / os.sysconf("SC_CLK_TCK") / wall_s)
