"""runs/<tag>/events.log: what happened besides the experiments (one JSON object a line).

Ledger repairs and restores, protected files restored, health warnings and stops, orphaned
jobs reaped. The loop echoes new events as progress; `harness report` lists them.
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

NAME = "events.log"


def record(run_dir: Path, kind: str, message: str, **data: Any) -> dict[str, Any]:
    """Append one event (fsynced: events matter most when things go wrong)."""
    event = {"at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "kind": kind,
             "message": message, **data}
    path = Path(run_dir) / NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(event, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return event


def read(run_dir: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Events from byte offset on (complete lines only), and the offset after them."""
    path = Path(run_dir) / NAME
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    out = []
    for line in data[:end].splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out, offset + end


def size(run_dir: Path) -> int:
    try:
        return (Path(run_dir) / NAME).stat().st_size
    except OSError:
        return 0
