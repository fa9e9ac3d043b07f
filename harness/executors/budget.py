"""The time budget, measured by the harness: the job's own `training_seconds` is only a log.

The harness times every job itself (from starting it to its exit). What a job spends before
and after training (imports, compilation, saving the model) is the start-up allowance,
calibrated on the baseline's runs: their wall time minus the training time they reported
(the baseline is the user's own committed code, so its figure is trusted there and only there).
A candidate may run for budget + slack + allowance; beyond that it is `invalid`, with a message
that tells a slow machine (the last step ran past the slack) from code that ignores the budget.
The hard deadline (kill_after) is enforced by the runner as before. The supervisor calibrates
(runs.calibrate, on the results its executor brought back) and hands the allowance to every
other job in its Job: a job, local or on a Ray worker, never reads startup.json.
"""
from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path

from .. import ledgerguard
from ..errors import RepoError

FILE = "startup.json"  # in the run folder: the calibration, never visible to a job, checked on every read
SLACK_FRACTION = 0.05  # of the budget: the step that was running when the budget ran out
ALLOWANCE_FACTOR = 1.5  # the baseline's start-up time, times this ...
ALLOWANCE_EXTRA_S = 2.0  # ... plus this many seconds: start-up varies from run to run
DEFAULT_ALLOWANCE_S = 60.0  # s, for a job judged before any baseline run of its commit was measured
IGNORES_FRACTION = 0.25  # over the budget by more than this fraction: not one slow step
_LOCK = threading.Lock()  # baseline runs on several slots at once calibrate one file


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""
    limit_s: float = 0.0


def startup_s(wall_s: float, reported_train_s: float | None, time_budget_s: float) -> float:
    """What a (baseline) job spent outside its training loop."""
    trained = reported_train_s if reported_train_s is not None else time_budget_s
    return max(0.0, wall_s - min(trained, wall_s))


def calibrate(state_dir: Path, commit: str, wall_s: float, reported_train_s: float | None,
              time_budget_s: float) -> float:
    """Record one baseline run (the supervisor's, on the result a job brought back); the allowance
    is taken from the slowest start-up seen. startup.json is a trusted file (ledgerguard)."""
    path = Path(state_dir) / FILE
    with _LOCK:
        data = read(state_dir) or {}
        if data.get("commit") != commit:
            data = {"commit": commit, "startup_s": []}
        data["startup_s"] = data["startup_s"] + [round(startup_s(wall_s, reported_train_s, time_budget_s), 3)]
        data["allowance_s"] = allowance_of(data["startup_s"])
        path.parent.mkdir(parents=True, exist_ok=True)
        ledgerguard.write_trusted(path, (json.dumps(data) + "\n").encode())
    return data["allowance_s"]


def allowance_of(startups_s: list[float]) -> float:
    return round(max(startups_s) * ALLOWANCE_FACTOR + ALLOWANCE_EXTRA_S, 3)


def read(state_dir: Path) -> dict | None:
    """The calibration, checked against the harness's record (RepoError when changed or deleted);
    None when no baseline run was measured yet."""
    path = Path(state_dir) / FILE
    raw = ledgerguard.read_trusted(path)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not (isinstance(data, dict) and isinstance(data.get("startup_s"), list)
            and isinstance(data.get("allowance_s"), (int, float))):
        raise RepoError(f"{path} is not a calibration the harness wrote; restore it from a backup, or start a "
                        f"new run from the run's branch (harness run --tag NEW --from <its branch>).")
    return data


def allowance(state_dir: Path, commit: str) -> float | None:
    """The allowance measured on commit's runs, None when none was measured (raises as read)."""
    data = read(state_dir)
    return float(data["allowance_s"]) if data and data.get("commit") == commit else None


def reported_seconds(metrics: dict) -> float | None:
    """The training time a job printed (a log, believed for the baseline's calibration only)."""
    value = metrics.get("training_seconds")
    return value if isinstance(value, float) and math.isfinite(value) else None


def judge(wall_s: float, time_budget_s: float, allowance_s: float, reported_train_s: float | None) -> Verdict:
    """Was the job within its budget by the harness's clock? Pure."""
    slack_s = time_budget_s * SLACK_FRACTION
    limit_s = time_budget_s + slack_s + allowance_s
    if wall_s <= limit_s:
        return Verdict(True, limit_s=limit_s)
    trained_s = wall_s - allowance_s
    over_s = trained_s - time_budget_s
    head = (f"the job ran {wall_s:.1f}s by the harness's clock: about {trained_s:.1f}s of training after the "
            f"{allowance_s:.1f}s start-up allowance measured on the baseline, against a {time_budget_s:g}s budget")
    if over_s <= time_budget_s * IGNORES_FRACTION:
        return Verdict(False, f"{head}, over by {over_s:.1f}s: more than the {slack_s:.1f}s slack for the last "
                              f"step but under a quarter of the budget, as when one training step takes longer "
                              f"than the slack on a slow machine; raise --time-budget, or make a step shorter",
                       limit_s)
    claim = ""
    if reported_train_s is not None and reported_train_s <= time_budget_s * (1 + SLACK_FRACTION):
        claim = f"; it reported training_seconds {reported_train_s:.1f}, which the harness does not believe"
    return Verdict(False, f"{head}, over by {over_s:.1f}s (more than a quarter of the budget): the code does not "
                          f"stop when HARNESS_TIME_BUDGET is spent{claim}", limit_s)
