"""The one definition of a run's headline figures, used by every reader of a ledger.

The summary at the end of `harness run`, `harness status` (text and --json), the report and
summary.json all take baseline, best and improvement from `headline()`:

- the **baseline** is the first `keep` row (the harness writes the baseline as iteration 0,
  status `keep`, description `baseline`). A baseline attempt that failed (crash, timeout,
  invalid, before the first `keep`) is counted and shown as a failed baseline, never used
  as the baseline;
- the **best** is the last `keep` row: each keep beat the best before it, and the run branch
  holds it;
- **improvement** is positive when the best is better than the baseline, whatever the
  direction: `baseline - best` when minimizing, `best - baseline` when maximizing;
- **experiments** are the candidates after the baseline: not the baseline attempts, not
  `repeat` rows (extra training runs of code already counted), not `budget` rows (a stop
  marker).

This is karpathy/autoresearch's own reading of results.tsv (the first kept row is the
baseline, later kept rows are the improvements, the metric column holds the value), so its
analysis code gets the same figures; ledger.py writes the decided value into the metric
column to keep it so.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

FAILED = ("crash", "timeout", "invalid")
NOT_EXPERIMENTS = ("repeat", "budget")


def value_of(row: dict[str, Any]) -> float | None:
    """The value a decision compared: the mean over a candidate's runs, else its one run."""
    return row.get("mean") if row.get("mean") is not None else row.get("metric")


def baseline_index(rows: list[dict[str, Any]]) -> int | None:
    """Index of the baseline row: the first `keep`; None while no baseline has succeeded."""
    for i, r in enumerate(rows):
        if r.get("status") == "keep":
            return i
    return None


def is_baseline_attempt(rows: list[dict[str, Any]], i: int) -> bool:
    """Row i trained the unmodified code as the baseline (the harness numbers it iteration 0;
    a five-column ledger has no iteration, so every row up to the first keep is one)."""
    it = rows[i].get("iteration")
    if it is not None:
        return it == 0 and rows[i].get("status") != "repeat"
    first = baseline_index(rows)
    return first is None or i <= first


def experiments(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every candidate after the baseline (see the module docstring)."""
    return [r for i, r in enumerate(rows)
            if r.get("status") not in NOT_EXPERIMENTS and not is_baseline_attempt(rows, i)]


def failed_baselines(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for i, r in enumerate(rows) if is_baseline_attempt(rows, i) and r.get("status") in FAILED]


def improvement(direction: str, baseline: float | None, best: float | None) -> float | None:
    """Positive = better than the baseline, in metric units, for either direction."""
    if baseline is None or best is None:
        return None
    return best - baseline if direction == "maximize" else baseline - best


@dataclass
class Headline:
    metric: str
    direction: str
    baseline: float | None
    baseline_commit: str
    best: float | None
    best_commit: str
    improvement: float | None  # positive = better (see improvement())
    improvement_pct: float | None  # of |baseline|
    experiments: int  # candidates after the baseline (no repeats, no budget marker)
    counts: dict[str, int] = field(default_factory=dict)  # of those experiments, by status
    keep_rate: float | None = None  # kept / experiments; None before the first experiment
    failed_baselines: int = 0  # baseline attempts that crashed, timed out or were invalid
    repeats: int = 0  # extra training runs (baseline repeats, confirmations, health re-runs)
    budget_stop: bool = False  # the run ended on a --max-tokens/--max-cost `budget` row
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None  # None = unknown (a researcher call without a price)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def headline(rows: list[dict[str, Any]], metric: str = "metric", direction: str = "minimize") -> Headline:
    """A run's figures from its ledger rows (ledger.read_rows), by the rules above."""
    first = baseline_index(rows)
    kept = [r for r in rows if r.get("status") == "keep"]
    base_row = rows[first] if first is not None else None
    best_row = kept[-1] if kept else None
    base = value_of(base_row) if base_row else None
    best = value_of(best_row) if best_row else None
    gain = improvement(direction, base, best)
    exp = experiments(rows)
    counts: dict[str, int] = {}
    for r in exp:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    researched = [r for r in rows if r.get("agent_s") is not None]
    costs = [r.get("cost_usd") for r in researched]
    return Headline(
        metric=metric, direction=direction,
        baseline=base, baseline_commit=(base_row or {}).get("commit") or "",
        best=best, best_commit=(best_row or {}).get("commit") or "",
        improvement=gain,
        improvement_pct=None if gain is None or not base else 100 * gain / abs(base),
        experiments=len(exp), counts=counts,
        keep_rate=counts.get("keep", 0) / len(exp) if exp else None,
        failed_baselines=len(failed_baselines(rows)),
        repeats=sum(1 for r in rows if r.get("status") == "repeat"),
        budget_stop=any(r.get("status") == "budget" for r in rows),
        input_tokens=int(sum(r.get("input_tokens") or 0 for r in rows)),
        output_tokens=int(sum(r.get("output_tokens") or 0 for r in rows)),
        cost_usd=None if any(c is None for c in costs) else float(sum(costs)),
    )


def signed(value: float | None, digits: int = 6) -> str:
    """How an improvement is printed everywhere: with its sign, positive = better."""
    return "unknown" if value is None else f"{value:+.{digits}f}"
