"""`harness elo`'s games and cost: within each task, every arm's best so far at the spend all of the
task's arms reached against every other's (a win, a loss, or a tie within the task's noise floor),
the games as arrays and tables; cost normalised per task, Elo per unit of spend. Pure."""
from __future__ import annotations

import statistics
from typing import Any

import numpy as np
import pandas as pd

from ..driver import decide
from .. import ledger
from . import elo_data
from .elo_data import Task

OUTCOMES = {"wins": 1.0, "losses": 0.0, "ties": 0.5}  # an arm's score in one game


# ---------------------------------------------------------------------------
# Outcomes within tasks


def outcome(task: Task, a: elo_data.BestSoFar, b: elo_data.BestSoFar, tie_z: float) -> float:
    """a's score against b: 1 win, 0 loss, 0.5 when the gap is within the task's noise floor."""
    gain = decide.improvement(a.value, b.value, task.direction)
    gate = decide.GateSettings(gate="noise", direction=task.direction, z=tie_z)
    if abs(gain) <= decide.threshold(gate, task.sigma, a.runs, b.runs):
        return 0.5
    return 1.0 if gain > 0 else 0.0


def task_outcomes(tasks: list[Task], fraction: float, tie_z: float) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """(games, per-task records) at one budget point. games is the long table of every comparison:
    one row per task, arm and opponent (both sides of each pair), with the arm's score."""
    played, per_task = [], []
    for k, task in enumerate(tasks):
        limit = fraction * elo_data.common_budget(task)
        best = {arm: elo_data.best_so_far(t, task.budget, limit) for arm, t in task.trajectories.items()}
        names = list(best)
        for x, a in enumerate(names):
            for b in names[x + 1:]:
                s = outcome(task, best[a], best[b], tie_z)
                played += [(k, a, b, s), (k, b, a, 1 - s)]
        per_task.append({"task": task.label, "workload": task.workload, "repeat": task.repeat,
                        "budget": task.budget, "compared_at": limit, "sigma": task.sigma,
                        "curves": {a: elo_data.curve(t, task.budget) for a, t in task.trajectories.items()},
                        "best": {a: {"value": v.value, "runs": v.runs, "tokens": v.tokens, "cost_usd": v.cost_usd,
                                     "improvement": decide.improvement(
                                         v.value, float(ledger.decided_value(task.trajectories[a].rows[0])),
                                         task.direction),
                                     "ledger": str(task.trajectories[a].path)} for a, v in best.items()}})
    games = pd.DataFrame(played, columns=["task", "arm", "opponent", "score"])
    return games.astype({"task": int, "score": float}), per_task


def outcome_arrays(games: pd.DataFrame, n_tasks: int, arms: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The fit's input: scores and games played, T x A x A (task, arm, opponent)."""
    index = {a: i for i, a in enumerate(arms)}
    scores = np.zeros((n_tasks, len(arms), len(arms)))
    played = np.zeros_like(scores)
    at = (games["task"].to_numpy(), games["arm"].map(index).to_numpy(int), games["opponent"].map(index).to_numpy(int))
    scores[at], played[at] = games["score"].to_numpy(), 1
    return scores, played


def pairwise(games: pd.DataFrame) -> pd.DataFrame:
    """Wins, losses and ties of each arm against each opponent over all tasks (index: arm, opponent)."""
    if games.empty:
        return pd.DataFrame(columns=list(OUTCOMES), index=pd.MultiIndex.from_tuples([], names=["arm", "opponent"]))
    table = pd.crosstab([games["arm"], games["opponent"]], games["score"])
    return table.reindex(columns=list(OUTCOMES.values()), fill_value=0).set_axis(list(OUTCOMES), axis=1)


def arm_records(games: pd.DataFrame, arms: list[str]) -> dict[str, dict[str, Any]]:
    """Each arm's record: tasks with a game, games, wins, losses, ties and win rate (ties count half)."""
    table = pairwise(games).groupby(level="arm").sum()
    table["tasks"] = games.groupby("arm")["task"].nunique()
    table = table.reindex(arms, fill_value=0).astype(int)
    table["games"] = table["wins"] + table["losses"] + table["ties"]
    return {arm: {"arm": arm, "tasks": int(r.tasks), "games": int(r.games), "wins": int(r.wins),
                  "losses": int(r.losses), "ties": int(r.ties),
                  "win_rate": float((r.wins + r.ties / 2) / r.games) if r.games else None}
            for arm, r in table.iterrows()}


# ---------------------------------------------------------------------------
# Cost


def normalised_cost(records: list[dict[str, Any]], key: str) -> dict[str, float | None]:
    """Each arm's mean spend per task, every task weighed alike: spend / the task's mean over its
    arms, averaged over tasks, times the mean task's spend. Doubling one task's spend for every
    arm changes no arm's share. An arm whose spend a task does not know is left out of that task's
    mean; None for an arm whose spend is unknown in every task."""
    ratios: dict[str, list[float]] = {}
    means = []
    for rec in records:
        spend = {a: b[key] for a, b in rec["best"].items() if b[key] is not None}  # unknown: left out
        if not spend:
            continue
        m = statistics.fmean(spend.values())
        means.append(m)
        for arm, v in spend.items():
            ratios.setdefault(arm, []).append(v / m if m > 0 else 0.0)
    scale = statistics.fmean(means) if means else 0.0
    arms = {a for rec in records for a in rec["best"]}
    return {a: statistics.fmean(ratios[a]) * scale if a in ratios else None for a in arms}


MIN_USD_PER_TASK = 0.01  # below a cent a task, a gain per dollar divides by rounding: none is shown


def per_unit(d_elo: float | None, spend: float | None, unit: float = 1.0) -> float | None:
    return None if d_elo is None or not spend or spend <= 0 else d_elo / (spend / unit)


def per_dollar(d_elo: float | None, usd: float | None) -> tuple[float | None, str | None]:
    """(Elo per dollar, None) where the spend is known and at least MIN_USD_PER_TASK; else (None,
    why not): a gain over a fraction of a cent is a huge number that says nothing."""
    if d_elo is None:
        return None, "no Elo"
    if usd is None:
        return None, "cost unknown"
    if usd < MIN_USD_PER_TASK:
        return None, f"under ${MIN_USD_PER_TASK:g}/task"
    return d_elo / usd, None
