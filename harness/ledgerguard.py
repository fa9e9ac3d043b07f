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
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from . import events, faults
from .errors import LedgerError


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
    tmp = state_path(path).with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps({"size": len(data), "sha256": _digest(data)}))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, state_path(path))


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


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".restore")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
            _replace(shadow_path(path), data)
            _save_state(path, data)
        return data or b""
    shadow = _read(shadow_path(path)) or b""
    if len(shadow) > state["size"]:  # a shadow write interrupted before its record: drop the extra
        shadow = shadow[: state["size"]]
        _replace(shadow_path(path), shadow)
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
    _replace(path, shadow)
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
