"""Fault injection for the robustness tests: the supervisor SIGKILLs itself at a named point.

    HARNESS_FAULT=after_commit            die the first time the point is reached
    HARNESS_FAULT=mid_ledger_write:2      die the second time (the first ledger row is the baseline's)
    HARNESS_FAULT=after_propose,during_train:3

Points: after_propose, after_commit, during_train, after_train, mid_ledger_write (write half a
row, then die). Unset, every call is a dictionary lookup and nothing else; the variable is
never passed to the training job or the researcher's own processes on purpose (they inherit
it harmlessly: only the harness calls `point`).

    HARNESS_RAY_FAULT=OutOfMemoryError        the first Ray task attempt raises it on its node
    HARNESS_RAY_FAULT=ObjectStoreFullError:2+3 the 2nd and 3rd attempts (in the supervisor's order)
    HARNESS_RAY_FAULT=OutOfMemoryError:1,OutOfDiskError:4

The Ray executor (the supervisor) counts its task attempts and names the error in the task's
spec; the task (ray_worker.run_job) raises `ray.exceptions.<name>` on the node, as Ray's memory
monitor or a full object store would fail it.
"""
from __future__ import annotations

import os
import signal
import threading

ENV = "HARNESS_FAULT"
POINTS = ("after_propose", "after_commit", "during_train", "after_train", "mid_ledger_write")

_hits: dict[str, int] = {}


def _armed(name: str) -> bool:
    """Count a visit to the point; True on the visit the spec names."""
    spec = os.environ.get(ENV)
    if not spec:
        return False
    for item in spec.split(","):
        point, _, nth = item.strip().partition(":")
        if point == name:
            _hits[name] = _hits.get(name, 0) + 1
            return _hits[name] == (int(nth) if nth else 1)
    return False


def die() -> None:
    """SIGKILL this process: no cleanup, no finally blocks, exactly like the OOM killer."""
    os.kill(os.getpid(), signal.SIGKILL)


def point(name: str) -> None:
    if _armed(name):
        die()


def torn_write(fd: int, data: bytes, name: str = "mid_ledger_write") -> bytes:
    """At the armed point, write the first half of data, flush it to disk and die; else return data."""
    if _armed(name):
        os.write(fd, data[: max(1, len(data) // 2)])
        os.fsync(fd)
        die()
    return data


RAY_ENV = "HARNESS_RAY_FAULT"
_ray = {"attempts": 0, "lock": threading.Lock()}


def ray_raise() -> str | None:
    """Count one Ray task attempt; the name of the Ray error it is to raise on its node, or None."""
    spec = os.environ.get(RAY_ENV)
    if not spec:
        return None
    with _ray["lock"]:
        _ray["attempts"] += 1
        n = _ray["attempts"]
    for item in spec.split(","):
        name, _, nths = item.strip().partition(":")
        if n in ({int(x) for x in nths.split("+") if x.strip()} or {1}):
            return name
    return None


def ray_fail(name: str | None) -> None:
    """On the node: raise the Ray error the spec names (ray_raise), if any."""
    if name:
        import ray.exceptions
        raise getattr(ray.exceptions, name)(f"{name} raised on purpose ({RAY_ENV})")
