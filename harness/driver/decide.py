"""The keep/discard rule: strict, or aware of the run-to-run noise of a fixed-time budget.

A fixed wall-clock budget makes the metric noisy (identical code trains a different number
of steps each run), so under the `noise` gate a candidate must beat the best by more than
the noise could explain, and a win is confirmed on more seeds before it is kept.
All functions here are pure.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable

KEEP, DISCARD, CONFIRM = "keep", "discard", "confirm"


@dataclass(frozen=True)
class GateSettings:
    gate: str = "noise"  # "strict" or "noise"
    direction: str = "minimize"
    keep_ties: bool = False
    min_delta: float = 0.0  # smallest improvement worth keeping, in metric units
    z: float = 2.0  # how many standard errors an improvement must exceed


def improvement(value: float, best: float, direction: str) -> float:
    """How much better value is than best (positive = better), whatever the direction."""
    return best - value if direction == "minimize" else value - best


def pooled_sigma(groups: Iterable[list[float]]) -> float | None:
    """Pooled standard deviation of repeated runs of identical code; None without any repeat."""
    num, dof = 0.0, 0
    for values in groups:
        if len(values) >= 2:
            num += statistics.variance(values) * (len(values) - 1)
            dof += len(values) - 1
    return math.sqrt(num / dof) if dof else None


def threshold(s: GateSettings, sigma: float | None, n: int, n_best: int) -> float:
    """The improvement a mean of n runs needs over a best measured n_best times."""
    if s.gate == "strict" or not sigma:
        return s.min_delta
    return max(s.min_delta, s.z * sigma * math.sqrt(1.0 / n + 1.0 / n_best))


def decide(s: GateSettings, values: list[float], best: float, n_best: int,
           sigma: float | None, can_confirm: bool) -> tuple[str, float]:
    """(keep | discard | confirm, the threshold used) for a candidate's runs so far."""
    mean = statistics.fmean(values)
    gain = improvement(mean, best, s.direction)
    thr = threshold(s, sigma, len(values), n_best)
    if s.gate == "strict" or not sigma:
        won = gain > thr or (s.keep_ties and gain >= thr)
        return (KEEP if won else DISCARD), thr
    if gain <= thr:
        return DISCARD, thr
    # Every win is confirmed before it is kept. A single run that cleared the bar is biased
    # low by its selection (the winner's curse): confirming borderline and implausible wins,
    # and all the others too, makes the best a mean the next candidates can fairly beat, and
    # each confirmation adds repeats to the noise estimate. Wins are rare, so this is cheap.
    if can_confirm:
        return CONFIRM, thr
    return KEEP, thr


def why_discarded(s: GateSettings, values: list[float], best: float, thr: float) -> str:
    """Why a discarded candidate whose value beats the best was not kept (its improvement did not
    clear the bar: the noise, or --min-delta); "" when it did not beat the best."""
    mean = statistics.fmean(values)
    if improvement(mean, best, s.direction) <= 0:
        return ""
    bar, sign = (best - thr, "<") if s.direction == "minimize" else (best + thr, ">")
    noise = s.gate == "noise" and thr > s.min_delta
    return f"{'within the noise' if noise else 'under --min-delta'}: needs {sign} {bar:.6f}"


def runs_of(rows: list[dict[str, Any]], iteration: int) -> list[float]:
    """Every measured run of one candidate's code: its first run, then its repeats (confirmation
    runs, re-runs of the best at health checkpoints) in ledger order."""
    # A failed attempt (a baseline that overran its budget, then --resume) measured nothing usable.
    first = [r["metric"] for r in rows if r.get("iteration") == iteration and r.get("status") in ("keep", "discard")
             and r.get("metric") is not None][:1]
    return first + [r["metric"] for r in rows if r.get("status") == "repeat" and r.get("metric") is not None
                    and r.get("candidate") is not None and int(r["candidate"]) == iteration]


def repeat_groups(rows: list[dict[str, Any]]) -> list[list[float]]:
    """Measured values grouped by identical code: each repeated candidate's runs (see runs_of)."""
    repeated = {int(r["candidate"]) for r in rows
                if r.get("status") == "repeat" and r.get("candidate") is not None and r.get("metric") is not None}
    groups = (runs_of(rows, c) for c in sorted(repeated))
    return [g for g in groups if len(g) >= 2]


def best_estimate(rows: list[dict[str, Any]], best: dict[str, Any]) -> tuple[float, int]:
    """The noise gate's value for the best: the mean over every run of its code, and how many.

    Re-runs of the best at health checkpoints count too, so the longer a best stands the more
    precisely it is known, and the luck of the run that got it kept is diluted.
    """
    values = runs_of(rows, int(best.get("iteration") or 0))
    if not values:
        return best["metric"], best.get("runs") or 1
    return statistics.fmean(values), len(values)
