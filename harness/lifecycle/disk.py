"""A full disk is the machine's fault, never a candidate's: the run stops with what to free and
where, and a candidate caught by it is trained again on `--resume` (its journal is kept).

Two places see it: the harness's own writes (git, the ledger, a journal: an OSError ENOSPC or
EDQUOT, or git saying so), and a training job that crashed. A job's word is not needed (its log
is on the full disk too, and often empty) nor believed (a candidate that prints "No space left on
device" and exits would stop every night): the free space where its files lived is measured right
after it exits, before they are removed, and only below FLOOR_MB is its crash the disk's. A job
cannot bring the disk there itself: its disk bound (--job-disk-mb, a quarter of the free space by
default) stops it first, unless the disk was nearly full already.
"""
from __future__ import annotations

import errno
import re
import shutil
from pathlib import Path

from ..errors import HarnessError

FULL_RE = re.compile(r"No space left on device|Disk quota exceeded|Out of diskspace|\[Errno (28|122)\]|ENOSPC", re.I)
FLOOR_MB = 256  # MB free where a job's files lived, below which its ENOSPC is the disk's
FREE_HINT_MB = 1024  # MB the message asks for
REASON = "infrastructure: the disk is full"  # a TrainResult's reason prefix, for step.train to stop on
MB = 1 << 20


class DiskFull(HarnessError):
    """The disk under a run filled up: stop, free space, `--resume`."""


def caused(exc: BaseException | None) -> bool:
    """Is a full disk somewhere in exc's chain (an OSError's errno, or a git command's stderr)?"""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if FULL_RE.search(str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def free_mb(path: Path) -> int | None:
    for p in (Path(path), *Path(path).parents):
        try:
            return shutil.disk_usage(p).free // MB
        except OSError:
            continue
    return None


def job_hit_it(where: Path) -> bool:
    """A crashed job's disk is full: FLOOR_MB free or less where it wrote, measured now."""
    free = free_mb(where)
    return free is not None and free < FLOOR_MB


def stop_message(where: Path, tag: str, what: str) -> str:
    free = free_mb(where)
    return (f"the disk under {where} is full ({'?' if free is None else free} MB free) {what}. Nothing recorded was "
            f"lost, and a candidate caught by it is trained again: free at least {FREE_HINT_MB} MB there, then "
            f"continue with `harness run --resume --tag {tag}`")
