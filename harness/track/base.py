"""The small interface every experiment tracker implements, and the sync that drives it.

sync_run() is the only code that logs: the live hook (a background worker, sync.py) and
`harness track RUN_DIR` (the back-fill) both call it. It reads the run's ledger, asks the
tracker which rows it already holds (by their stable keys), and logs only the others, so it
can be repeated at any time without duplicating a row.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .. import ledger
from ..errors import TrackError
from ..gitgate import GitGate
from .records import Record, build

LOCK = ".track.lock"  # in the run folder: one sync of a run at a time (the live one or `harness track`)
LOCK_WAIT_S = 120.0  # s a sync waits for another one of the same run


class Tracker(Protocol):
    """One experiment per harness run; one tracker run per ledger row."""
    name: str
    uri: str

    def open(self, experiment: str) -> None:
        """Create or find the experiment."""

    def logged(self) -> dict[str, str]:
        """Keys of the rows already logged completely -> the tracker's run ids."""

    def log(self, record: Record, parent_id: str | None, diff: str | None) -> str:
        """Log one row as one run (a child of parent_id for repeats); return its run id."""

    def progress(self, metric: str, points: list[tuple[int, float, int]]) -> None:
        """The best so far as one history, (step, value, timestamp ms) points; idempotent."""


@dataclass
class RunInfo:
    """What a sync needs to know about a run, all of it from the run folder."""
    run_dir: Path
    tag: str
    metric: str
    repo: Path | None
    editable: tuple[str, ...]
    config: dict[str, Any]


def run_info(run_dir: Path) -> RunInfo:
    run_dir = Path(run_dir).resolve()
    ledger_path = run_dir / "results.tsv"
    if not ledger_path.exists():
        raise TrackError(f"{run_dir} has no results.tsv: pass a run folder (runs/<tag>) of the research repo.")
    try:
        manifest = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        manifest = {}  # a foreign or older run: the folder's name is its tag
    config = manifest.get("config") or {}
    repo = Path(config["repo"]) if config.get("repo") else None
    return RunInfo(run_dir, manifest.get("tag") or run_dir.name, ledger.metric_name(ledger_path) or "metric",
                   repo, tuple(config.get("editable") or ("train.py",)), config)


@dataclass
class SyncResult:
    experiment: str
    uri: str
    rows: int  # rows in the ledger
    logged: int  # rows logged by this sync (the others were there already)


def _diff(info: RunInfo, rec: Record) -> str | None:
    if rec.diff is None or info.repo is None:
        return None
    try:
        return GitGate(info.repo).diff(rec.diff[0], rec.diff[1], info.editable)
    except Exception:  # noqa: BLE001  (a moved or deleted repo: the run is logged without its diff)
        return None


@contextlib.contextmanager
def _one_sync(run_dir: Path):
    """Two syncs of one run at once could each log a row the other is logging: they take turns."""
    with open(run_dir / LOCK, "a") as f:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TrackError(f"another sync of {run_dir} has held it for over {LOCK_WAIT_S:g}s (a "
                                     f"running harness waiting on its tracker?); try again later") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def sync_run(info: RunInfo, tracker: Tracker) -> SyncResult:
    """Log every ledger row the tracker does not hold yet, in ledger order (one sync of a run at a time)."""
    with _one_sync(info.run_dir):
        return _sync(info, tracker)


def _sync(info: RunInfo, tracker: Tracker) -> SyncResult:
    rows = ledger.read_rows(info.run_dir / "results.tsv")
    records = build(rows, info.tag, info.metric, info.run_dir)
    tracker.open(info.tag)
    done = tracker.logged()
    logged = 0
    for rec in records:
        if rec.key in done:
            continue
        parent = done.get(rec.parent_key) if rec.parent_key else None
        done[rec.key] = tracker.log(rec, parent, _diff(info, rec))
        logged += 1
    from ..workload.testsplit import tracker_records  # the private test split's figures (test_scores.tsv)

    for rec in tracker_records(info.run_dir, info.tag, info.metric):
        if rec.key not in done:
            done[rec.key] = tracker.log(rec, None, None)
            logged += 1
    points = [(r.step, r.best, r.end_ms or r.start_ms or 0) for r in records if r.best is not None]
    tracker.progress(info.metric, points)
    return SyncResult(info.tag, tracker.uri, len(records), logged)
