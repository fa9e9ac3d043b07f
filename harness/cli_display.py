"""What `harness run` and `harness ab` show on stderr while they work (the CLI's side only).

On a terminal: the rows scroll, and a status panel under them (rich Live) says the elapsed
time, the ETA, best and improvement, keep rate, GPU duty, tokens and cost so far, and what each
lane (or arm) is doing now. Elsewhere (a log file, a pipe): plain lines, the same figures in a
line after each row. Every text that comes from a user, a researcher or a ledger is printed
literally (rich Text), never read as markup.

The display is driven by the driver's progress events ("baseline", "start",
"iteration", "row", "event", "resumed", "stopping"); the figures themselves are read from the
ledgers by figures.headline, the one definition every reader uses.
"""
from __future__ import annotations

import collections
import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from . import figures, ledger

STATUS_STYLE = {"keep": "green", "discard": "yellow", "skip": "dim", "repeat": "dim", "budget": "magenta"}
REFRESH_PER_S = 2


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


@dataclass
class Watched:
    """One run (or one A/B arm) on screen."""
    name: str  # arm name, "" for a single run
    label: str  # model (agent)
    run_dir: Path
    hours: float | None = None
    iterations: int | None = None
    lanes: int = 1
    iteration: int = 0  # the last finished iteration
    head: figures.Headline | None = None
    walls: list[float] = field(default_factory=list)  # wall_s of the experiments on the ledger
    wall_total_s: float = 0.0
    train_total_s: float = 0.0
    now: dict[Any, dict[int, str]] = field(default_factory=dict)  # lane -> iteration -> phase
    stopped: str = ""

    def reload(self) -> None:
        path = self.run_dir / "results.tsv"
        rows = ledger.read_rows(path)
        manifest = _read_json(self.run_dir / "run.json").get("config", {})
        self.head = figures.headline(rows, ledger.metric_name(path) or "metric",
                                     manifest.get("direction", "minimize"))
        exp = figures.experiments(rows)
        self.walls = [r["wall_s"] for r in exp if r.get("wall_s")]
        if not self.walls:  # before the first experiment: the baseline's time is the best guess
            base = figures.baseline_index(rows)
            self.walls = [rows[base]["wall_s"]] if base is not None and rows[base].get("wall_s") else []
        timed = [r for r in rows if r.get("status") != "repeat"]
        self.wall_total_s = sum(r.get("wall_s") or 0.0 for r in timed)
        self.train_total_s = sum(r.get("train_s") or 0.0 for r in rows)
        done = [r.get("iteration") or 0 for r in rows if r.get("status") != "repeat"]
        self.iteration = max([self.iteration, *done])

    def mean_iteration_s(self) -> float | None:
        return statistics.fmean(self.walls[-20:]) / max(1, self.lanes) if self.walls else None

    def eta_s(self, elapsed_s: float, ab: bool) -> float | None:
        """Seconds left: --hours (per arm, counted from the ledger in `harness ab`) or
        --iterations times the measured mean iteration time; the smaller when both are set."""
        options = []
        if self.hours is not None:
            spent = self.wall_total_s if ab else elapsed_s
            options.append(max(0.0, self.hours * 3600 - spent))
        mean = self.mean_iteration_s()
        if self.iterations is not None and mean is not None:
            options.append(max(0, self.iterations - self.iteration) * mean)
        if self.stopped:
            return 0.0
        return min(options) if options else None

    def doing(self) -> str:
        if self.stopped:
            return "stopped: " + self.stopped
        self.refine_from_journals()
        parts = []
        for lane, jobs in sorted(self.now.items(), key=lambda kv: (kv[0] is None, str(kv[0]))):
            what = ", ".join(f"{phase} iteration {it}" if it else phase for it, phase in sorted(jobs.items()))
            if what:
                parts.append(what if lane is None else f"lane {lane}: {what}")
        return "; ".join(parts) or "between iterations"

    def refine_from_journals(self) -> None:
        """A candidate whose journal says phase "train" is committed and training."""
        for path in self.run_dir.glob("inflight*.json"):
            data = _read_json(path)
            it = data.get("iteration")
            if data.get("phase") != "train" or not it:
                continue
            for jobs in self.now.values():
                if jobs.get(it) == "proposing":
                    jobs[it] = "training"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


class Display:
    """The progress callback of `harness run` / `harness ab`, and the screen it draws."""

    def __init__(self, console: Console, runs: list[Watched], schedule: str | None = None,
                 live: bool | None = None):
        self.console = console
        self.runs = {w.name: w for w in runs}
        self.schedule = schedule
        self.ab = len(runs) > 1 or bool(runs and runs[0].name)
        self.start = time.monotonic()
        self.lock = threading.RLock()  # the state (runs, figures); never held while printing
        self.print_lock = threading.Lock()  # lines in the order they were queued
        self.pending: collections.deque[Text] = collections.deque()
        self.use_live = console.is_terminal if live is None else live
        self.live: Live | None = None

    # --- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> "Display":
        if self.use_live:
            self.live = Live(self, console=self.console, refresh_per_second=REFRESH_PER_S,
                             transient=True, redirect_stdout=False, redirect_stderr=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.flush()
        if self.live is not None:
            self.live.__exit__(*exc)
            self.live = None
            self.console.print(self.panel())  # the last state stays on screen

    def print(self, text: Text) -> None:
        """Queued under the state's lock, written by flush() once it is released: rich's refresh
        thread holds the Live's lock while it asks for the panel (the state's lock), so printing
        with the state's lock held would take the two in the other order (a deadlock)."""
        self.pending.append(text)

    def flush(self) -> None:
        with self.print_lock:
            while self.pending:
                (self.live.console if self.live else self.console).print(self.pending.popleft())

    # --- events ----------------------------------------------------------------------

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        try:
            with self.lock:
                self.handle(event, data)
        finally:
            self.flush()

    def handle(self, event: str, data: dict[str, Any]) -> None:
        w = self.runs.get(data.get("arm", ""), next(iter(self.runs.values())))
        prefix = (f"{w.name} ", "bold cyan") if self.ab and "arm" in data else ""
        lane = data.get("lane")
        if event == "baseline":
            w.now = {None: {0: "training the baseline"}}
            self.print(literal(prefix, ("baseline", "bold"), f" training commit {data['commit'][:12]} ..."))
        elif event == "start":
            w.lanes = data.get("lanes") or w.lanes  # Ray: as many as the cluster's slots
            w.iteration = data.get("iteration", 0)
            w.now = {}
            w.reload()
            self.print(literal(prefix, f"best so far {figures_fmt(data.get('best'))} "
                                       f"after iteration {data.get('iteration')}"))
        elif event == "resumed":
            w.now.setdefault(lane, {})[data["iteration"]] = "training"
            self.print(literal(prefix, (f"iteration {data['iteration']}: training the candidate the "
                                        f"interruption left untrained ({data['commit'][:12]}) ...", "dim")))
        elif event == "iteration":
            w.now.setdefault(lane, {})[data["iteration"]] = "proposing"
            if not self.live:
                where = f" lane {lane}" if lane is not None else ""
                self.print(literal(prefix, (f"iteration {data['iteration']}{where}: researcher ...", "dim")))
        elif event == "row":
            self.on_row(w, data, prefix)
        elif event == "event":
            w.lanes = data.get("lanes") or w.lanes  # a node joined or left: the ETA follows
            w.reload()
            self.print(literal(prefix, "  ", (str(data.get("kind", "")), "bold magenta"), ": ",
                               str(data.get("message", ""))))
        elif event == "stopping":
            for run in self.runs.values():
                run.stopped = run.stopped or "finishing the iterations in flight"
            self.print(literal(prefix, str(data.get("message", ""))))

    def on_row(self, w: Watched, data: dict[str, Any], prefix: Any) -> None:
        row = data["row"]
        for jobs in w.now.values():
            jobs.pop(row.iteration, None)
        w.now = {k: v for k, v in w.now.items() if v}
        w.reload()
        self.print(row_text(row, data.get("best"), prefix))
        if not self.live:  # a log file gets the figures the panel would show
            self.print(literal(prefix, ("  " + self.figures_line(w), "dim")))

    def mark_stopped(self, name: str, why: str) -> None:
        with self.lock:
            if name in self.runs:
                self.runs[name].stopped = why

    # --- the panel -------------------------------------------------------------------

    def elapsed_s(self) -> float:
        return time.monotonic() - self.start

    def total_eta_s(self) -> float | None:
        etas = [w.eta_s(self.elapsed_s(), self.ab) for w in self.runs.values()]
        if any(e is None for e in etas):
            return None
        return max(etas) if self.schedule == "parallel" or not self.ab else sum(etas)

    def figures_line(self, w: Watched) -> str:
        h = w.head
        if h is None:
            return "no figures yet"
        keep = "-" if h.keep_rate is None else f"{h.counts.get('keep', 0)}/{h.experiments} ({h.keep_rate:.0%})"
        duty = "-" if not w.wall_total_s else f"{w.train_total_s / w.wall_total_s:.0%}"
        cost = "unknown" if h.cost_usd is None else f"${h.cost_usd:.4f}"
        return (f"elapsed {clock(self.elapsed_s())}, ETA {clock(w.eta_s(self.elapsed_s(), self.ab))}; "
                f"best {figures_fmt(h.best)} ({figures.signed(h.improvement)}); keep {keep}; "
                f"GPU duty {duty}; tokens {short(h.input_tokens)} in/{short(h.output_tokens)} out; cost {cost}")

    def panel(self) -> Table:
        with self.lock:
            eta = self.total_eta_s()
            table = Table(title=None, caption=None, expand=False, show_edge=True, pad_edge=False,
                          title_justify="left")
            header = f"elapsed {clock(self.elapsed_s())}   ETA {clock(eta)}" + (
                "" if eta is not None else " (no --hours or --iterations)")
            table.title = header
            for col in ("run", "iter", "best", "improv.", "keep", "GPU", "tokens", "cost", "now"):
                table.add_column(col, overflow="fold" if col == "now" else "ellipsis",
                                 no_wrap=col != "now")
            for w in self.runs.values():
                table.add_row(*self.cells(w))
            return table

    def cells(self, w: Watched) -> list[Text]:
        h = w.head
        target = f"/{w.iterations}" if w.iterations is not None else ""
        name = (w.name + " " if w.name else "") + w.label
        if h is None:
            return [Text(name), Text(f"{w.iteration}{target}")] + [Text("-")] * 6 + [Text(w.doing())]
        keep = "-" if h.keep_rate is None else f"{h.counts.get('keep', 0)}/{h.experiments} {h.keep_rate:.0%}"
        duty = "-" if not w.wall_total_s else f"{w.train_total_s / w.wall_total_s:.0%}"
        mean = w.mean_iteration_s()
        return [Text(name), Text(f"{w.iteration}{target}" + (f" ~{mean:.0f}s" if mean else "")),
                Text(figures_fmt(h.best)), Text(figures.signed(h.improvement)), Text(keep), Text(duty),
                Text(f"{short(h.input_tokens + h.output_tokens)}"),
                Text("unknown" if h.cost_usd is None else f"${h.cost_usd:.2f}"), Text(w.doing())]

    def __rich__(self) -> Group:
        return Group(self.panel())


def figures_fmt(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.6f}"


def row_text(row: ledger.Row, best: float | None, prefix: Any = "") -> Text:
    metric = "-" if row.metric is None else f"{row.metric:.6f}"
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
