"""Where training runs: one interface (base.py), the local executor (local.py), the sandbox
around every job (sandbox.py) and the evaluation that takes the metric from outside the
researcher's process (evaluation.py).

The driver hands an executor a Job that names a commit; the executor materialises it, trains it
under the workload's rules and returns a TrainResult. It knows nothing about decisions.
"""
from .base import Executor, Job, JobFuture
from .local import LocalExecutor, train_once

__all__ = ["Executor", "Job", "JobFuture", "LocalExecutor", "train_once"]
