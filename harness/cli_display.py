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

from . import ledger
from .reporting import figures

STATUS_STYLE = {"keep": "green", "discard": "yellow", "skip": "dim", "repeat": "dim", "budget": "magenta", "stopped": "dim"}
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
    label: str  # model (agent), the agent shortened (agent_label)
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
    gpus: bool = False  # the run trains on GPUs (run.json: --gpus, an arm's GPU, or a GPU device)
    baseline_t0: float | None = None  # monotonic time the baseline started training
    baseline_runs: int = 1  # how many times it trains (--baseline-runs)
    researcher: str = ""  # the label unshortened (a cmd: template's whole command line)

    def reload(self) -> None:
        path = self.run_dir / "results.tsv"
        rows = ledger.read_rows(path)
        run = _read_json(self.run_dir / "run.json")
        manifest = run.get("config", {})
        self.gpus = bool(manifest.get("gpus") or manifest.get("gpu")) or has_gpu_device(run.get("device"))
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
        return self.eta(elapsed_s, ab)[0]

    def eta(self, elapsed_s: float, ab: bool) -> tuple[float | None, bool]:
        """(seconds left, True when only a lower bound): --hours (per arm, counted from the ledger
        in `harness ab`) or --iterations times the measured mean iteration time; the smaller when
        both are set. While the baseline trains nothing is measured yet: an iteration trains once,
        at least about as long as each of the baseline's runs has so far, so --iterations gives
        a lower bound."""
        if self.stopped:
            return 0.0, False
        options = []
        if self.hours is not None:
            spent = self.wall_total_s if ab else elapsed_s
            options.append(max(0.0, self.hours * 3600 - spent))
        mean = self.mean_iteration_s()
        if self.iterations is not None and mean is not None:
            options.append(max(0, self.iterations - self.iteration) * mean)
        elif self.iterations is not None and self.baseline_t0 is not None:
            so_far = time.monotonic() - self.baseline_t0
            bound = self.iterations * so_far / max(1, self.baseline_runs) / max(1, self.lanes)
            if not options or bound < min(options):
                return bound, True
        return (min(options), False) if options else (None, False)

    def why_no_eta(self) -> str:
        if self.hours is None and self.iterations is None:
            return "no --hours or --iterations"
        return "the baseline has not started"

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


def flow(items: list[str], width: int, sep: str = "  ") -> list[str]:
    """Whole items on as few lines of width as they fit (an item wider than a line: a line of its own)."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(sep) + len(item) <= width:
            lines[-1] += sep + item
        else:
            lines.append(item)
    return lines


def duty_text(w: Watched) -> str:
    """The fraction of wall time spent training: what the GPUs were busy with."""
    return "-" if not w.wall_total_s else f"{w.train_total_s / w.wall_total_s:.0%}"


def has_gpu_device(device: Any) -> bool:
    """run.json's device: the first GPU's name, or `cpu (arch)` (runs.device_name)."""
    return bool(device) and not str(device).startswith("cpu")


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
