"""results.tsv: one schema everywhere, append-only, one row per evaluated candidate.

The first five columns are karpathy/autoresearch's (commit, <metric>, memory_gb, status,
description); ours follow. Readers accept any prefix of the schema, a five-column file included.
"""
from __future__ import annotations

import csv
import math
import io
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import guard as ledgerguard

# `repeat` marks an extra training run of a candidate (baseline repeats, confirmation runs):
# its own row, so the GPU time it spent is visible, linked by the `candidate` column.
STATUSES = ("keep", "discard", "crash", "timeout", "invalid", "skip", "budget", "repeat", "stopped")
# `stopped`: a proposal that returned after the run was told to stop; never trained, its spend kept.

# Columns after the metric column, in order. The schema only ever grows at the end.
TAIL_COLUMNS = (
    "memory_gb", "status", "description",
    "iteration", "arm", "agent", "model", "parent", "best_before", "delta", "started_at",
    "agent_s", "train_s", "wall_s", "input_tokens", "cached_tokens", "output_tokens",
    "cost_usd", "retries", "log",
    "seed", "candidate", "runs", "mean", "sigma",
    "sealed",
    "lane",
    "node",
    "first_run",
    "kind", "reason",
    "start",
)
# What a row is (the `kind` column), so no reader takes meaning back out of a description:
KINDS = ("baseline", "candidate", "reeval", "confirm", "health", "budget", "stopped")
# reeval: a win trained again on a best another lane moved meanwhile (a number of its own);
# confirm: a confirmation run of a candidate (status `repeat`), failed or not; health: a re-run of
# the best at a health checkpoint; stopped: a proposal that came back after the run's stop (its
# spend, never trained). The `reason` column is a short code of why a row is not a plain keep or
# discard (reason_code), "" otherwise.
NUMERIC = {"memory_gb", "iteration", "best_before", "delta", "agent_s", "train_s", "wall_s",
           "input_tokens", "cached_tokens", "output_tokens", "cost_usd", "retries",
           "seed", "candidate", "runs", "mean", "sigma", "lane", "first_run"}
INTEGER = {"iteration", "input_tokens", "cached_tokens", "output_tokens", "retries", "seed", "candidate", "runs",
           "lane"}


def columns(metric: str) -> list[str]:
    return ["commit", metric, *TAIL_COLUMNS]


def one_line(text: str, limit: int = 300) -> str:
    """Descriptions are one line: tabs and newlines become spaces, long text is cut."""
    flat = " ".join(str(text).replace("\t", " ").split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


@dataclass
class Row:
    commit: str
    metric: float | None
    status: str
    description: str
    iteration: int
    memory_gb: float | None = None
    arm: str = ""
    agent: str = ""
    model: str = ""
    parent: str = ""
    best_before: float | None = None
    delta: float | None = None
    started_at: str = ""
    agent_s: float | None = None
    train_s: float | None = None
    wall_s: float | None = None
    input_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    retries: int | None = None
    log: str = ""
    seed: int | None = None
    candidate: int | None = None  # for `repeat` rows: the iteration they repeat
    runs: int | None = None  # training runs behind this decision (1 + confirmations)
    mean: float | None = None  # the mean over those runs: the value that was compared
    sigma: float | None = None  # the noise floor at decision time
    sealed: str = ""  # yes: the metric came from a verified sealed result; no: from stdout; "": no training
    lane: int | None = None  # the lane (one per GPU) that trained it; None outside the lane scheduler
    node: str = ""  # the machine that trained it (local: the hostname; Ray: host/node id); "": no training
    kind: str = "candidate"  # KINDS
    reason: str = ""  # reason_code(...) of a row that is not a plain keep or discard
    start: str = ""  # warm: the job was handed to an interpreter started before it (executors/warm.py); cold; "": none
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    def cells(self) -> list[str]:
        # The first five columns look like karpathy/autoresearch's: 0.997900, 44.0. The metric
        # column holds the value the decision used (the mean of a candidate's runs, when it had
        # several), so a reader of the first five columns gets the harness's own figures
        # (figures.py); the first run's own value is then kept in `first_run`.
        first = None if self.metric is None or math.isnan(self.metric) else self.metric
        decided = self.mean if self.mean is not None and self.status != "repeat" else first
        head = [self.commit[:12], "" if decided is None else f"{decided:.6f}",
                "" if self.memory_gb is None else f"{self.memory_gb:.1f}", self.status, self.description]
        tail = [(first if decided != first else None) if c == "first_run" else getattr(self, c)
                for c in TAIL_COLUMNS[3:]]
        return [_fmt(v) for v in head + tail]


# The reasons a job or a proposal failed, by the words the harness itself wrote them with (the
# runner's, the executors' and the guard's reasons): the code is taken once, where the row is made.
_REASONS = (("infrastructure: the disk is full", "disk_full"), ("infrastructure:", "infrastructure"),
            ("conflicts with the new best", "rebase_conflict"), ("interrupted", "interrupted"),
            ("log bound", "bound"), ("memory bound", "bound"), ("disk bound", "bound"), ("processes", "bound"),
            ("HARNESS_TIME_BUDGET", "over_budget"), ("deadline", "deadline"), ("no training output", "stall"),
            ("syntax error", "syntax"), ("researcher failed", "researcher"), ("exit code", "exit"),
            ("already evaluated", "duplicate"), ("already in the best", "duplicate"), ("no '", "no_metric"))


def reason_code(status: str, text: str = "") -> str:
    """A short code for why a row is not a plain keep or discard ("" for those)."""
    if status in ("keep", "discard", "repeat") and not text:
        return ""
    low = (text or "").lower()
    for words, code in _REASONS:
        if words.lower() in low:
            return code
    return status if status not in ("keep", "discard", "repeat") else "failed"


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if value != value:  # NaN
            return ""
        return f"{value:.6f}".rstrip("0").rstrip(".") if abs(value) < 1e6 else f"{value:.6g}"
    return one_line(str(value), limit=10_000)


def append(path: Path, metric: str, row: Row) -> None:
    """Append one row (writing the header first for a new file), flushed and fsynced.

    The harness's own copy is written first and the ledger checked against it (guard.py).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    current = ledgerguard.sync(path)  # a torn line repaired, an edit behind our back undone
    new = not current
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_NONE,
                        escapechar=None, quotechar=None)
    if new:
        writer.writerow(columns(metric))
    writer.writerow(row.cells())
    ledgerguard.append(path, buf.getvalue().encode("utf-8"), current)


# Parsed rows of each ledger read, so a long night does not parse every row again at every read:
# path -> (the file's signature when read, the bytes parsed, their rows). An unchanged file is not
# read again; of a changed one only the lines appended since are parsed.
_PARSED: dict[str, tuple[tuple | None, bytes, list[dict[str, Any]]]] = {}
_PARSED_LOCK = threading.Lock()
FRESH_NS = 100_000_000  # ns: a ledger changed this recently is read again whatever its signature


def read_rows(path: Path, copy: bool = True) -> list[dict[str, Any]]:
    """Rows as dicts with numeric columns parsed (None where empty or absent).

    A torn last line (no trailing newline after a crash mid-write) is ignored. copy=False returns
    the cached dicts themselves, for the per-iteration readers that only look (no O(rows) copy).
    """
    key = str(Path(path).resolve())
    try:
        sig = _signature(os.stat(key))
    except FileNotFoundError:
        return []
    with _PARSED_LOCK:
        seen_sig, seen, rows = _PARSED.get(key, (None, b"", []))
    if sig != seen_sig or time.time_ns() - sig[3] < FRESH_NS:  # changed: parse what is new since
        try:
            data = Path(key).read_bytes()
        except FileNotFoundError:
            return []
        data = data[:data.rfind(b"\n") + 1]  # a torn last line: never completed
        if not (seen and data.startswith(seen)):
            seen, rows = b"", []
        if len(data) > len(seen):
            rows = rows + _parse_lines(data, len(seen))
        with _PARSED_LOCK:
            _PARSED[key] = (sig, data, rows)
    return [dict(r) for r in rows] if copy else list(rows)


def _signature(st: os.stat_result) -> tuple[int, int, int, int]:
    """What changes whenever a file's bytes do (ctime cannot be set back by a process). File
    times tick in steps of the kernel's coarse clock, so a signature younger than FRESH_NS
    could still hide a same-size rewrite in the same tick: such a file is read again."""
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _parse_lines(data: bytes, start: int) -> list[dict[str, Any]]:
    """The rows in data[start:] (whole lines), with the header from data's first line."""
    header = data[:data.find(b"\n")].decode("utf-8").split("\t")
    metric = header[1] if len(header) > 1 else "metric"
    lines = data[start:].decode("utf-8").split("\n")[:-1]
    if start == 0:
        lines = lines[1:]
    out = []
    for line in lines:
        if not line.strip():
            continue
        cells = line.split("\t")
        rec: dict[str, Any] = {}
        for i, name in enumerate(header):
            raw = cells[i] if i < len(cells) else ""
            key = "metric" if name == metric and i == 1 else name
            rec[key] = _parse(key, raw)
        rec.setdefault("metric", None)
        for name in TAIL_COLUMNS:  # older and five-column ledgers: the newer figures are unknown
            rec.setdefault(name, None)
        if rec["first_run"] is not None:  # the metric column holds the mean; `metric` is one run
            rec["metric"] = rec["first_run"]
        out.append(rec)
    return out


def rename_metric(path: Path, metric: str) -> bool:
    """The metric column's header set to metric (--rebaseline with a corrected metric name: no row
    has a value under the old one, since no baseline succeeded). True when it changed."""
    path = Path(path)
    data = ledgerguard.sync(path)
    if not data:
        return False
    end = data.find(b"\n")
    header = data[:end].decode("utf-8").split("\t")
    if len(header) < 2 or header[1] == metric:
        return False
    header[1] = metric
    ledgerguard.replace(path, "\t".join(header).encode("utf-8") + data[end:])
    return True


def metric_name(path: Path) -> str | None:
    if not Path(path).exists():
        return None
    first = Path(path).read_text(encoding="utf-8").split("\n", 1)[0].split("\t")
    return first[1] if len(first) > 1 else None


def _parse(key: str, raw: str) -> Any:
    if raw == "":
        return None
    if key == "metric" or key in NUMERIC:
        try:
            value = float(raw)
        except ValueError:
            return None
        if key in INTEGER:
            return int(value)
        return value
    return raw


def best_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The current best is the last kept row (each keep beat the one before it; figures.py)."""
    kept = [r for r in rows if r.get("status") == "keep"]
    return kept[-1] if kept else None


def decided_value(row: dict[str, Any]) -> float | None:
    """The value a decision compared: the mean over a candidate's runs, else its one run."""
    return row.get("mean") if row.get("mean") is not None else row.get("metric")
