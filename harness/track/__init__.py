"""Experiment tracking: every ledger row also in the tracker ML engineers already use (MLflow).

The ledger stays the record; the tracker gets a copy, synced idempotently from the ledger:
- live: the health monitor calls after_row(cfg) once a row is safely on disk; a background
  worker (sync.py) syncs, never blocking the loop; finish() waits a bounded time at the end;
- later: backfill(run_dir) (`harness track RUN_DIR`) syncs an existing run, the same code.
mlflow is imported only when a run tracks (the [track] extra). See docs/tracking.md.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..errors import TrackError
from .base import SyncResult, Tracker, run_info, sync_run
from .sync import Syncer

DEFAULT_URI = "sqlite:///runs/mlflow.db"  # relative to the research repo
LOCAL_ARTIFACTS = "runs/mlflow-artifacts"  # next to a local store, relative to the research repo

_syncers: dict[Path, Syncer] = {}
_lock = threading.Lock()


def resolve_uri(uri: str | None, repo: Path) -> str:
    """A relative sqlite path (sqlite:///runs/mlflow.db) is under the research repo; others pass as given."""
    uri = uri or DEFAULT_URI
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str((Path(repo) / uri[len("sqlite:///"):]).resolve())
    return uri


def connect(backend: str, uri: str, repo: Path) -> Tracker:
    """The tracker for backend at uri (its package imported only now)."""
    if backend != "mlflow":
        raise TrackError(f"unknown tracker {backend!r}; known: mlflow")
    from .mlflow_backend import MlflowTracker

    if uri.startswith("sqlite:"):  # a local store: its artifacts beside the database, not in the cwd
        db = Path(uri[len("sqlite:///"):])
        artifacts = db.parent / "mlflow-artifacts" if db.is_absolute() else Path(repo) / LOCAL_ARTIFACTS
        return MlflowTracker(uri, artifacts)  # it makes the database's folder
    return MlflowTracker(uri)


def job_env(cfg: RunConfig, iteration: int | None, commit: str | None) -> dict[str, str]:
    """What the training job learns about its run, so its own logging can join the experiment."""
    env = {"HARNESS_RUN": cfg.tag}
    if iteration is not None:
        env["HARNESS_ITERATION"] = str(iteration)
    if commit:
        env["HARNESS_COMMIT"] = commit
    if cfg.track:
        env["HARNESS_TRACKING_URI"] = resolve_uri(cfg.track_uri, cfg.repo)
    return env


def after_row(cfg: RunConfig) -> None:
    """A row is on the ledger: the run's worker syncs it soon. Never blocks, never raises."""
    if not cfg.track:
        return
    run_dir = cfg.run_dir.resolve()
    with _lock:
        syncer = _syncers.get(run_dir)
        if syncer is None:
            uri = resolve_uri(cfg.track_uri, cfg.repo)
            syncer = Syncer(run_dir, lambda: connect(cfg.track, uri, cfg.repo), uri, cfg.track_timeout)
            _syncers[run_dir] = syncer
    syncer.nudge()


@dataclass
class Outcome:
    run_dir: Path
    uri: str
    complete: bool
    result: SyncResult | None


def finish() -> list[Outcome]:
    """The end of a run: each worker's last sync, waited for at most its run's track_timeout."""
    with _lock:
        syncers = list(_syncers.values())
        _syncers.clear()
    return [Outcome(s.run_dir, s.uri, s.close(), s.last) for s in syncers]


def run_dirs(path: Path) -> list[Path]:
    """A run folder, or an A/B folder's arms (runs/<tag>/a, b, ...)."""
    path = Path(path)
    if (path / "results.tsv").exists():
        return [path]
    arms = sorted(p for p in path.iterdir() if (p / "results.tsv").exists()) if path.is_dir() else []
    if not arms:
        raise TrackError(f"{path} holds no results.tsv: pass a run folder (runs/<tag>) or an A/B folder.")
    return arms


def backfill(run_dir: Path, backend: str | None = None, uri: str | None = None) -> SyncResult:
    """Sync one run folder now (idempotent): the tracker and URI default to the run's own settings."""
    info = run_info(run_dir)
    config: dict[str, Any] = info.config
    repo = info.repo or info.run_dir.parent.parent
    backend = backend or config.get("track") or "mlflow"
    uri = resolve_uri(uri or config.get("track_uri"), repo)
    try:
        return sync_run(info, connect(backend, uri, repo))
    except TrackError:
        raise
    except Exception as e:  # noqa: BLE001  (the tracker's own errors: unreachable, refused, ...)
        raise TrackError(f"could not sync {info.run_dir} to {uri} ({type(e).__name__}: {str(e)[:300]}). "
                         f"Is the tracking server running? Nothing was lost: run this again once it is.") from None
