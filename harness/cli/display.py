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
import threading
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..reporting import figures
from .text import clock, figures_fmt, flow, literal, row_text, short, short_cost
from .watched import Watched, duty_text

REFRESH_PER_S = 2


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
            self.console.print(self)  # the last state stays on screen

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
            w.baseline_t0, w.baseline_runs = time.monotonic(), int(data.get("runs") or 1)
            w.reload()
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

    def total_eta(self) -> tuple[float | None, bool]:
        """The ETA of everything on screen, and whether it is only a lower bound."""
        etas = [w.eta(self.elapsed_s(), self.ab) for w in self.runs.values()]
        if any(e is None for e, _ in etas):
            return None, False
        seconds = [e for e, _ in etas]
        total = max(seconds) if self.schedule == "parallel" or not self.ab else sum(seconds)
        return total, any(bound for _, bound in etas)

    def total_eta_s(self) -> float | None:
        return self.total_eta()[0]

    def eta_text(self, eta: tuple[float | None, bool], why: str) -> str:
        seconds, at_least = eta
        if seconds is None:
            return f"ETA unknown ({why})"
        return f"ETA {'≥' if at_least else ''}{clock(seconds)}" + (" (from the baseline so far)" if at_least else "")

    def figures_line(self, w: Watched) -> str:
        h = w.head
        if h is None:
            return "no figures yet"
        keep = "-" if h.keep_rate is None else f"{h.counts.get('keep', 0)}/{h.experiments} ({h.keep_rate:.0%})"
        cost = short_cost(h)
        gpu = f"GPU duty {duty_text(w)}; " if w.gpus else ""
        return (f"elapsed {clock(self.elapsed_s())}, {self.eta_text(w.eta(self.elapsed_s(), self.ab), w.why_no_eta())}; "
                f"best {figures_fmt(h.best)} ({figures.signed(h.improvement)}); keep {keep}; "
                f"{gpu}tokens {short(h.input_tokens)} in/{short(h.output_tokens)} out; cost {cost}")

    # --- the panel: a table where it fits, else one figure after another ----------------
    #
    # The figures are never cut: in the table only the researcher's label and what it is doing
    # give way; below the table's width the same figures flow as `label value` pairs under
    # shortened labels, each whole, so a half-width tmux pane (40 columns) still reads them.

    def header(self) -> list[str]:
        eta = self.total_eta()
        why = next((w.why_no_eta() for w in self.runs.values() if w.eta(self.elapsed_s(), self.ab)[0] is None), "")
        return [f"elapsed {clock(self.elapsed_s())}", self.eta_text(eta, why)]

    def columns(self) -> list[tuple[str, str]]:
        """(table header, compact label) of the figure columns, GPU duty only where there are GPUs."""
        cols = [("iter", "iter"), ("best", "best"), ("improv.", "impr"), ("keep", "keep")]
        if any(w.gpus for w in self.runs.values()):
            cols.append(("GPU", "GPU"))
        return cols + [("tokens", "tok"), ("cost", "cost")]

    def panel(self, width: int | None = None) -> Table | Group:
        with self.lock:
            width = width or self.console.width
            cols = self.columns()
            rows = [(w, self.cells(w, [c for c, _ in cols])) for w in self.runs.values()]
            figures_w = [max(len(head), *(len(cells[head]) for _, cells in rows)) for head, _ in cols]
            # borders and padding: 3 columns per cell, 1 for the edge; the label and `now` at least 12
            if width >= sum(figures_w) + 3 * (len(cols) + 2) + 1 + 2 * MIN_FLEX:
                return self.table(cols, rows)
            return self.compact(cols, rows, width)

    def table(self, cols: list[tuple[str, str]], rows: list[tuple[Watched, dict[str, str]]]) -> Table:
        table = Table(title="   ".join(self.header()), caption=None, expand=False, show_edge=True,
                      pad_edge=False, title_justify="left")
        table.add_column("run", no_wrap=False, overflow="ellipsis", min_width=MIN_FLEX)
        for head, _ in cols:
            table.add_column(head, no_wrap=True)
        table.add_column("now", no_wrap=False, overflow="fold", min_width=MIN_FLEX)
        for w, cells in rows:
            table.add_row(Text(self.name(w), no_wrap=True, overflow="ellipsis"),
                          *[Text(cells[head]) for head, _ in cols], Text(cells["now"]))
        return table

    def compact(self, cols: list[tuple[str, str]], rows: list[tuple[Watched, dict[str, str]]],
                width: int) -> Group:
        lines = [Text(line) for line in flow(self.header(), width)]
        for w, cells in rows:
            lines.append(Text(self.name(w), style="bold", no_wrap=True, overflow="ellipsis"))
            items = [f"{short_label} {cells[head]}" for head, short_label in cols]
            lines += [Text(line, overflow="fold") for line in flow(items, width)]
            lines.append(Text("now " + cells["now"], overflow="fold"))
        return Group(*lines)

    def name(self, w: Watched) -> str:
        return (w.name + " " if w.name else "") + w.label

    def cells(self, w: Watched, heads: list[str]) -> dict[str, str]:
        h = w.head
        target = f"/{w.iterations}" if w.iterations is not None else ""
        out = dict.fromkeys(heads, "-")
        out["iter"] = f"{w.iteration}{target}"
        out["now"] = w.doing()
        if h is None:
            return out
        mean = w.mean_iteration_s()
        out["iter"] += f" ~{mean:.0f}s" if mean else ""
        out["best"] = figures_fmt(h.best)
        out["improv."] = figures.signed(h.improvement)
        out["keep"] = "-" if h.keep_rate is None else f"{h.counts.get('keep', 0)}/{h.experiments} {h.keep_rate:.0%}"
        if "GPU" in out:
            out["GPU"] = duty_text(w)
        out["tokens"] = short(h.input_tokens + h.output_tokens)
        out["cost"] = short_cost(h)  # as status and the log lines
        return out

    def __rich_console__(self, console: Console, options: Any):
        yield self.panel(options.max_width)


MIN_FLEX = 12  # columns the table gives the label and `now` at least; below that: the compact layout
