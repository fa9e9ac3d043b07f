"""Where training runs: one interface (base.py), the local executor (local.py), a Ray cluster
(ray_executor.py); the sandbox around every job (sandbox.py) and the evaluation that takes the
metric from outside the researcher's process (evaluation.py).

The driver hands an executor a Job that names a commit; the executor materialises it, trains it
under the workload's rules and returns a TrainResult. It knows nothing about decisions.
`make_executor` picks one from the run's settings (`executor = "local" | "ray"`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import Executor, Job, JobFuture
from .local import LocalExecutor, train_once

__all__ = ["Executor", "Job", "JobFuture", "LocalExecutor", "make_executor", "train_once"]


def make_executor(cfg: Any, repo: Path, folder: Path, gpus: tuple[str, ...] = ()) -> Executor:
    """The run's executor: its slots under folder/slots (local), or its tasks under folder/ray-tasks (Ray)."""
    if getattr(cfg, "executor", "local") == "ray":
        from .ray_executor import RayExecutor  # ray is an optional extra: imported only when asked for
        return RayExecutor(repo, folder, cfg.ray_address, cfg.job_resources, cfg.slots)
    return LocalExecutor(repo, folder / "slots", gpus)
