"""The comparison report's verdict: arms compared (an arm's repeats pooled), each claim with an interval.

An arm is every ledger of one researcher: a tournament's repeats of it, or the one ledger of an
A/B arm. The verdict ranks arms by their pooled improvement (the mean over repeats) and states,
for the two leading arms, the difference in improvement, improvement per GPU-hour, per 1M tokens
and per dollar, each with a 95% bootstrap interval: the repeats of each arm are resampled, and
within each repeat its experiments (a repeat's improvement is the sum of what its keeps gained,
so a resample of its experiments is another night of the same proposals), with the noise floor
added to each repeat's measured improvement. It names a better arm only where the interval
excludes zero. docs/report.md explains every line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..driver import decide
from . import figures

BOOTSTRAP_DRAWS = 10_000
BOOTSTRAP_SEED = 0
LEVEL = 0.95
# (figure, label, spend key in a unit's sample, its unit in the figure's denominator)
CLAIMS = (("improvement", "improvement", None, 1.0),
          ("improvement_per_gpu_hour", "improvement per GPU-hour", "train_s", 3600.0),
          ("improvement_per_1m_tokens", "improvement per 1M tokens", "tokens", 1e6),
          ("improvement_per_usd", "improvement per dollar", "cost_usd", 1.0))


@dataclass
class UnitSample:
    """One ledger's experiments as the bootstrap resamples them."""
    gain: np.ndarray  # per experiment: what it improved the best by (0 unless kept)
    spend: dict[str, np.ndarray | None]  # per experiment, its runs (repeats included); None = unknown
    fixed: dict[str, float | None]  # the rest of the ledger's spend (the baseline and its repeats)
    noise_sd: float  # the sd of a measured improvement (two measurements) from the noise floor
    accepted: list[int]  # per judged proposal (skips left out): 1 kept, 0 not


def unit_sample(rows: list[dict[str, Any]], direction: str, columns: tuple[str, ...],
                sigma: float | None) -> UnitSample:
    """One ledger's experiments, each with its gain and its spend (its repeats' runs included)."""
    exp = figures.experiments(rows)
    prev, gains = figures.headline(rows, direction=direction).baseline, []
    for r in exp:
        value = figures.value_of(r)
        kept = r.get("status") == "keep" and value is not None and prev is not None
        gains.append(decide.improvement(value, prev, direction) if kept else 0.0)
        prev = value if kept else prev
    spend: dict[str, np.ndarray | None] = {}
    fixed: dict[str, float | None] = {}
    for key, need in SPEND_COLUMNS.items():
        known = all(c in columns for c in need) and not (
            key == "cost_usd" and any(r.get("agent_s") is not None and r.get("cost_usd") is None for r in exp))
        if not known:  # the ledger lacks the column, or a researched row has no cost: unknown, not zero
            spend[key] = fixed[key] = None
            continue
        counted = exp if key == "cost_usd" else rows  # report.arm_figures' totals, row for row
        repeats: dict[int, float] = {}
        for r in rows:
            if r.get("status") == "repeat" and r.get("candidate") not in (None, 0):
                repeats[int(r["candidate"])] = repeats.get(int(r["candidate"]), 0.0) + _spend(r, key)
        per_exp = np.asarray([_spend(r, key) + (repeats.get(int(r.get("iteration") or -1), 0.0)
                                                if key != "cost_usd" else 0.0) for r in exp], dtype=float)
        spend[key] = per_exp
        fixed[key] = sum(_spend(r, key) for r in counted) - float(per_exp.sum())
    accepted = [int(r.get("status") == "keep") for r in exp if r.get("status") != "skip"]
    return UnitSample(np.asarray(gains, dtype=float), spend, fixed, math.sqrt(2) * (sigma or 0.0), accepted)


SPEND_COLUMNS = {"train_s": ("train_s",), "tokens": ("input_tokens", "output_tokens"), "cost_usd": ("cost_usd",)}


def _spend(row: dict[str, Any], key: str) -> float:
    if key == "tokens":
        return float((row.get("input_tokens") or 0) + (row.get("output_tokens") or 0))
    return float(row.get(key) or 0.0)


# ---------------------------------------------------------------------------
# The bootstrap of an arm's figures


def arm_draws(units: list[UnitSample], rng: np.random.Generator, draws: int) -> dict[str, np.ndarray | None]:
    """draws of each claim's figure for one arm: repeats resampled, then each repeat's experiments,
    plus the noise floor on each repeat's improvement. The figures pool the repeats as the report
    does: the mean improvement, and the improvement summed over repeats per spend summed."""
    n = len(units)
    picks = rng.integers(0, n, (draws, n)) if n > 1 else np.zeros((draws, 1), dtype=int)
    gain = np.zeros(draws)
    spent = {key: np.zeros(draws) for key in SPEND_COLUMNS}
    unknown = {key for key in SPEND_COLUMNS if any(u.spend[key] is None for u in units)}
    for slot in range(n):
        for k, u in enumerate(units):
            rows = np.flatnonzero(picks[:, slot] == k)
            if not len(rows):
                continue
            m = len(u.gain)
            idx = rng.integers(0, m, (len(rows), m)) if m else np.zeros((len(rows), 0), dtype=int)
            gain[rows] += u.gain[idx].sum(axis=1) + rng.normal(0.0, 1.0, len(rows)) * u.noise_sd
            for key in SPEND_COLUMNS.keys() - unknown:
                spent[key][rows] += u.spend[key][idx].sum(axis=1) + u.fixed[key]
    out: dict[str, np.ndarray | None] = {"improvement": gain / n}
    for figure, _, key, unit in CLAIMS[1:]:
        with np.errstate(divide="ignore", invalid="ignore"):
            out[figure] = None if key in unknown else np.where(spent[key] > 0, gain / (spent[key] / unit), np.nan)
    return out


def differences(a: list[UnitSample], b: list[UnitSample], draws: int = BOOTSTRAP_DRAWS,
                seed: int = BOOTSTRAP_SEED) -> dict[str, tuple[float, float] | None]:
    """Each claim's LEVEL interval for arm a's figure minus arm b's; None where unknown or undefined."""
    rng = np.random.default_rng(seed)
    da, db = arm_draws(a, rng, draws), arm_draws(b, rng, draws)
    out: dict[str, tuple[float, float] | None] = {}
    for figure, *_ in CLAIMS:
        if da[figure] is None or db[figure] is None:
            out[figure] = None
            continue
        diff = da[figure] - db[figure]
        diff = diff[~np.isnan(diff)]
        if len(diff) < draws / 2:  # most draws spent nothing: no ratio to compare
            out[figure] = None
            continue
        lo, hi = np.percentile(diff, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
        out[figure] = (float(lo), float(hi))
    return out


# ---------------------------------------------------------------------------
# Arms: an arm's repeats pooled


SUMMED = ("experiments", "repeat_runs", "gpu_minutes_discarded_failed", "train_s", "wall_s", "tokens", "cost_usd",
          "unsealed_runs", "unknown_usage_calls")
MEANS = ("baseline", "best", "improvement", "improvement_pct", "mean_agent_s", "mean_wall_s",
         "input_tokens_per_iteration", "cached_tokens_per_iteration", "output_tokens_per_iteration")


def _sum(values: list[Any]) -> Any:
    return None if any(v is None for v in values) else sum(values)


def _mean(values: list[Any]) -> Any:
    return None if any(v is None for v in values) else sum(values) / len(values)


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den == 0 else num / den


def acceptance(counts: dict[str, int]) -> float | None:
    """Keeps per proposal judged: a `skip` (code already evaluated) was never judged, so it is left out."""
    judged = sum(counts.values()) - counts.get("skip", 0)
    return _ratio(counts.get("keep", 0), judged)


def pooled(name: str, figs: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm's figures over its repeats: counts and spend summed, levels averaged, the ratios
    of the sums (mean improvement per mean spend)."""
    if len(figs) == 1:
        return {**figs[0], "repeats": 1, "units": [figs[0]["label"]]}
    out: dict[str, Any] = {"label": name, "arm": name, "repeats": len(figs), "units": [f["label"] for f in figs],
                           "ledger": ", ".join(f["ledger"] for f in figs), "metric": figs[0]["metric"],
                           "direction": figs[0]["direction"]}
    for key in ("agent", "model", "sandbox", "cost_source"):
        seen = sorted({str(f[key]) for f in figs if f[key] is not None})
        out[key] = " / ".join(seen) if seen else None
    counts: dict[str, int] = {}
    for f in figs:
        for status, n in f["counts"].items():
            counts[status] = counts.get(status, 0) + n
    out["counts"] = counts
    out.update({k: _sum([f[k] for f in figs]) for k in SUMMED})
    out.update({k: _mean([f[k] for f in figs]) for k in MEANS})
    sigmas = [f["noise_sigma"] for f in figs if f["noise_sigma"] is not None]
    out["noise_sigma"] = max(sigmas) if sigmas else None
    out["acceptance_rate"] = acceptance(counts)
    out["gpu_duty"] = _ratio(out["train_s"], out["wall_s"])
    total = _sum([f["improvement"] for f in figs])
    out["improvement_per_gpu_hour"] = _ratio(total, None if out["train_s"] is None else out["train_s"] / 3600)
    out["improvement_per_1m_tokens"] = _ratio(total, None if out["tokens"] is None else out["tokens"] / 1e6)
    out["improvement_per_usd"] = None if out["unknown_usage_calls"] else _ratio(total, out["cost_usd"])
    out["cost_text"] = figures.cost_text(out["cost_usd"], out["unknown_usage_calls"] or 0)
    return out


def group_units(keys: list[str]) -> list[list[int]]:
    """Indices of the units of each arm, arms in first-seen order."""
    order: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        order.setdefault(key, []).append(i)
    return list(order.values())


# ---------------------------------------------------------------------------
# The verdict


def _fmt(value: float, figure: str) -> str:
    return f"{value:+.6g}" if figure == "improvement" else f"{value:+.4g}"


def claim_lines(top: dict[str, Any], second: dict[str, Any], cis: dict[str, tuple[float, float] | None],
                how: str) -> tuple[list[str], dict[str, str | None]]:
    """One line per claim with its interval, and the arm each claim shows better (None: not shown)."""
    lines, better = [], {}
    for figure, label, *_ in CLAIMS:
        a, b, ci = top.get(figure), second.get(figure), cis.get(figure)
        if a is None or b is None or ci is None:
            better[figure] = None
            if figure != "improvement":
                lines.append(f"{label[0].upper() + label[1:]}: unknown or not applicable for an arm, so not compared.")
            continue
        side = top["label"] if ci[0] > 0 else second["label"] if ci[1] < 0 else None
        better[figure] = side
        lines.append(f"{label[0].upper() + label[1:]}: {top['label']} {_fmt(a, figure)} vs {second['label']} "
                     f"{_fmt(b, figure)}, difference {_fmt(a - b, figure)}, {LEVEL:.0%} interval "
                     f"[{_fmt(ci[0], figure)}, {_fmt(ci[1], figure)}] ({how}): "
                     + (f"{side} is better." if side else "the interval includes zero, so neither is shown better."))
    return lines, better


def verdict(arms: list[dict[str, Any]], samples: list[list[UnitSample]]) -> dict[str, Any]:
    """Compare the two leading arms (repeats pooled) on every claim; name a winner only when the
    improvement gap beats the baseline gap (a noise proxy) and its interval lies above zero."""
    out: dict[str, Any] = {"winner": None, "mixed_scaffolds": False, "ranked": [], "text": [], "better": {}}
    if len(arms) < 2:
        n = arms[0]["repeats"] if arms else 0
        out["text"].append("One run only: nothing to compare." if n <= 1 else
                           f"One arm only ({n} repeats): nothing to compare between arms; the consistency "
                           f"of its repeats is below.")
        return out
    if len({f["metric"] for f in arms}) > 1 or len({f["direction"] for f in arms}) > 1:
        out["text"].append("The runs measure different metrics or directions; they cannot be compared.")
        return out
    ranked = sorted(range(len(arms)), key=lambda i: -(arms[i]["improvement"]
                                                      if arms[i]["improvement"] is not None else float("-inf")))
    top, second = arms[ranked[0]], arms[ranked[1]]
    out["ranked"] = [arms[i]["label"] for i in ranked]
    agents = {str(f["agent"]) for f in (top, second) if f["agent"] is not None}
    out["mixed_scaffolds"] = len(agents) > 1
    if top["improvement"] is None or second["improvement"] is None:
        out["text"].append("No clear winner: an arm has no baseline or best value yet.")
        return out
    gap = top["improvement"] - second["improvement"]
    baseline_gap = abs(top["baseline"] - second["baseline"])
    sigmas = [f["noise_sigma"] for f in (top, second) if f["noise_sigma"] is not None]
    noise = max([baseline_gap, *sigmas])
    cis = differences(samples[ranked[0]], samples[ranked[1]])
    several = max(top["repeats"], second["repeats"]) > 1
    how = "bootstrap over repeats and their experiments" if several else "bootstrap of the experiments"
    lines, better = claim_lines(top, second, cis, how)
    out.update(improvement_gap=gap, baseline_gap=baseline_gap, noise=noise, better=better,
               intervals={k: None if v is None else list(v) for k, v in cis.items()})
    text = lines + [f"Noise: the two baselines differ by {baseline_gap:.6g}, a proxy for run-to-run noise"
                    + (f"; the measured noise floor (sigma) is {max(sigmas):.6g}" if sigmas else "")
                    + (f"; each arm's figures pool its repeats ({top['repeats']} and {second['repeats']})"
                       if several else "") + "."]
    text += acceptance_lines(top, second, samples[ranked[0]], samples[ranked[1]], out)
    if gap <= noise:
        text.append("**No clear winner**: the improvement gap is within the baseline difference.")
    elif better["improvement"] != top["label"]:
        text.append("**No clear winner**: the interval of the improvement difference includes zero.")
    else:
        out["winner"] = top["label"]
        text.append(f"**Winner: {top['label']}** ({top['agent']}, {top['model'] or 'no model'}): it improved more "
                    f"than {second['label']}, beyond the baseline noise and the interval.")
    if out["mixed_scaffolds"]:
        text.append("The comparison mixes scaffolds (agent backends " + " vs ".join(sorted(agents)) +
                    "): a difference may come from the scaffold, not the model.")
    if noise == 0:
        text.append("The noise proxy is zero (identical baselines, no measured spread): any gap counts. "
                    "Repeat the baseline (--baseline-runs) when training is not deterministic.")
    out["text"] = text
    return out


def acceptance_lines(top: dict[str, Any], second: dict[str, Any], a: list[UnitSample], b: list[UnitSample],
                     out: dict[str, Any]) -> list[str]:
    """The acceptance rates' difference, for information: a higher rate is no claim of a better arm."""
    ci = bootstrap_diff([v for u in a for v in u.accepted], [v for u in b for v in u.accepted])
    out.update(acceptance_diff=None if ci is None else ci[0], acceptance_ci95=None if ci is None else [ci[1], ci[2]])
    if ci is None:
        return ["Acceptance rates: an arm has no judged proposals yet, so there is no interval."]
    return [f"Acceptance rate (keeps per judged proposal; a skip is not judged) {top['label']} minus "
            f"{second['label']}: {ci[0]:+.1%}, 95% bootstrap interval [{ci[1]:+.1%}, {ci[2]:+.1%}]."]


def bootstrap_diff(a: list[int], b: list[int], draws: int = BOOTSTRAP_DRAWS,
                   seed: int = BOOTSTRAP_SEED) -> tuple[float, float, float] | None:
    """Difference of means a - b and its 95% percentile bootstrap interval (fixed seed)."""
    if not a or not b:
        return None
    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    da = xa[rng.integers(0, len(xa), (draws, len(xa)))].mean(axis=1)
    db = xb[rng.integers(0, len(xb), (draws, len(xb)))].mean(axis=1)
    lo, hi = np.percentile(da - db, [2.5, 97.5])
    return float(xa.mean() - xb.mean()), float(lo), float(hi)


def agree_with_elo(out: dict[str, Any], rated: dict[str, Any], ledgers: dict[str, list[Path]]) -> None:
    """The verdict and the Elo section never disagree: a winner is named only when the Elo across
    tasks ranks it above the runner-up too; the Elo difference is stated with its interval."""
    from .elo import ONE_TASK

    if len(out.get("ranked") or []) < 2 or "error" in rated:
        return
    by_ledger = rated.get("ledger_arms", {})
    label_arm = {label: by_ledger.get(str(Path(paths[0]).resolve())) for label, paths in ledgers.items()}
    table = {a["arm"]: a for a in rated.get("arms", [])}
    first, second = (table.get(label_arm.get(label) or "") for label in out["ranked"][:2])
    if first is None or second is None or first["elo"] is None or second["elo"] is None:
        return
    diff = first["elo"] - second["elo"]
    anchors = {g.get("anchor") for g in rated.get("components", [])}
    interval = None  # the difference's interval: each arm's interval is relative to its anchor
    if first["arm"] in anchors and second.get("ci"):
        interval = (first["elo"] - second["ci"][1], first["elo"] - second["ci"][0])
    elif second["arm"] in anchors and first.get("ci"):
        interval = (first["ci"][0] - second["elo"], first["ci"][1] - second["elo"])
    line = f"Elo across tasks: {out['ranked'][0]} minus {out['ranked'][1]} {diff:+.0f}"
    one_task = all(g.get("tasks") == 1 for g in rated.get("components", []))
    line += (f", interval [{interval[0]:+.0f}, {interval[1]:+.0f}]." if interval
             else f" ({ONE_TASK})." if one_task else ".")
    text = out["text"]
    text.insert(len(text) - (1 if out.get("mixed_scaffolds") else 0) - (1 if out.get("noise") == 0 else 0), line)
    # The Elo claims how often an arm wins a task: with few tasks its interval is wide whatever the
    # improvements say, so it vetoes a winner by its sign only (the Elo compares at the spend both
    # reached: an arm that improved more only by spending more is no winner).
    if out.get("winner") and diff <= 0:
        out["winner"] = None
        out["elo_disagrees"] = True
        text[:] = [t if not t.startswith("**Winner") else
                   f"**No clear winner**: the Elo across tasks ranks it no higher than {out['ranked'][1]}."
                   for t in text]
