"""Ledgers as the Elo analysis sees them: which arm, which task, what was spent, best so far.

Definitions (docs/elo.md explains them with examples):
- a trajectory is one ledger (results.tsv): one arm's run on one task;
- its arm is the `arm` column's name when the rows carry one other than the A/B's positional
  `a`/`b` (a tournament's `--arm NAME`); otherwise agent:model (the agent alone without a
  model), from the rows, else run.json / ab.json; a ledger that says neither (karpathy's
  five-column file) is named after its folder;
- its workload is the metric's name and the baseline commit (the first row's commit);
- its repeat is `repeat` from run.json (top level or its config) when a tournament wrote one,
  otherwise its rank among the same arm's ledgers of that workload, ordered by the baseline's
  start time, then path: the first run of each arm on a workload meets the first of every other;
- a task is (workload, repeat). All ledgers of a task must agree on the metric's direction.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..driver import decide
from .. import ledger
from ..errors import HarnessError

AB_POSITIONAL = {"a", "b"}  # the A/B's arm folders: positions, not names worth comparing across runs
SKIP_DIRS = {"worktree", "lanes", "logs", ".git"}  # never ledgers of their own

# How a budget is counted per row: (unit, columns that must be in the header, spend of one row).
BUDGETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gpu-hours": ("GPU-hours", ("train_s",)),
    "tokens": ("tokens", ("input_tokens", "output_tokens")),
    "usd": ("USD", ("cost_usd",)),
    "wall": ("wall-hours", ("wall_s",)),
    "iterations": ("iterations", ()),
}


class EloInputError(HarnessError):
    """The ledgers given to `harness elo` cannot be analysed as they are."""


@dataclass
class Trajectory:
    path: Path
    arm: str
    agent: str | None
    model: str | None
    metric: str
    direction: str
    baseline_commit: str
    workload: str  # shown: the repo's folder name and the baseline commit
    rows: list[dict[str, Any]]
    columns: tuple[str, ...]
    started_at: str = ""
    repeat: int | None = None  # explicit (run.json) or, after assign_repeats, by order
    name: str | None = None  # the arm column's name, if any

    @property
    def workload_key(self) -> tuple[str, str]:
        return (self.metric, self.baseline_commit)

    def knows(self, budget: str) -> bool:
        return all(c in self.columns for c in BUDGETS[budget][1])


@dataclass
class Task:
    key: tuple[str, str, int]  # (metric, baseline commit, repeat)
    workload: str
    repeat: int
    direction: str
    trajectories: dict[str, Trajectory] = field(default_factory=dict)  # arm -> its ledger
    sigma: float | None = None  # the task's noise floor: repeats pooled, else the ledgers' sigma
    budget: str = "gpu-hours"  # the budget actually used (iterations when a ledger lacks the column)

    @property
    def label(self) -> str:
        return f"{self.workload}#{self.repeat}"


# ---------------------------------------------------------------------------
# Finding and reading ledgers


def find_ledgers(paths: list[Path]) -> list[Path]:
    """Every results.tsv named or under the given folders (worktrees and lanes skipped), once each."""
    found: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            candidates = [path]
        elif path.is_dir():
            candidates = sorted(p for p in path.rglob("results.tsv")
                                if not SKIP_DIRS.intersection(p.relative_to(path).parts[:-1]))
        else:
            raise EloInputError(f"{path}: no such file or folder. Pass run folders (runs/<tag>), A/B or "
                                f"tournament folders, or results.tsv files.")
        if not candidates:
            raise EloInputError(f"{path}: no results.tsv in it. Pass run folders (runs/<tag>), A/B or "
                                f"tournament folders, or results.tsv files.")
        for c in candidates:
            if c.resolve() not in seen:
                seen.add(c.resolve())
                found.append(c)
    return found


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _arm_identity(path: Path, rows: list[dict[str, Any]], manifest: dict[str, Any]) -> tuple[str, str | None,
                                                                                            str | None, str | None]:
    """(arm, agent, model, name) of one ledger; see the module's docstring."""
    researched = [r for r in rows[1:] if r.get("agent") or r.get("model")] or rows[:1]
    first = researched[0] if researched else {}
    name = first.get("arm") or (manifest.get("config") or {}).get("arm") or None
    setup = _read_json(path.parent.parent / "ab.json").get("arms", {}).get(name or "", {})
    agent = first.get("agent") or manifest.get("agent") or setup.get("researcher") or setup.get("agent")
    model = first.get("model") or manifest.get("model") or setup.get("model")
    if name and name not in AB_POSITIONAL:
        return str(name), agent, model, str(name)
    if agent:
        return (f"{agent}:{model}" if model else str(agent)), agent, model, name
    return (path.parent.name if path.name == "results.tsv" else path.stem), None, None, name


def load(path: Path, arm_by: str = "researcher") -> Trajectory | None:
    """One ledger as a trajectory; None for a ledger without a measured baseline yet.

    arm_by "folder" names the arm after the run's folder (its tag) instead: separate runs of one
    researcher (mutate with two seeds) then compete rather than count as repeats."""
    rows = ledger.read_rows(path)
    for r in rows:  # karpathy/autoresearch logs a crash as 0.000000: a placeholder, not a figure
        if r.get("status") in ("crash", "timeout", "invalid") and not r.get("metric"):
            r["metric"] = None
    if not rows or ledger.decided_value(rows[0]) is None:
        return None
    header = tuple(path.read_text(encoding="utf-8").split("\n", 1)[0].split("\t"))
    manifest = _read_json(path.parent / "run.json")
    cfg = manifest.get("config") or {}
    arm, agent, model, name = _arm_identity(path, rows, manifest)
    if arm_by == "folder":
        arm, name = (path.parent.name if path.name == "results.tsv" else path.stem), None
    repeat = manifest.get("repeat", cfg.get("repeat"))
    repo = Path(cfg["repo"]).name if cfg.get("repo") else None
    commit = str(rows[0].get("commit") or "")[:12]
    return Trajectory(path=path, arm=arm, agent=agent, model=model, metric=ledger.metric_name(path) or "metric",
                      direction=cfg.get("direction", "minimize"), baseline_commit=commit,
                      workload=f"{repo}@{commit[:7]}" if repo else commit[:7] or "?",
                      rows=rows, columns=header, started_at=str(rows[0].get("started_at") or ""),
                      repeat=None if repeat is None else int(repeat), name=name)


# ---------------------------------------------------------------------------
# Tasks


def _split_clashing_names(trajs: list[Trajectory]) -> None:
    """One arm name used for different agent:model pairs (two tournaments) becomes one arm each."""
    models: dict[str, set[tuple[Any, Any]]] = {}
    for t in trajs:
        if t.name and t.arm == t.name:
            models.setdefault(t.arm, set()).add((t.agent, t.model))
    for t in trajs:
        if t.name and t.arm == t.name and len(models[t.arm]) > 1:
            t.arm = f"{t.name} ({t.agent}:{t.model})" if t.model else f"{t.name} ({t.agent})"


def build_tasks(trajs: list[Trajectory], budget: str) -> list[Task]:
    """Group trajectories into tasks: (workload, repeat), one ledger per arm and task."""
    _split_clashing_names(trajs)
    order = sorted(trajs, key=lambda t: (t.started_at, str(t.path)))
    rank: dict[tuple[Any, ...], int] = {}
    tasks: dict[tuple[str, str, int], Task] = {}
    for t in order:
        if t.repeat is None:
            k = (t.workload_key, t.arm)
            rank[k] = rank.get(k, 0) + 1
            repeat = rank[k]
        else:
            repeat = t.repeat
        key = (*t.workload_key, repeat)
        task = tasks.setdefault(key, Task(key=key, workload=t.workload, repeat=repeat, direction=t.direction))
        if t.direction != task.direction:
            raise EloInputError(f"{t.path}: its metric is to {t.direction} but other ledgers of task {task.label} "
                                f"{task.direction} it; compare runs of one workload with one direction.")
        if t.arm in task.trajectories:
            raise EloInputError(f"{t.path} and {task.trajectories[t.arm].path} are both arm {t.arm} in task "
                                f"{task.label} (the same repeat in run.json); pass only one of them.")
        task.trajectories[t.arm] = t
    out = sorted(tasks.values(), key=lambda k: (k.workload, k.repeat))
    for task in out:
        task.sigma = noise_floor(list(task.trajectories.values()))
        task.budget = budget if all(t.knows(budget) for t in task.trajectories.values()) else "iterations"
    return out


def noise_floor(trajs: list[Trajectory]) -> float | None:
    """The task's run-to-run sigma: repeats of identical code pooled over its ledgers (driver/decide.py's
    pooling), else the largest sigma a ledger recorded; None when nothing was measured twice."""
    groups = [g for t in trajs for g in decide.repeat_groups(t.rows)]
    pooled = decide.pooled_sigma(groups)
    if pooled is not None:
        return pooled
    recorded = [r["sigma"] for t in trajs for r in t.rows if r.get("sigma")]
    return max(recorded) if recorded else None


# ---------------------------------------------------------------------------
# Spend and best so far


def row_spend(row: dict[str, Any], budget: str) -> float:
    """What one row after the baseline spent of a budget (unknown cells count as nothing)."""
    if budget == "iterations":
        return 0.0 if row.get("status") == "repeat" else 1.0
    if budget == "gpu-hours":
        return (row.get("train_s") or 0.0) / 3600
    if budget == "tokens":
        return float((row.get("input_tokens") or 0) + (row.get("output_tokens") or 0))
    if budget == "usd":
        return row.get("cost_usd") or 0.0
    return 0.0 if row.get("status") == "repeat" else (row.get("wall_s") or 0.0) / 3600  # a repeat's wall is inside


def _after_baseline(t: Trajectory) -> list[dict[str, Any]]:
    """The rows that spend: everything after the baseline but the baseline's own repeats."""
    return [r for r in t.rows[1:] if not (r.get("status") == "repeat" and r.get("candidate") == 0)]


def total_spend(t: Trajectory, budget: str) -> float:
    return sum(row_spend(r, budget) for r in _after_baseline(t))


def common_budget(task: Task) -> float:
    """The spend every arm of the task reached: the least total among arms that spent any."""
    totals = [total_spend(t, task.budget) for t in task.trajectories.values()]
    positive = [x for x in totals if x > 0]
    return min(positive) if positive else 0.0


@dataclass(frozen=True)
class BestSoFar:
    value: float
    runs: int  # measurements behind the value (the noise gate's mean)
    tokens: float  # spent until then
    cost_usd: float | None  # None when the ledger records no cost, or not for every row with tokens


def best_so_far(t: Trajectory, budget: str, limit: float) -> BestSoFar:
    """The current best (last kept) among the rows whose cumulative spend is within limit."""
    base = t.rows[0]
    value, runs = ledger.decided_value(base), int(base.get("runs") or 1)
    spent, tokens, cost = 0.0, 0.0, 0.0 if t.knows("usd") else None
    eps = 1e-9 * max(1.0, abs(limit))
    for r in _after_baseline(t):
        spent += row_spend(r, budget)
        if spent > limit + eps:
            break
        tokens += row_spend(r, "tokens")
        if cost is not None and r.get("cost_usd") is None and row_spend(r, "tokens") > 0:
            cost = None  # tokens of a model without a price: the cost is unknown, not zero
        elif cost is not None:
            cost += r.get("cost_usd") or 0.0
        if r.get("status") == "keep" and ledger.decided_value(r) is not None:
            value, runs = ledger.decided_value(r), int(r.get("runs") or 1)
    return BestSoFar(float(value), runs, tokens, cost)


def curve(t: Trajectory, budget: str) -> list[tuple[float, float]]:
    """(cumulative spend, best so far) after the baseline and after each row: the plotted curve."""
    value = float(ledger.decided_value(t.rows[0]))
    points, spent = [(0.0, value)], 0.0
    for r in _after_baseline(t):
        spent += row_spend(r, budget)
        if r.get("status") == "keep" and ledger.decided_value(r) is not None:
            value = float(ledger.decided_value(r))
        points.append((spent, value))
    return points
