"""Consistency of repeats: would the same researcher, from the same baseline, do it again?

For an arm run several times (a tournament's `--repeats`, or several nights of one A/B):
- the spread of its final improvement across its repeats (per workload: metrics differ in scale);
- per pair of arms, how often the repeats agree on their order: (the more common of wins and
  losses + half the ties) / the tasks they met in, from 50% (a coin) to 100% (always the same
  order); per arm the mean over its pairs, and the gap between the most and the least consistent;
- the kept changes that recur: hyperparameters and code areas (report_diff's names) changed in
  kept commits of at least two of the arm's repeats.
All functions are pure; docs/report.md and docs/elo.md explain the figures.
"""
from __future__ import annotations

import statistics
from typing import Any

MIN_REPEATS = 2  # a spread, a consistency or a recurrence needs at least this many repeats


def spread(values: list[float]) -> dict[str, Any] | None:
    """Mean, sd, min and max of one arm's final improvements over its repeats; None with one."""
    values = [v for v in values if v is not None]
    if len(values) < MIN_REPEATS:
        return None
    return {"repeats": len(values), "mean": statistics.fmean(values), "sd": statistics.stdev(values),
            "min": min(values), "max": max(values)}


def pair_consistency(pairwise: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per pair that met in two tasks or more (elo's `pairwise`, both sides given)."""
    out, seen = [], set()
    for p in pairwise:
        key = frozenset((p["arm"], p["opponent"]))
        tasks = p["wins"] + p["losses"] + p["ties"]
        if key in seen or tasks < MIN_REPEATS:
            continue
        seen.add(key)
        out.append({"arm": p["arm"], "opponent": p["opponent"], "tasks": tasks,
                    "rate": (max(p["wins"], p["losses"]) + p["ties"] / 2) / tasks})
    return out


def arm_consistency(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each arm's mean consistency over its pairs; the most and least consistent arm and the gap."""
    rates: dict[str, list[float]] = {}
    for p in pairs:
        for arm in (p["arm"], p["opponent"]):
            rates.setdefault(arm, []).append(p["rate"])
    per_arm = {arm: statistics.fmean(r) for arm, r in rates.items()}
    if not per_arm:
        return {"per_arm": {}, "most": None, "least": None, "gap": None}
    most, least = max(per_arm, key=per_arm.get), min(per_arm, key=per_arm.get)
    return {"per_arm": per_arm, "most": most, "least": least, "gap": per_arm[most] - per_arm[least]}


def recurring(per_repeat: list[dict[str, list[str]] | None]) -> dict[str, list[list[Any]]] | None:
    """[name, repeats] of each name changed in kept commits of two repeats or more, most first;
    None when fewer than two repeats could be diffed."""
    known = [r for r in per_repeat if r is not None]
    if len(known) < MIN_REPEATS:
        return None
    out = {}
    for kind in ("hyperparameters", "code"):
        counts: dict[str, int] = {}
        for names in known:
            for name in set(names[kind]):
                counts[name] = counts.get(name, 0) + 1
        out[kind] = [[n, c] for n, c in sorted(counts.items(), key=lambda x: (-x[1], x[0])) if c >= MIN_REPEATS]
    return out


def disagreement(arm: str, own: dict[str, Any] | None, others: dict[str, float]) -> str | None:
    """A sentence when the arm's repeats differ from each other by more than its mean differs from
    the other arms' (others: arm -> mean improvement); None when they do not, or it cannot tell."""
    if own is None or not others:
        return None
    within = own["max"] - own["min"]
    between = min(abs(own["mean"] - m) for m in others.values())
    if within <= between:
        return None
    closest = min(others, key=lambda o: abs(own["mean"] - others[o]))
    return (f"{arm}'s {own['repeats']} repeats disagree with each other (improvements {own['min']:+.6g} to "
            f"{own['max']:+.6g}) more than {arm} differs from {closest} ({between:.6g} between the means): "
            f"one night of {arm} does not say what it would do again.")


def for_report(pooled: list[dict[str, Any]], figs: list[dict[str, Any]],
               changed: dict[str, dict[str, list[str]] | None]) -> dict[str, Any]:
    """The report's consistency of repeats: per arm with repeats (pooled figures, its units' figures,
    the names each unit changed in kept commits), the spread of its improvement and what recurs;
    and the sentences for the verdict where an arm's repeats disagree more than the arms do."""
    by_label = {f["label"]: f for f in figs}
    arms = {}
    for p in pooled:
        if p.get("repeats", 1) < MIN_REPEATS:
            continue
        units = [by_label[u] for u in p["units"]]
        arms[p["label"]] = {"spread": spread([u["improvement"] for u in units]),
                            "recurring": recurring([changed.get(u["label"]) for u in units])}
    means = {p["label"]: p["improvement"] for p in pooled if p["improvement"] is not None}
    disagree = []
    for label, a in arms.items():
        line = disagreement(label, a["spread"], {o: m for o, m in means.items() if o != label})
        disagree += [line] if line else []
    return {"arms": arms, "disagree": disagree}
