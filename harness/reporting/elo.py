"""`harness elo`: Bradley-Terry ratings of researchers (arms) across tasks, from ledgers alone.

Within each task (elo_data.py says what arms and tasks are), every arm's best so far at the
spend all of the task's arms reached is compared with every other's: a win, a loss, or a tie
when the gap is within the task's noise floor. The pairs of all tasks are fitted at once
(elo_fit.py), with intervals from its posterior (docs/elo.md: why); cost is normalised per task before
it is averaged (the games and the cost: elo_games.py). Everything here is pure but `write`; docs/elo.md explains every figure.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from . import elo_data, elo_fit, repeats
from .elo_data import BUDGETS, EloInputError, Task
from .elo_games import arm_records, normalised_cost, outcome_arrays, pairwise, per_dollar, per_unit, task_outcomes

POINTS = (0.25, 0.5, 0.75, 1.0)  # budget points, as fractions of each task's common budget
DEFAULT_DRAWS = 1000
DEFAULT_LEVEL = 0.95
DEFAULT_TIE_Z = 1.0  # a tie: the gap is within this many standard errors of the difference
CONTROL_AGENT = "mutate"
FEW_TASKS = 5  # below this many compared tasks the intervals say little: a note says so
ONE_TASK = "one task: no interval"


@dataclass(frozen=True)
class Settings:
    budget: str = "gpu-hours"
    anchor: str | None = None
    draws: int = DEFAULT_DRAWS
    seed: int = 0
    level: float = DEFAULT_LEVEL
    tie_z: float = DEFAULT_TIE_Z
    points: tuple[float, ...] = POINTS
    arm_by: str = "researcher"  # or "folder": each run folder's name is its arm
    interval: str = "posterior"  # or "bootstrap" (over tasks: the method before issue 24)
    weigh: str = "ranking"  # each task's pairs weighed as its ranking warrants (elo.task_weights)
    jeffreys: bool = True  # the posterior's prior: Jeffreys' times the small normal (False: the normal alone)


# ---------------------------------------------------------------------------
# The analysis


def _anchor(arms: list[str], members: list[int], agents: dict[str, str | None], wanted: str | None) -> int:
    if wanted is not None and arms.index(wanted) in members:
        return arms.index(wanted)
    controls = [i for i in members if agents.get(arms[i]) == CONTROL_AGENT]
    return controls[0] if controls else members[0]


def task_weights(rule: str, games: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Each task's weight on its pairs (games: T x A x A of one component, theta its fitted
    log-strengths). "ranking": elo_fit.ranking_weight at the fit, for the task's own arms (what the
    coverage benchmark chose: docs/elo.md); "equal": its value for alike arms, 3 / (A + 1);
    "2/A": the weight before; "none": 1."""
    arms = [tuple(np.flatnonzero(g.sum(axis=1) > 0)) for g in games]
    if rule == "none":
        return np.ones(len(arms))
    if rule == "2/A":
        return np.array([2.0 / max(len(a), 2) for a in arms])
    if rule == "equal":
        return np.array([3.0 / (max(len(a), 2) + 1) for a in arms])
    if rule != "ranking":
        raise ValueError(f"unknown task weight {rule!r}")
    cache: dict[tuple[int, ...], float] = {}
    for a in arms:
        if a not in cache:
            cache[a] = elo_fit.ranking_weight(theta[list(a)])
    return np.array([cache[a] for a in arms])


def fit_component(members: list[int], anchor: int, scores: np.ndarray, games: np.ndarray,
                  settings: Settings) -> tuple[np.ndarray, np.ndarray | None, int]:
    """Elo, the draws its intervals come from, and the tasks used, of one component of the
    comparison graph (members and anchor index arms). Draws: settings.interval "posterior" (the
    Bradley-Terry posterior under Jeffreys' prior, each task's pairs weighed by task_weights) or "bootstrap" (over tasks); none without settings.draws, and none under the
    posterior from one task (ONE_TASK: a single win, loss or tie per pair says nothing of its own
    uncertainty)."""
    sub = np.ix_(range(scores.shape[0]), members, members)
    s, g = scores[sub], games[sub]
    used = g.sum(axis=(1, 2)) > 0  # only the tasks that compare arms of this component
    s, g = s[used], g[used]
    a = members.index(anchor)
    elo = elo_fit.fit_elo(s.sum(axis=0), g.sum(axis=0), a)
    tasks = int(used.sum())
    if settings.draws <= 0 or (settings.interval == "posterior" and tasks < 2):
        return elo, None, tasks
    if settings.interval == "bootstrap":
        return elo, elo_fit.bootstrap_elo(s, g, a, settings.draws, settings.seed), tasks
    # A task ranks its A arms from one result each: its A(A-1)/2 pairs are not independent games.
    # Weighed by how much they share (elo_fit.ranking_weight, at the fit), the likelihood has the
    # curvature the ranking warrants (docs/elo.md).
    w = task_weights(settings.weigh, g, elo_fit.fit_logits(s.sum(axis=0), g.sum(axis=0)))
    draws = elo_fit.posterior_elo(np.tensordot(w, s, axes=1), np.tensordot(w, g, axes=1), a,
                                  settings.draws, settings.seed, jeffreys=settings.jeffreys)
    return elo, draws, tasks


def intervals(draws: np.ndarray | None, level: float, n: int) -> list[tuple[float, float] | None]:
    return [None if draws is None else elo_fit.interval(draws[:, k], level) for k in range(n)]


def _load(paths: list[Path], settings: Settings) -> tuple[list[elo_data.Trajectory], list[str]]:
    loaded = [(p, elo_data.load(p, settings.arm_by)) for p in elo_data.find_ledgers(paths)]
    trajs = [t for _, t in loaded if t is not None]
    if not trajs:
        raise EloInputError("no ledger has a measured baseline yet: nothing to compare.")
    return trajs, [f"{p}: no measured baseline yet, left out." for p, t in loaded if t is None]


def rate(arms: list[str], trajs: list[elo_data.Trajectory], played: pd.DataFrame, n_tasks: int,
         settings: Settings) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Each arm's record and rating, fitted per component of the comparison graph; the components."""
    scores, games = outcome_arrays(played, n_tasks, arms)
    record = arm_records(played, arms)
    agents = {t.arm: t.agent for t in trajs}
    models = {t.arm: t.model for t in reversed(trajs)}  # the first ledger's model
    table: dict[str, dict[str, Any]] = {}
    groups = []
    for c, members in enumerate(elo_fit.components(games.sum(axis=0))):
        anchor = _anchor(arms, members, agents, settings.anchor)
        if len(members) == 1:
            elo, cis, used = [None], [None], 0
        else:
            elo, draws, used = fit_component(members, anchor, scores, games, settings)
            cis = intervals(draws, settings.level, len(members))
        groups.append({"arms": [arms[i] for i in members], "anchor": arms[anchor], "tasks": used})
        for k, i in enumerate(members):
            e = None if elo[k] is None or np.isnan(elo[k]) else float(elo[k])
            table[arms[i]] = {**record[arms[i]], "component": c, "elo": e, "anchor": i == anchor,
                              "ci": None if cis[k] is None else list(cis[k]),
                              "agent": agents.get(arms[i]), "model": models.get(arms[i])}
    return table, groups


def add_cost(table: dict[str, dict[str, Any]], records: list[dict[str, Any]]) -> None:
    """Tokens and dollars per task (normalised per task), and the gain over the anchor per each
    (per dollar only where the cost is known and not trivial: elo_per_usd_note says why not)."""
    for key, name in (("tokens", "tokens_per_task"), ("cost_usd", "usd_per_task")):
        for arm, v in normalised_cost(records, key).items():
            table[arm][name] = v
    for row in table.values():
        gain = None if row["elo"] is None else row["elo"] - elo_fit.ANCHOR_ELO
        row["elo_per_1k_tokens"] = per_unit(gain, row.get("tokens_per_task"), 1000.0)
        row["elo_per_usd"], row["elo_per_usd_note"] = per_dollar(gain, row.get("usd_per_task"))
        if row["elo"] is not None and row["anchor"]:
            row["elo_per_usd"], row["elo_per_usd_note"] = None, "the anchor"  # 0 per dollar by definition


def analyze(paths: list[Path], settings: Settings = Settings(),
            progress: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """Everything `harness elo` shows, as one JSON-able dict."""
    if settings.budget not in BUDGETS or settings.budget == "iterations":
        raise EloInputError(f"unknown budget {settings.budget!r}; choose gpu-hours, tokens, usd or wall.")
    trajs, notes = _load(paths, settings)
    tasks = elo_data.build_tasks(trajs, settings.budget)
    arms = list(dict.fromkeys(t.arm for t in trajs))
    if settings.anchor is not None and settings.anchor not in arms:
        raise EloInputError(f"--anchor {settings.anchor!r} is not an arm here; the arms are: {', '.join(arms)}.")
    progress(f"{len(trajs)} ledgers, {len(arms)} arms, {len(tasks)} tasks; fitting with "
             f"{settings.draws} {settings.interval} draws")
    played, per_task = task_outcomes(tasks, 1.0, settings.tie_z)
    table, groups = rate(arms, trajs, played, len(tasks), settings)
    add_cost(table, per_task)
    notes += graph_notes(groups, tasks) + unanimous_notes(table)
    pairs = [{"arm": arm, "opponent": opponent, **{k: int(v) for k, v in r.items()}}
             for (arm, opponent), r in pairwise(played).iterrows()]
    return {"budget": settings.budget, "unit": BUDGETS[settings.budget][0], "level": settings.level,
            "draws": settings.draws, "interval": settings.interval, "seed": settings.seed, "tie_z": settings.tie_z,
            "anchor_elo": elo_fit.ANCHOR_ELO, "components": groups,
            "arms": [table[a] for a in arms], "marginal": marginal(table, groups),
            "by_budget": elo_by_point(tasks, arms, groups, settings), "tasks": per_task, "notes": notes,
            "pairwise": pairs, "consistency": consistency(pairs, per_task),
            "ledgers": [str(t.path) for t in trajs],
            "ledger_arms": {str(Path(t.path).resolve()): t.arm for t in trajs}}


def consistency(pairs: list[dict[str, Any]], per_task: list[dict[str, Any]]) -> dict[str, Any]:
    """The consistency of repeats (repeats.py): per pair, per arm, and each arm's spread of final
    improvement (at the compared point) over the repeats of each workload."""
    finals: dict[tuple[str, str], list[float]] = {}
    for t in per_task:
        for arm, b in t["best"].items():
            finals.setdefault((arm, t["workload"]), []).append(b["improvement"])
    spreads = [{"arm": arm, "workload": w, **s} for (arm, w), v in finals.items() if (s := repeats.spread(v))]
    pair_rates = repeats.pair_consistency(pairs)
    disagree = []
    for s in spreads:
        others = {o["arm"]: o["mean"] for o in spreads if o["workload"] == s["workload"] and o["arm"] != s["arm"]}
        line = repeats.disagreement(s["arm"], s, others)
        disagree += [f"On {s['workload']}: {line}"] if line else []
    return {"pairs": pair_rates, **repeats.arm_consistency(pair_rates), "spread": spreads, "disagree": disagree}


def elo_by_point(tasks: list[Task], arms: list[str], groups: list[dict[str, Any]],
                 settings: Settings) -> dict[str, dict[str, float | None]]:
    """Point estimates (no bootstrap) at each budget fraction: does the order hold early on?"""
    out: dict[str, dict[str, float | None]] = {}
    for f in settings.points:
        scores, games = outcome_arrays(task_outcomes(tasks, f, settings.tie_z)[0], len(tasks), arms)
        col: dict[str, float | None] = {}
        for group in groups:
            members = [arms.index(a) for a in group["arms"]]
            if len(members) == 1:
                col[arms[members[0]]] = None
                continue
            sub = np.ix_(members, members)
            elo = elo_fit.fit_elo(scores.sum(axis=0)[sub], games.sum(axis=0)[sub],
                                  members.index(arms.index(group["anchor"])))
            col.update({arms[i]: None if np.isnan(e) else float(e) for i, e in zip(members, elo)})
        out[f"{f:g}"] = col
    return out


def cost_order(rated: list[dict[str, Any]]) -> str:
    """"usd" when every rated arm's dollars are known and some are spent, else "tokens"."""
    usd = [r.get("usd_per_task") for r in rated]
    return "usd" if usd and all(u is not None for u in usd) and any(u > 0 for u in usd) else "tokens"


def marginal(table: dict[str, dict[str, Any]], groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per component, arms ordered by cost (dollars per task where every arm's are known, else
    tokens per task: the component's cost_order): what each step up in cost buys."""
    out = []
    for c, group in enumerate(groups):
        rated = [table[a] for a in group["arms"] if table[a]["elo"] is not None]
        group["cost_order"] = order = cost_order(rated)
        first = "usd_per_task" if order == "usd" else "tokens_per_task"
        second = "tokens_per_task" if order == "usd" else "usd_per_task"
        rated.sort(key=lambda r: (r.get(first) or 0.0, r.get(second) or 0.0, r["elo"]))
        prev = None
        for r in rated:
            step = {"arm": r["arm"], "component": c, "vs": None, "d_elo": None, "d_tokens": None,
                    "d_elo_per_1k_tokens": None, "d_usd": None, "d_elo_per_usd": None, "d_elo_per_usd_note": None}
            if prev is not None:
                d_elo = r["elo"] - prev["elo"]
                d_tok = (r.get("tokens_per_task") or 0.0) - (prev.get("tokens_per_task") or 0.0)
                known = r.get("usd_per_task") is not None and prev.get("usd_per_task") is not None
                d_usd = r["usd_per_task"] - prev["usd_per_task"] if known else None
                step.update(vs=prev["arm"], d_elo=d_elo, d_tokens=d_tok,
                            d_elo_per_1k_tokens=per_unit(d_elo, d_tok, 1000.0), d_usd=d_usd)
                if d_usd is not None and d_usd < 0:
                    step["d_elo_per_usd_note"] = "cheaper in dollars"
                else:
                    step["d_elo_per_usd"], note = per_dollar(d_elo, d_usd)
                    step["d_elo_per_usd_note"] = f"{note} more" if note and note.startswith("under") else note
            out.append(step)
            prev = r
    return out


def unanimous_notes(table: dict[str, dict[str, Any]]) -> list[str]:
    notes = []
    for row in table.values():
        if row["games"] and (row["wins"] == row["games"] or row["losses"] == row["games"]):
            how = "won" if row["wins"] == row["games"] else "lost"
            notes.append(f"{row['arm']} {how} every comparison: with no counter-example its distance to the others "
                         f"is held finite only by the fit's small penalty, so read it as a bound, not an estimate.")
    return notes


def graph_notes(groups: list[dict[str, Any]], tasks: list[Task]) -> list[str]:
    notes = []
    if len(groups) > 1:
        parts = "; ".join("{" + ", ".join(g["arms"]) + "}" for g in groups)
        notes.append(f"The comparison graph is not connected: arms in different groups never met in a task, so "
                     f"their ratings cannot be compared and each group is fitted on its own, with its own anchor. "
                     f"Groups: {parts}. Run the missing arms on a shared workload and repeat to join them.")
    alone = [t.label for t in tasks if len(t.trajectories) < 2]
    if alone:
        notes.append(f"{len(alone)} task(s) have one arm only and compare nothing: {', '.join(alone)}.")
    compared = [t for t in tasks if len(t.trajectories) >= 2]
    if len(compared) == 1:
        notes.append(f"{ONE_TASK}: an Elo from one task is one win, loss or tie per pair, its size set by the "
                     f"fit's prior, so it has no interval. Pool repeats or workloads for one.")
    elif 0 < len(compared) < FEW_TASKS:
        notes.append(f"Only {len(compared)} tasks compare arms: the intervals are wide (docs/elo.md). "
                     f"Add repeats or workloads.")
    fallback = [t.label for t in tasks if t.budget == "iterations"]
    if fallback:
        notes.append(f"Task(s) {', '.join(fallback)}: a ledger lacks the budget's column, so these arms were "
                     f"compared after the same number of experiments instead.")
    return notes


# ---------------------------------------------------------------------------
# Output


REPORT_DRAWS = 200  # the comparison report's section: quicker than `harness elo`'s default


def report_section(paths: list[Path]) -> dict[str, Any]:
    """The Elo result for the comparison report's runs (without the curves), or why there is none."""
    try:
        result = analyze(paths, Settings(draws=REPORT_DRAWS, points=(1.0,)))
    except EloInputError as e:
        return {"error": str(e)}
    for task in result["tasks"]:
        task.pop("curves", None)
    return result


def write(result: dict[str, Any], out: Path, markdown: str) -> dict[str, Path]:
    """elo.md and elo.json (and the plots, when matplotlib is there) under out."""
    from . import elo_render

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "elo.md", "json": out / "elo.json"}
    paths["markdown"].write_text(markdown)
    paths["json"].write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    for name, png in elo_render.plots(result).items():
        paths[name] = out / f"{name}.png"
        paths[name].write_bytes(png)
    return paths
