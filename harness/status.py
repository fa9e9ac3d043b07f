"""`harness status`: a run's summary, computed from its ledger alone."""
from __future__ import annotations

from pathlib import Path

from . import events, ledger, spend
from .errors import HarnessError
from .step import pending


def find_ledger(repo: Path, tag: str | None) -> Path:
    runs = Path(repo) / "runs"
    if tag:
        path = runs / tag / "results.tsv"
        if not path.exists():
            raise HarnessError(f"no ledger for run {tag!r} at {path}; `ls {runs}` lists the runs.")
        return path
    found = sorted(runs.glob("*/results.tsv"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise HarnessError(f"no runs under {runs}; start one with `harness run`.")
    return found[-1]


def render_text(path: Path, last: int = 10, last_events: int = 3) -> str:
    rows = ledger.read_rows(path)
    metric = ledger.metric_name(path) or "metric"
    if not rows:
        return f"{path}: no rows yet (the baseline is still training)"
    counts: dict[str, int] = {}
    for r in rows[1:]:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    base = ledger.decided_value(rows[0])
    best = ledger.best_row(rows)
    best_value = ledger.decided_value(best) if best else None
    tokens_in = sum(r.get("input_tokens") or 0 for r in rows)
    tokens_out = sum(r.get("output_tokens") or 0 for r in rows)
    costs = [r.get("cost_usd") for r in rows[1:] if r.get("agent_s") is not None]
    cost = "unknown" if any(c is None for c in costs) else f"${sum(costs):.4f}"
    evaluated = sum(v for k, v in counts.items() if k not in ("budget", "repeat"))
    lines = [
        f"run: {path.parent.name}   ledger: {path}",
        f"experiments: {evaluated}   " + "  ".join(f"{k}: {v}" for k, v in sorted(counts.items())),
        f"baseline {metric}: {fmt(base)}   best: {fmt(best_value)} ({best.get('commit', '') if best else ''})"
        + (f"   improvement: {best_value - base:+.6f}" if base is not None and best_value is not None else ""),
        f"tokens in/out: {tokens_in}/{tokens_out}   cost: {cost}" + unknown_note(rows),
        "",
        f"{'iter':>4}  {'commit':12}  {metric:>10}  {'status':8}  description",
    ]
    for r in rows[-last:]:
        lines.append(f"{r.get('iteration') if r.get('iteration') is not None else '':>4}  "
                     f"{(r.get('commit') or ''):12}  {fmt(r.get('metric')):>10}  "
                     f"{r.get('status', ''):8}  {(r.get('description') or '')[:90]}")
    waiting = pending(path.parent, rows)
    if waiting:  # committed candidates an interruption left untrained
        lines += [""] + [f"waiting for --resume: iteration {d['iteration']} ({str(d['commit'])[:12]}) "
                         f"{str(d.get('description', ''))[:70]}" for _, d in waiting]
    happened, _ = events.read(path.parent)
    if happened:  # repairs, restores, health warnings and stops
        lines += ["", f"events: {len(happened)} (runs/{path.parent.name}/events.log); the latest:"]
        lines += [f"  {e.get('at', '')}  {e.get('kind', '')}: {str(e.get('message', ''))[:110]}"
                  for e in happened[-last_events:]]
    return "\n".join(lines)


def fmt(value) -> str:
    return "-" if value is None else f"{value:.6f}"


def unknown_note(rows: list[dict]) -> str:
    """How many calls' usage is unknown (killed before they reported): not counted above as zero."""
    n = spend.unknown_calls(rows)
    return f"   ({n} call{'s' if n != 1 else ''} with unknown usage, budgeted at the largest call)" if n else ""
