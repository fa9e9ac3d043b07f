"""The training split a job trains on, exported once per baseline (`train_data_command`).

The workload's own command, run from the baseline's protected files (written from git) in a
sandbox of its own, writes the training split alone; every job of that baseline gets the folder
read-only as HARNESS_DATA_DIR, while the protected data it came from is hidden from the job.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from pathlib import Path

from ..config import RunConfig
from ..workload.runner import TrainResult, run_training, tail
from . import evaluation, launch, limits, sandbox, view

EXPORTS = "train-data"  # in the run folder: the training splits exported for the jobs, one folder per key
_EXPORT_LOCKS: dict[Path, threading.Lock] = {}  # one export per folder at a time (slots, baseline runs)
_EXPORT_LOCKS_GUARD = threading.Lock()


def export_key(base: str, protected_sha256: dict[str, str] | None, dataset: str) -> str:
    """The export's folder name: the baseline commit, the protected files' recorded sha256 and the
    dataset; the same baseline exports once, another one (a --rebaseline) exports anew."""
    digest = hashlib.sha256(json.dumps(sorted((protected_sha256 or {}).items())).encode()).hexdigest()[:12]
    return f"{base[:12]}-{digest}-{dataset}"


def export(cfg: RunConfig, worktree: Path, where: Path, base: str, choice: sandbox.Choice, log_path: Path,
           cancel: threading.Event | None = None, protected_sha256: dict[str, str] | None = None) -> Path | TrainResult:
    """Run train_data_command once per baseline and dataset; the folder every job gets read-only.

    Run state like the ledger's shadow: written by the harness into the run folder (which no
    sandbox shows), in a folder of its own and renamed into place when the command succeeded, so
    a killed export is never taken for a finished one; two jobs that need it at once (two slots,
    the baseline's runs) wait for one export. cancel set (Ctrl-C, SIGTERM) stops it as promptly as
    a training job (KeyboardInterrupt)."""
    dataset = re.sub(r"[^A-Za-z0-9._-]", "_", os.environ.get("HARNESS_DATASET", "default"))
    root = where / EXPORTS
    dest = root / export_key(base, protected_sha256, dataset)
    with _EXPORT_LOCKS_GUARD:
        lock = _EXPORT_LOCKS.setdefault(dest, threading.Lock())
    with lock:
        if (dest / ".done").exists():
            return dest
        work, tmp, staging = root / "files", root / "tmp", root / f".{dest.name}.partial"
        evaluation.materialise(worktree, base, cfg.protected, work)
        for folder in (staging, tmp):
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        log = root / "export.log"
        wrap = launch.wrapper(choice, worktree=work, tmp_dir=tmp, output_dir=staging, readonly=[view.data_cache()],
                                  hidden=[p for p in (cfg.run_dir, cfg.repo / ".git", view.HARNESS_PACKAGE) if p.exists()])
        bounds = limits.of(cfg, where).watching(private_tmp=tmp)  # the split itself may be larger than a job's files
        done = run_training(cfg.train_data_command, work, launch.harness_env({"HARNESS_OUTPUT_DIR": str(staging)}),
                            log, metric="-", kill_after_s=cfg.kill_after, wrap=wrap, cancel=cancel, limits=bounds)
        if done.returncode != 0:
            return TrainResult("crash", reason=f"train_data_command failed ({done.reason}): {tail(log, 600)}")
        (staging / ".done").write_text(json.dumps({"baseline": base, "dataset": dataset,
                                                   "protected_sha256": protected_sha256 or {}}) + "\n")
        shutil.rmtree(dest, ignore_errors=True)  # a half-written folder an older harness left
        staging.rename(dest)
        shutil.rmtree(tmp, ignore_errors=True)
        return dest
