"""MLflow: a harness run is an experiment named by its tag; each ledger row is one MLflow run.

Only MlflowClient is used (no global "active run" state, so the supervisor's threads and the
training job's own MLflow logging never interfere). A run carries the tag `harness.key`
(its row's stable key) and, once everything is logged, `harness.complete`; a run left
incomplete by an interruption is deleted and logged again by the next sync.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from pathlib import Path

from ..errors import TrackError
from .records import Record

KEY_TAG = "harness.key"
COMPLETE_TAG = "harness.complete"
PAGE = 1000  # runs per search request
PROGRESS = "progress"  # the key suffix (and name) of the run that holds the best-so-far history


def _client(uri: str):
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise TrackError("tracking with MLflow needs the mlflow package: pip install "
                         "'autoresearch-harness[track]' (or pip install mlflow)") from None
    # MLflow writes a "View run ... at URL" line to stdout for every finished run on a server: stdout
    # is the harness's data channel. (The variable reaches training jobs too; it only mutes that line.)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    for name in ("mlflow", "alembic"):  # their INFO lines (database migrations) are not the harness's output
        logging.getLogger(name).setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=uri)


@contextlib.contextmanager
def _creating(db: Path):
    """One process (or thread) at a time creates or upgrades a local database: MLflow migrates a
    new or older sqlite file on its first use, and two doing it at once (the run's live sync and a
    `harness track` back-fill, or two A/B arms sharing runs/mlflow.db) read tables the other is
    still changing (`no such column`, alembic's `0 found`). A lock file beside the database, held
    while the client (and with it the store) is made."""
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.parent / f".{db.name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class MlflowTracker:
    name = "mlflow"

    def __init__(self, uri: str, artifact_root: Path | None = None):
        """artifact_root: where a local (sqlite) store keeps artifacts; a server decides its own."""
        self.uri, self.artifact_root = uri, artifact_root
        local = uri.startswith("sqlite:///")
        with _creating(Path(uri[len("sqlite:///"):])) if local else contextlib.nullcontext():
            self.client = _client(uri)  # MLflow makes its store here: a local database created or upgraded
        self.experiment_id = ""
        self.experiment = ""
        self.progress_id: str | None = None  # found by logged()

    def open(self, experiment: str) -> None:
        from mlflow.exceptions import MlflowException

        self.experiment = experiment
        found = self.client.get_experiment_by_name(experiment)
        if found is None:
            location = None if self.artifact_root is None else (self.artifact_root / experiment).resolve().as_uri()
            try:
                self.experiment_id = self.client.create_experiment(experiment, artifact_location=location)
                return
            except MlflowException:  # created meanwhile by another sync
                found = self.client.get_experiment_by_name(experiment)
                if found is None:
                    raise
        if found.lifecycle_stage != "active":
            raise TrackError(f"MLflow experiment {experiment!r} at {self.uri} is deleted: restore it "
                             f"(mlflow experiments restore --experiment-id {found.experiment_id}) or delete it "
                             f"for good, then sync again")
        self.experiment_id = found.experiment_id

    def _runs(self) -> list:
        out, token = [], None
        while True:
            page = self.client.search_runs([self.experiment_id], max_results=PAGE, page_token=token)
            out += list(page)
            token = page.token
            if not token:
                return out

    def logged(self) -> dict[str, str]:
        done, self.progress_id = {}, None
        for run in self._runs():
            key = run.data.tags.get(KEY_TAG)
            if key == f"{self.experiment}/{PROGRESS}":
                self.progress_id = run.info.run_id
            if key is None or key == f"{self.experiment}/{PROGRESS}":
                continue
            if run.data.tags.get(COMPLETE_TAG) == "1":
                done[key] = run.info.run_id
            else:  # interrupted half-way: logged again from scratch
                self.client.delete_run(run.info.run_id)
        return done

    def log(self, record: Record, parent_id: str | None, diff: str | None) -> str:
        from mlflow.entities import Metric, Param, RunTag

        tags = {**record.tags, KEY_TAG: record.key}
        if parent_id:
            tags["mlflow.parentRunId"] = parent_id
        run = self.client.create_run(self.experiment_id, start_time=record.start_ms, tags=tags,
                                     run_name=record.name)
        run_id = run.info.run_id
        stamp = record.end_ms or int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(k, v, stamp, record.step) for k, v in record.metrics.items()],
                              params=[Param(k, v) for k, v in record.params.items()])
        for name, path in record.files.items():
            self.client.log_artifact(run_id, str(path), artifact_path=str(Path(name).parent))
        if diff:
            self.client.log_text(run_id, diff, "diff.patch")
        self.client.set_terminated(run_id, "FAILED" if record.failed else "FINISHED", end_time=record.end_ms)
        self.client.log_batch(run_id, tags=[RunTag(COMPLETE_TAG, "1")])
        return run_id

    def progress(self, metric: str, points: list[tuple[int, float, int]]) -> None:
        from mlflow.entities import Metric

        run_id = self.progress_id
        if run_id is None:
            tags = {KEY_TAG: f"{self.experiment}/{PROGRESS}", "harness.run": self.experiment}
            run_id = self.client.create_run(self.experiment_id, tags=tags, run_name="best so far").info.run_id
            self.client.set_terminated(run_id, "FINISHED")  # a history, not a job: never "running"
            self.progress_id = run_id
        name = f"best_{metric}"
        have = {m.step for m in self.client.get_metric_history(run_id, name)}
        new, seen = [], set(have)
        for step, value, stamp in points:
            if step not in seen:
                seen.add(step)
                new.append(Metric(name, value, stamp, step))
        if new:
            self.client.log_batch(run_id, metrics=new)
