"""The CLI's text: user text printed literally (`literal`), the figures' formats, a ledger row's line
(`row_text`) and the end-of-run summary (`summary_text`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text

from .. import ledger
from ..reporting import figures


STATUS_STYLE = {"keep": "green", "discard": "yellow", "skip": "dim", "repeat": "dim", "budget": "magenta", "stopped": "dim"}


def literal(*parts: str | tuple[str, str]) -> Text:
    """A Text from plain strings and (string, style) pairs: nothing in them is markup."""
    out = Text()
    for part in parts:
        if isinstance(part, tuple):
            out.append(part[0], style=part[1])
        else:
            out.append(part)
    return out


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def short(n: float) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else f"{n:.0f}"


def flow(items: list[str], width: int, sep: str = "  ") -> list[str]:
    """Whole items on as few lines of width as they fit (an item wider than a line: a line of its own)."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(sep) + len(item) <= width:
            lines[-1] += sep + item
        else:
            lines.append(item)
    return lines


def agent_label(model: str | None, agent: str) -> str:
    """The researcher as the screen names it: `model (agent)`; a `cmd:` template by its program,
    not its whole command line (`cmd: researcher.py`), so the label does not crowd the figures."""
    if agent.startswith("cmd:"):
        words = [Path(wd).name for wd in agent[len("cmd:"):].split() if "{" not in wd and not wd.startswith("-")]
        scripts = [wd for wd in words[1:] if "." in wd]  # `python3 researcher.py`: the script names it
        agent = "cmd: " + (scripts[0] if scripts and _interpreter(words[0]) else words[0] if words else "?")
    return f"{model or 'no model'} ({agent})"


def _interpreter(program: str) -> bool:
    return program.split(".")[0].rstrip("0123456789") in INTERPRETERS


INTERPRETERS = ("python", "node", "bash", "sh", "uv", "ruby", "perl", "deno", "bun")


def figures_fmt(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.6f}"


def row_text(row: ledger.Row, best: float | None, prefix: Any = "") -> Text:
    value = row.mean if row.mean is not None and row.status != "repeat" else row.metric  # the decided value
    metric = "-" if value is None else f"{value:.6f}"
    wall = f"  ({row.wall_s:.0f}s)" if row.wall_s is not None else ""
    return literal(prefix, f"{row.iteration:>4} ", (f"{row.status:8}", STATUS_STYLE.get(row.status, "red")),
                   f" {metric}  best {figures_fmt(best)}  ", row.description[:120], wall)


def summary_text(summary: Any, label: str = "") -> Text:
    """The end-of-run summary (loop.Summary), improvement signed as everywhere (+ = better)."""
    h = summary.headline
    out = Text()
    if label:
        out.append(label + "\n", style="bold")
    out.append(summary.stopped + "\n", style="bold")
    if h is None:
        out.append("no figures\n")
        return out
    base = f" vs baseline {figures_fmt(h.baseline)}" if h.baseline is not None else ""
    failed = f" ({h.failed_baselines} failed baseline attempt{'s' * (h.failed_baselines > 1)} not counted)" \
        if h.failed_baselines else ""
    out.append(f"best {figures_fmt(h.best)} (improvement {figures.signed(h.improvement)}{base}) at "
               f"{summary.best_commit or '-'} on branch {summary.branch}\n")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(summary.counts.items())) or "none"
    keep = "-" if h.keep_rate is None else f"{h.keep_rate:.0%}"
    out.append(f"{h.experiments} experiments: {counts}; keep rate {keep}{failed}\n")
    cost = figures.cost_text(h.cost_usd, getattr(h, "unknown_usage_calls", 0))
    out.append(f"tokens in {h.input_tokens}, out {h.output_tokens}; cost {cost}")
    return out


def short_cost(h: Any) -> str:
    """The cost in a line or a cell: `>=$X` when some calls' usage is unknown (figures.cost_text)."""
    if h.cost_usd is None:
        return "unknown"
    return f"{'>=' if getattr(h, 'unknown_usage_calls', 0) else ''}${h.cost_usd:.4f}"
