"""`harness rerun`: train one commit K times and measure its run-to-run noise."""
from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from ..lifecycle import supervise
from ..config import RunConfig
from ..errors import HarnessError
from ..executors import Job, LocalExecutor
from ..gitgate import GitGate


@dataclass
class RerunStats:
    commit: str
    values: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def sd(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) > 1 else None

    @property
    def spread(self) -> float:
        return max(self.values) - min(self.values)


def rerun(cfg: RunConfig, rev: str, repeat: int,
          progress: Callable[[int, Any], None] = lambda i, r: None) -> RerunStats:
    """Train rev `repeat` times on seeds seed, seed+1, ... in an executor slot under runs/<tag>/;
    logs in runs/<tag>/logs. Every job is under the supervisor, and nothing is left on any exit."""
    if repeat < 1:
        raise HarnessError("--repeat must be at least 1")
    gate = GitGate(cfg.repo)
    gate.ensure_excluded()
    sha = gate.require_commit(rev)
    stats = RerunStats(sha)
    cfg.logs_dir.mkdir(parents=True, exist_ok=True)
    executor = LocalExecutor(cfg.repo, cfg.run_dir / "slots", tuple(cfg.gpus))
    with supervise.active(cfg.run_dir), contextlib.closing(executor):
        for k in range(repeat):
            result = executor.run(Job(cfg, sha, cfg.seed + k, cfg.logs_dir / f"rerun-{sha[:12]}-{k}.log"))
            if result.status == "ok":
                stats.values.append(result.value(cfg.metric))
            else:
                stats.failures.append(f"run {k}: {result.status} ({result.reason})")
            progress(k, result)
    if not stats.values:
        raise HarnessError(f"every run of {sha[:12]} failed: " + "; ".join(stats.failures))
    return stats
