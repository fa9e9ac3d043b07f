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
  marker), not `stopped` rows (a proposal that came back after the stop: its spend, never trained).

This is karpathy/autoresearch's own reading of results.tsv (the first kept row is the
baseline, later kept rows are the improvements, the metric column holds the value), so its
analysis code gets the same figures; ledger/ writes the decided value into the metric
column to keep it so.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

FAILED = ("crash", "timeout", "invalid")
NOT_EXPERIMENTS = ("repeat", "budget", "stopped")
# The columns the readers of a ledger ask for: present in every frame, empty when the ledger lacks them.
FRAME_COLUMNS = ("commit", "metric", "memory_gb", "status", "description", "iteration", "agent", "model", "parent",
                 "delta", "agent_s", "train_s", "wall_s", "input_tokens", "cached_tokens", "output_tokens",
                 "cost_usd", "retries", "candidate", "runs", "mean", "sigma", "sealed")
TEXT_COLUMNS = ("commit", "status", "description", "agent", "model", "parent", "sealed")


def frame(rows: list[dict[str, Any]]) -> "pd.DataFrame":
    """Ledger rows (ledger.read_rows) as a DataFrame: one row each, in ledger order (index 0..n-1),
    numeric cells as floats (NaN = empty), FRAME_COLUMNS always there."""
    import pandas as pd  # here, not at import time: `harness` starts without it

    df = pd.DataFrame.from_records(rows, index=range(len(rows)))
    for name in FRAME_COLUMNS:
        if name not in df:
            df[name] = None
        if name not in TEXT_COLUMNS:
            df[name] = pd.to_numeric(df[name], errors="coerce")
    return df


def known(value: Any) -> Any:
    """A cell as JSON wants it: NaN (an empty cell) is None, numpy numbers are Python's."""
    if value is None or value != value:
        return None
    return value.item() if hasattr(value, "item") else value


def value_of(row: dict[str, Any]) -> float | None:
    """The value a decision compared: the mean over a candidate's runs, else its one run."""
    return row.get("mean") if row.get("mean") is not None else row.get("metric")


def values(df: "pd.DataFrame") -> "pd.Series":
    """value_of, for every row of a frame."""
    return df["mean"].fillna(df["metric"])


def baseline_index(rows: list[dict[str, Any]]) -> int | None:
    """Index of the baseline row: the first `keep`; None while no baseline has succeeded."""
    for i, r in enumerate(rows):
        if r.get("status") == "keep":
            return i
    return None


def number(value: Any) -> float | None:
    """A cell as a number: None when empty, NaN or not a number (what frame() coerces to NaN)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if value != value else value


def baseline_flags(rows: list[dict[str, Any]]) -> list[bool]:
    """Which rows trained the unmodified code as the baseline (the harness numbers them iteration 0;
    a five-column ledger has no iteration, so every row up to the first keep is one)."""
    first_keep = next((i for i, r in enumerate(rows) if r.get("status") == "keep"), None)
    flags = []
    for i, r in enumerate(rows):
        iteration = number(r.get("iteration"))
        if iteration is None:
            flags.append(first_keep is None or i <= first_keep)
        else:
            flags.append(iteration == 0 and r.get("status") != "repeat")
    return flags


def experiment_flags(rows: list[dict[str, Any]], baseline: list[bool] | None = None) -> list[bool]:
    """Which rows are candidates after the baseline (see the module docstring); baseline: the rows'
    baseline_flags, when the caller has them."""
    baseline = baseline_flags(rows) if baseline is None else baseline
    return [r.get("status") not in NOT_EXPERIMENTS and not base for r, base in zip(rows, baseline)]


def experiment_mask(df: "pd.DataFrame") -> "pd.Series":
    """experiment_flags, for a frame's rows (the report's tables)."""
    import pandas as pd
    return pd.Series(experiment_flags(df.to_dict("records")), index=df.index, dtype=bool)


def experiments(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The experiments' rows, as dicts (experiment_flags)."""
    return [r for r, m in zip(rows, experiment_flags(rows)) if m]


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
    cost_usd: float | None = None  # None = unknown (a call whose tokens are known had no price); with
    # unknown_usage_calls, the cost of the calls that reported usage: the run cost at least this
    unknown_usage_calls: int = 0  # researcher calls killed before they reported usage (spend.unknown)
    baseline_runs: int | None = None  # training runs behind the baseline's value (its mean when > 1)
    best_runs: int | None = None  # training runs behind the best's value (1 + its confirmations)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def headline(rows: list[dict[str, Any]], metric: str = "metric", direction: str = "minimize") -> Headline:
    """A run's figures from its ledger rows (ledger.read_rows), by the rules above. Plain Python over
    the rows, no frame: the live display asks for it after every row of a night."""
    kept = [r for r in rows if r.get("status") == "keep"]
    base_row, best_row = (kept[0], kept[-1]) if kept else (None, None)
    base = None if base_row is None else _value(base_row)
    best = None if best_row is None else _value(best_row)
    gain = improvement(direction, base, best)
    base_flags = baseline_flags(rows)
    exp = [r for r, m in zip(rows, experiment_flags(rows, base_flags)) if m]
    counts: dict[str, int] = {}
    for r in exp:
        counts[str(r.get("status"))] = counts.get(str(r.get("status")), 0) + 1
    tokens = {k: [number(r.get(k)) for r in rows] for k in ("input_tokens", "output_tokens")}
    called = [number(r.get("agent_s")) is not None for r in rows]
    reported = [c and (i is not None or o is not None) for c, i, o in zip(called, *tokens.values())]
    costs = [number(r.get("cost_usd")) for r, rep in zip(rows, reported) if rep]  # reported tokens, no cost: unknown
    unknown = sum(1 for r, c, i, o in zip(rows, called, *tokens.values())
                  if c and (number(r.get("iteration")) or 0) > 0 and i is None and o is None)
    return Headline(
        metric=metric, direction=direction,
        baseline=base, baseline_commit=str(base_row.get("commit") or "") if base_row is not None else "",
        best=best, best_commit=str(best_row.get("commit") or "") if best_row is not None else "",
        improvement=gain,
        improvement_pct=None if gain is None or not base else 100 * gain / abs(base),
        experiments=len(exp), counts=counts,
        keep_rate=counts.get("keep", 0) / len(exp) if exp else None,
        failed_baselines=sum(1 for r, b in zip(rows, base_flags) if b and r.get("status") in FAILED),
        repeats=sum(1 for r in rows if r.get("status") == "repeat"),
        budget_stop=any(r.get("status") == "budget" for r in rows),
        input_tokens=int(sum(v for v in tokens["input_tokens"] if v is not None)),
        output_tokens=int(sum(v for v in tokens["output_tokens"] if v is not None)),
        cost_usd=None if any(c is None for c in costs) else math.fsum(costs),  # correctly rounded: 4 x $0.025 is $0.1
        unknown_usage_calls=unknown,
        baseline_runs=None if base_row is None else _runs(base_row),
        best_runs=None if best_row is None else _runs(best_row),
    )


def _value(row: dict[str, Any]) -> float | None:
    """value_of, as a number (a confirmed candidate's mean, else its one run)."""
    mean = number(row.get("mean"))
    return mean if mean is not None else number(row.get("metric"))


def cost_text(cost_usd: float | None, unknown_calls: int = 0, digits: int = 4) -> str:
    """A run's cost as every view shows it: unknown usage never hides the known cost."""
    if cost_usd is None:
        return "unknown (no price for this model; add one with --prices)"
    if unknown_calls:
        return (f"at least ${cost_usd:.{digits}f}; {unknown_calls} call{'s' * (unknown_calls != 1)} "
                f"with unknown usage")
    return f"${cost_usd:.{digits}f}"


def _runs(row: dict[str, Any]) -> int:
    """How many training runs a decided row's value is the mean of (1 when the ledger does not say)."""
    n = number(row.get("runs"))
    return int(n) if n else 1


def signed(value: float | None, digits: int = 6) -> str:
    """How an improvement is printed everywhere: with its sign, positive = better."""
    return "unknown" if value is None else f"{value:+.{digits}f}"
