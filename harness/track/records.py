"""Ledger rows -> tracker records: pure, so the live hook and the back-fill log the same thing.

Each ledger row becomes one record with a stable key (the run's tag and the row's position in
the append-only ledger), so syncing twice never logs a row twice. A `repeat` row's parent is
the candidate row it repeats; the best so far is computed in ledger order.
"""
from __future__ import annotations

import calendar
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import ledger

PARAMS = ("iteration", "parent", "agent", "model", "description", "lane", "arm", "seed", "candidate")
METRICS = ("memory_gb", "train_s", "agent_s", "wall_s", "input_tokens", "cached_tokens", "output_tokens",
           "cost_usd", "retries", "delta", "mean", "sigma", "runs")
FAILED = ("crash", "timeout")  # finished as FAILED in the tracker: no metric came out


@dataclass
class Record:
    key: str  # stable across syncs: "<tag>/<row index>"
    index: int  # the row's position in the ledger (0 = baseline)
    name: str
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]
    step: int  # metrics are stepped by iteration, so the tracker's charts follow the night
    start_ms: int | None
    end_ms: int | None
    failed: bool
    parent_key: str | None = None  # a repeat's candidate
    best: float | None = None  # the best so far after this row (None for repeats)
    files: dict[str, Path] = field(default_factory=dict)  # artifact name -> file on disk
    diff: tuple[str, str] | None = None  # (parent, commit) of a committed candidate


def key_of(tag: str, index: int) -> str:
    return f"{tag}/{index}"


def _ms(started_at: str | None) -> int | None:
    try:
        return calendar.timegm(time.strptime(started_at or "", "%Y-%m-%dT%H:%M:%SZ")) * 1000
    except ValueError:
        return None


def _name(row: dict[str, Any]) -> str:
    it = row.get("iteration") or 0
    if row["status"] == "repeat" or row.get("candidate") is not None:
        return f"{it:04d} repeat seed {row.get('seed')}"
    return f"{it:04d} {row['status']}" + (" baseline" if it == 0 else "")


def _files(run_dir: Path, row: dict[str, Any]) -> dict[str, Path]:
    logs = run_dir / "logs"
    it = row.get("iteration") or 0
    found: dict[str, Path] = {}
    if row.get("log"):
        found["logs/" + Path(row["log"]).name] = run_dir / row["log"]
    if row["status"] != "repeat" and row.get("candidate") is None:
        for name in (f"iter-{it:04d}.log", f"iter-{it:04d}-agent.log"):  # training, researcher
            found.setdefault("logs/" + name, logs / name)
    return {name: path for name, path in found.items() if path.is_file()}


def build(rows: list[dict[str, Any]], tag: str, metric: str, run_dir: Path) -> list[Record]:
    """One record per ledger row, in ledger order."""
    out: list[Record] = []
    primary: dict[int, str] = {}  # iteration -> key of its latest candidate row
    best: float | None = None
    for index, row in enumerate(rows):
        key = key_of(tag, index)
        it = row.get("iteration") or 0
        is_repeat = row["status"] == "repeat" or row.get("candidate") is not None
        params = {k: ledger.one_line(str(row[k]), 500) for k in PARAMS
                  if row.get(k) is not None and row.get(k) != ""}
        metrics = {k: float(row[k]) for k in METRICS if row.get(k) is not None}
        # The metric is the value the decision used, as in the ledger's metric column and the best:
        # a confirmed candidate's mean over its runs (its first run's own value beside it as
        # first_run; each confirmation run is a child run of it), else its one run.
        value = row.get("metric") if is_repeat else ledger.decided_value(row)
        if value is not None:
            metrics[metric] = float(value)
        if not is_repeat and row.get("metric") is not None and value != row.get("metric"):
            metrics["first_run"] = float(row["metric"])
        tags = {"status": row["status"], "commit": row.get("commit") or "", "sealed": row.get("sealed") or "",
                "harness.run": tag, "harness.row": str(index), "harness.iteration": str(it),
                "mlflow.note.content": row.get("description") or ""}
        start = _ms(row.get("started_at"))
        end = None if start is None else start + int(1000 * (row.get("wall_s") or row.get("train_s") or 0))
        rec = Record(key, index, _name(row), params, metrics, tags, it, start, end,
                     row["status"] in FAILED, files=_files(run_dir, row))
        if is_repeat:
            rec.parent_key = primary.get(row.get("candidate") if row.get("candidate") is not None else it)
        else:
            primary[it] = key
            if row["status"] == "keep":
                best = ledger.decided_value(row)
            rec.best = best
            if best is not None:
                metrics[f"best_{metric}"] = best
            if row.get("commit") and row.get("parent") and row["status"] not in ("skip", "budget"):
                rec.diff = (row["parent"], row["commit"])
        out.append(rec)
    return out
