"""Durable writes, the one helper for every file a resume or a later supervisor trusts (journals,
records, the clock, manifests, the ledger's state): imports nothing of the harness, so any module
(a researcher's, an executor's, the worker on a Ray node) may use it.

`atomic_write`: write-then-rename, the file and its folder fsynced: after a crash, the old bytes
or the new, never a torn or empty file. `append_line`: an append fsynced (and the folder, when
the append created the file), for append-only files read on resume (tried.txt)."""
from __future__ import annotations

import os
import threading
from pathlib import Path


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write-then-rename, the file and its folder fsynced: after a crash the old bytes or the new.
    The temporary file is the writer's own (pid and thread in its name, `.tmp` at its end) and is
    removed when the write fails (a full disk)."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)


def append_line(path: Path, line: str) -> None:
    """Append one line (a newline added when it has none) and fsync it before returning."""
    path = Path(path)
    created = not path.exists()
    with open(path, "a") as f:
        f.write(line if line.endswith("\n") else line + "\n")
        f.flush()
        os.fsync(f.fileno())
    if created:
        _sync_folder(path.parent)
