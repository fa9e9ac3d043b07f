"""The harness's own copy of the ledger: torn lines repaired, edits behind its back undone.

The researcher runs in a shell that can reach `../results.tsv`. So every append goes first
to a shadow copy (`.results.tsv.shadow`) whose size and sha256 are recorded in
`.results.tsv.state` (write-and-rename), and only then to the ledger. `sync` (before every
append and every iteration, and on resume) compares the ledger with that record:

- a torn last line (a crash mid-write) is cut off and kept in `results.tsv.torn`;
- a ledger that lacks rows the shadow has (an interrupted write, or a deletion) is completed;
- a ledger that was edited or deleted is replaced by the shadow; the edited file is kept as
  `results.tsv.tampered`, and an event is recorded either way.

A failed write (disk full) rolls both files back to their last good size and raises
LedgerError, so nothing already recorded is lost and no half row stays behind.

The run's other trusted files (run.json, startup.json) have a record too (`write_trusted`,
`read_trusted`): their sha256 as the harness wrote them, checked on every read.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from . import events
from ..lifecycle import faults
from .atomic import atomic_write  # also ledgerguard.atomic_write, as before
from ..errors import LedgerError, RepoError


def shadow_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.shadow")


def state_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.state")


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _load_state(path: Path) -> dict | None:
    try:
        return json.loads(state_path(path).read_text())
    except (OSError, ValueError):
        return None


def _save_state(path: Path, data: bytes) -> None:
    """Write-and-rename, fsynced: a kill leaves the old record or the new one."""
    atomic_write(state_path(path), json.dumps({"size": len(data), "sha256": _digest(data)}))


def _append(path: Path, data: bytes, fault: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if fault:
            data = faults.torn_write(fd, data)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def repair_tail(path: Path) -> bytes:
    """Cut a torn last line (no trailing newline) off the file; return what was cut (b'' if none)."""
    data = _read(path)
    if not data or data.endswith(b"\n"):
        return b""
    keep = data.rfind(b"\n") + 1
    with open(path, "r+b") as f:
        f.truncate(keep)
        os.fsync(f.fileno())
    return data[keep:]


def sync(path: Path) -> bytes:
    """Make the ledger equal to the harness's copy (see the module docstring); return its content."""
    path = Path(path)
    run_dir = path.parent
    torn = repair_tail(path)
    if torn:
        with open(path.with_name(path.name + ".torn"), "ab") as f:
            f.write(torn + b"\n")
        events.record(run_dir, "ledger_repaired", f"cut a torn last line ({len(torn)} bytes, a write "
                      f"interrupted by a crash) off {path.name}; kept in {path.name}.torn")
    state = _load_state(path)
    if state is None:  # first use, or a run from before the shadow existed: adopt the ledger as it is
        data = _read(path)
        if data is not None:
            atomic_write(shadow_path(path), data)
            _save_state(path, data)
        return data or b""
    shadow = _read(shadow_path(path)) or b""
    if len(shadow) > state["size"]:  # a shadow write interrupted before its record: drop the extra
        shadow = shadow[: state["size"]]
        atomic_write(shadow_path(path), shadow)
    if _digest(shadow) != state["sha256"]:
        raise LedgerError(f"the harness's copy of the ledger ({shadow_path(path)}) no longer matches its "
                          f"record ({state_path(path)}), so the genuine rows cannot be told apart. Inspect "
                          f"{path}; delete {state_path(path)} to accept {path} as it is, then --resume.")
    data = _read(path)
    if data == shadow:
        return shadow
    if data is None:
        what = "was deleted"
    elif shadow.startswith(data):
        rows = shadow[len(data):].count(b"\n")
        what = f"lacked its last {rows} row(s) (an interrupted write, or rows removed)"
    else:
        path.with_name(path.name + ".tampered").write_bytes(data)
        what = f"was changed ({len(data)} bytes, expected {len(shadow)}); the changed file is kept as {path.name}.tampered"
    atomic_write(path, shadow)
    events.record(run_dir, "ledger_restored", f"{path.name} {what} behind the harness's back; "
                  f"restored the harness's copy")
    return shadow


def append(path: Path, data: bytes, current: bytes) -> None:
    """Append data to the shadow (and its record), then to the ledger; current = the synced content.

    On an OSError (disk full) both files go back to their last good size and LedgerError is raised.
    """
    path = Path(path)
    old_ledger = len(current)
    try:
        _append(shadow_path(path), data)
        _save_state(path, current + data)
        _append(path, data, fault=True)
    except OSError as e:
        try:  # back to the last good record; if even that fails, sync() completes the row on resume
            _save_state(path, current)
            rollback = (shadow_path(path), path)
        except OSError:
            rollback = (path,)
        for p in rollback:
            try:
                with open(p, "r+b") as f:
                    f.truncate(old_ledger)
            except OSError:
                pass
        raise LedgerError(f"could not write a row to {path}: {e}. Nothing recorded before was lost. "
                          f"Free disk space (or fix the file system), then continue with --resume.") from e


def replace(path: Path, data: bytes) -> None:
    """The harness's own rewrite of the whole ledger (a renamed metric column on --rebaseline): the
    shadow and its record first, then the ledger, each write-and-rename, so sync() accepts it."""
    path = Path(path)
    sync(path)
    atomic_write(shadow_path(path), data)
    _save_state(path, data)
    atomic_write(path, data)


# ---------------------------------------------------------------------------
# The run's other trusted files (run.json, startup.json): written by the harness only, checked on
# every read against the sha256 the harness recorded when it wrote them.

RECORD = ".trusted.json"  # in the run folder: {file name: [sha256 it may have]}
_RECORD_LOCK = threading.Lock()  # two threads recording at once would lose one's entry


def _record(run_dir: Path) -> dict[str, list[str | None]] | None:
    try:
        data = json.loads((run_dir / RECORD).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        raise RepoError(f"{run_dir / RECORD}, the harness's record of its own files, is unreadable, so "
                        f"run.json and startup.json cannot be trusted. Start a new run from the run's branch "
                        f"(harness run --tag NEW --from <its branch>).")
    return data


def _save_record(run_dir: Path, name: str, hashes: list[str | None]) -> None:
    try:
        data = _record(run_dir) or {}
    except RepoError:  # unreadable: started again (the supervisor restores every file it holds)
        data = {}
    data[name] = hashes
    atomic_write(run_dir / RECORD, json.dumps(data))


def write_trusted(path: Path, data: bytes) -> None:
    """Write a file of the run's trusted state (write-and-rename, fsynced) and record its sha256.

    The record names the old and the new hash while the file is replaced, then the new one only:
    a kill at any point leaves a file the record accepts."""
    path = Path(path)
    with _RECORD_LOCK:
        old = _read(path)
        _save_record(path.parent, path.name, [None if old is None else _digest(old), _digest(data)])
        atomic_write(path, data)
        _save_record(path.parent, path.name, [_digest(data)])


def recorded(path: Path, data: bytes) -> bool:
    """Does the record accept data as path's content? (False for an unreadable record.)"""
    with _RECORD_LOCK:
        try:
            hashes = (_record(Path(path).parent) or {}).get(Path(path).name) or []
        except RepoError:
            return False
    return _digest(data) in hashes


def read_trusted(path: Path) -> bytes | None:
    """A trusted file's bytes, checked against the record: None when the harness never wrote it.

    Raises RepoError when it is missing, changed, or there without a record: a job or a researcher
    that rewrote the run's baseline, allowance or settings is refused, never believed."""
    path = Path(path)
    with _RECORD_LOCK:
        record = _record(path.parent) or {}
        data = _read(path)
    hashes = record.get(path.name)
    if hashes is None and data is None:
        return None
    digest = None if data is None else _digest(data)
    if hashes is not None and digest in hashes:
        return data
    what = ("is missing" if data is None else "was changed after the harness wrote it" if hashes is not None
            else "has no record of the harness having written it")
    events.record(path.parent, "trusted_state_refused", f"{path.name} {what}")
    raise RepoError(f"{path} {what} ({RECORD} holds the sha256 of what the harness wrote). It is the run's "
                    f"trusted state (the baseline commit, the start-up allowance, the measured settings), so "
                    f"the run cannot go on from it. Restore the file from a backup, or start a new run from "
                    f"the run's branch: harness run --tag NEW --from <its branch>.")
