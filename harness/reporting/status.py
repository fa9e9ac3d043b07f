"""`harness status`: a run's figures from its ledger alone (figures.py), as text or JSON.

A tag names a single run (runs/<tag>/results.tsv) or an A/B run (runs/<tag>/a and b, shown side
by side); `<tag>/a` names one arm. Without a tag, the runs are listed. The text fits the width
it is given (80 columns, a half-width tmux pane), cutting lines rather than wrapping them.
"""
from __future__ import annotations

import json
import os
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..driver import decide
from ..ledger import events
from .. import ledger
from ..agents import spend
from . import figures
from ..errors import HarnessError
from ..lifecycle.recovery import LOCK_NAME
from ..driver.step import pending

ARM_NAMES = ("a", "b")


@dataclass
class RunRef:
    tag: str
    run_dir: Path
    arms: dict[str, Path]  # arm name -> run folder; {"": run_dir} for a single run

    @property
    def is_ab(self) -> bool:
        return list(self.arms) != [""]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def find_run(repo: Path, tag: str, must_exist: bool = True) -> RunRef | None:
    """The run a tag names; None (or a HarnessError when must_exist) if it has not started."""
    runs = Path(repo) / "runs"
    run_dir = runs / tag
    if (run_dir / "ab.json").exists() or any((run_dir / a / "results.tsv").exists() for a in ARM_NAMES):
        names = sorted(_read_json(run_dir / "ab.json").get("arms", {})) or list(ARM_NAMES)
        return RunRef(tag, run_dir, {name: run_dir / name for name in names})
    if (run_dir / "results.tsv").exists() or (run_dir / "run.json").exists():
        return RunRef(tag, run_dir, {"": run_dir})
    if must_exist:
        raise HarnessError(f"no run {tag!r} under {runs} (no results.tsv there yet). `harness status` "
                           f"lists the runs; `harness status {tag} --watch` waits for this one to start.")
    return None


def all_runs(repo: Path) -> list[RunRef]:
    """Every run under repo/runs, the most recently changed last."""
    runs = Path(repo) / "runs"
    found = []
    for d in runs.iterdir() if runs.is_dir() else []:
        ref = find_run(repo, d.name, must_exist=False) if d.is_dir() else None
        if ref is not None:
            found.append(ref)
    return sorted(found, key=lambda r: max(_mtime(p / "results.tsv") for p in r.arms.values()))


def latest_single(repo: Path) -> str | None:
    """The tag of the most recent single run (what `harness step` without --tag continues)."""
    singles = [r for r in all_runs(repo) if not r.is_ab]
    return singles[-1].tag if singles else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


# ---------------------------------------------------------------------------
# One run's (or arm's) state


def supervisor_alive(run_dir: Path) -> bool:
    """Is a harness driving this run now? It holds an flock on supervisor.lock
    (recovery.supervisor_lock). Read from /proc/locks, never by taking the lock, which could
    make a harness starting at that moment refuse the run."""
    path = Path(run_dir) / LOCK_NAME
    try:
        st = path.stat()
        table = Path("/proc/locks").read_text()
    except OSError:
        return False
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in table.splitlines():
        parts = line.split()
        if parts[1:2] == ["->"]:  # a process waiting for the lock, not holding it
            continue
        if len(parts) >= 6 and parts[1] == "FLOCK":
            try:
                major, minor, inode = parts[5].split(":")
                if (int(major, 16), int(minor, 16), int(inode)) == want:
                    return True
            except ValueError:
                continue
    return False


def arm_state(run_dir: Path, last_events: int = 3) -> dict[str, Any]:
    """Everything `status` shows for one run folder, as plain data (the --json output)."""
    path = run_dir / "results.tsv"
    rows = ledger.read_rows(path)
    manifest = _read_json(run_dir / "run.json")
    cfg = manifest.get("config", {})
    metric = ledger.metric_name(path) or cfg.get("metric") or "metric"
    head = figures.headline(rows, metric, cfg.get("direction", "minimize"))
    live = supervisor_alive(run_dir)
    journals = [{"iteration": d.get("iteration"), "commit": str(d.get("commit", ""))[:12],
                 "description": str(d.get("description", ""))} for _, d in pending(run_dir, rows)]
    happened, _ = events.read(run_dir)
    return {
        "run_dir": str(run_dir), "ledger": str(path), "agent": manifest.get("agent"),
        "model": manifest.get("model"), "live": live, "rows": len(rows),
        "figures": head.to_json(),
        "unknown_usage_calls": spend.unknown_calls(rows),  # killed before they reported: budgeted at the largest call
        # committed candidates without a row: in flight while a harness drives the run,
        # else left by an interruption for --resume to train
        "in_flight" if live else "waiting_for_resume": journals,
        "last_rows": [shown_row(r, rows) for r in rows[-10:]],
        "events": len(happened), "last_events": happened[-last_events:],
    }


def shown_row(row: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A ledger row as status shows it: `metric` is the value its decision used (the mean over the
    runs of a confirmed candidate, as in the ledger's metric column and the best), with the runs
    behind it; a `repeat` row is one run of its own."""
    out = {k: row.get(k) for k in ("iteration", "commit", "metric", "status", "description")}
    runs = row.get("runs") or 1
    out["runs"] = runs
    if row.get("status") != "repeat" and runs > 1:
        out["metric"] = ledger.decided_value(row)
        out["first_run"] = row.get("metric")
        out["run_values"] = decide.runs_of(rows, int(row.get("iteration") or 0))[:runs]
    return out


def state(ref: RunRef) -> dict[str, Any]:
    out: dict[str, Any] = {"tag": ref.tag, "kind": "ab" if ref.is_ab else "run"}
    if ref.is_ab:
        out["arms"] = {name: arm_state(d) for name, d in ref.arms.items()}
    else:
        out.update(arm_state(ref.run_dir))
    return out


def render_json(ref: RunRef) -> str:
    return json.dumps(state(ref), indent=2, default=str)


# ---------------------------------------------------------------------------
# Text


def fmt(value: Any, digits: int = 6) -> str:
    return "unknown" if value is None else f"{value:.{digits}f}"


def cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(1, width - 1)] + "…"


def figure_lines(s: dict[str, Any], narrow: bool = False) -> list[tuple[str, str]]:
    """(label, value) pairs: the same figures for a run and for each A/B arm; narrow (an A/B arm's
    column in a half-width pane): the same figures, their explanations left out, so none is cut."""
    f = s["figures"]
    cost = figures.cost_text(f["cost_usd"], f.get("unknown_usage_calls") or 0)
    keep = "-" if f["keep_rate"] is None else f"{f['keep_rate']:.0%}"
    counts = " ".join(f"{k} {v}" for k, v in sorted(f["counts"].items())) or "none yet"
    better = "higher" if f["direction"] == "maximize" else "lower"
    now = "running" if s["live"] else "not running"
    if s.get("in_flight"):
        now += ", training iteration " + ", ".join(str(j["iteration"]) for j in s["in_flight"])
    unknown = s.get("unknown_usage_calls") or 0
    if narrow:
        tokens = f"{short(f['input_tokens'])}/{short(f['output_tokens'])}" + ("+?" if unknown else "")
    else:
        tokens = f"{f['input_tokens']}/{f['output_tokens']}" + unknown_note(unknown)
    return [
        ("researcher", f"{s.get('model') or '-'} ({s.get('agent') or '?'})"),
        ("baseline", fmt(f["baseline"]) + runs_note(f.get("baseline_runs"), narrow)
         + (f" ({f['failed_baselines']} failed)" if f["failed_baselines"] else "")),
        ("best", fmt(f["best"]) + runs_note(f.get("best_runs"), narrow)
         + (f" {f['best_commit'][:7]}" if f["best_commit"] else "")),
        ("improvement", figures.signed(f["improvement"]) + ("" if narrow else f" ({better} {f['metric']} is better)")),
        ("experiments", f"{f['experiments']}, keep {'' if narrow else 'rate '}{keep}"),
        ("outcomes", counts),
        ("tokens" if narrow else "tokens in/out", tokens),
        ("cost", cost),
        ("supervisor", now),
    ]


def short(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e4 else str(n)


def runs_note(runs: int | None, narrow: bool = False) -> str:
    """After a value that is the mean of several training runs: how many."""
    if not runs or runs < 2:
        return ""
    return f"×{runs}" if narrow else f" ({runs} runs)"


def shown_status(r: dict[str, Any]) -> str:
    return (r["status"] or "") + (f"×{r['runs']}" if r["status"] != "repeat" and (r.get("runs") or 1) > 1 else "")


def render_text(ref: RunRef, width: int = 80, last: int = 8, height: int | None = None) -> str:
    """The run's figures, then its latest rows and events; cut to width, and to height (a tmux
    pane of 24 rows) by showing fewer of the latest rows, never fewer figures."""
    text = _render_text(ref, width, last)
    while height is not None and last > 1 and len(text.splitlines()) > height:
        last -= 1
        text = _render_text(ref, width, last)
    return text


def _render_text(ref: RunRef, width: int, last: int) -> str:
    lines = [f"run {ref.tag}" + (" (A/B)" if ref.is_ab else "") + f"   {ref.run_dir}"]
    states = {name: arm_state(d) for name, d in ref.arms.items()}
    if ref.is_ab:
        lines += side_by_side(states, width)
    else:
        s = states[""]
        lines += [f"{label + ':':14} {value}" for label, value in figure_lines(s)]
    for name, s in states.items():
        title = f"arm {name}: " if name else ""
        if not s["rows"]:
            lines += ["", f"{title}no rows yet:", "the baseline trains first"]
            continue
        metric = s["figures"]["metric"]
        shown = s["last_rows"][-last:]
        status_w = max([7, *(len(shown_status(r)) for r in shown)])
        lines += ["", f"{title}{'iter':>4} {'commit':7} {metric[:9]:>9} {'status':{status_w}} description"]
        for r in shown:
            it = "" if r["iteration"] is None else r["iteration"]
            lines.append(f"{it:>4} {(r['commit'] or '')[:7]:7} {fmt(r['metric']):>9} "
                         f"{shown_status(r):{status_w}} {r['description'] or ''}")
        for key, label in (("waiting_for_resume", "waiting for --resume"), ("in_flight", "in flight")):
            lines += [f"{label}: iteration {j['iteration']} ({j['commit'][:7]}) {j['description']}"
                      for j in s.get(key, [])]
        if s["events"]:
            lines.append(f"events: {s['events']} ({Path(s['run_dir']).name}/events.log); latest:")
            lines += [f"  {e.get('kind', '')}: {e.get('message', '')}" for e in s["last_events"]]
    return "\n".join(cut(line, width) for line in lines)


NARROW_COLUMN = 24  # an A/B arm's column narrower than this shows its figures without their explanations


def side_by_side(states: dict[str, dict[str, Any]], width: int) -> list[str]:
    """The arms' figures in columns: label, then one column per arm."""
    label_w = 13
    col_w = max(8, (width - label_w) // max(1, len(states)) - 1)
    narrow = col_w < NARROW_COLUMN
    per_arm = {name: figure_lines(s, narrow=narrow) for name, s in states.items()}
    lines = [f"{'':{label_w}}" + "".join(f" {cut('arm ' + name, col_w):{col_w}}" for name in states)]
    for i, (label, _) in enumerate(next(iter(per_arm.values()))):
        # narrow: a value longer than its column goes on under it (outcomes, a commit), never cut
        cells = {name: textwrap.wrap(per_arm[name][i][1], col_w) or [""] if narrow else [per_arm[name][i][1]]
                 for name in states}
        for k in range(max(len(c) for c in cells.values())):
            row = "".join(f" {cut(c[k] if k < len(c) else '', col_w):{col_w}}" for c in cells.values())
            lines.append(f"{cut(label, label_w) if k == 0 else '':{label_w}}" + row)
    return [line.rstrip() for line in lines]


def render_list(repo: Path, width: int = 80) -> str:
    """`harness status` without a tag: one line per run."""
    refs = all_runs(repo)
    if not refs:
        raise HarnessError(f"no runs under {Path(repo) / 'runs'}; start one with `harness run`.")
    lines = [f"{'tag':16} {'kind':4} {'exp':>4} {'best':>10} {'improvement':>11}  updated"]
    for ref in refs:
        for name, d in ref.arms.items():
            s = arm_state(d)
            f = s["figures"]
            label = f"{ref.tag}/{name}" if name else ref.tag
            when = time.strftime("%m-%d %H:%M", time.localtime(_mtime(d / "results.tsv"))) if s["rows"] else "-"
            lines.append(f"{label:16} {'ab' if name else 'run':4} {f['experiments']:>4} {fmt(f['best']):>10} "
                         f"{figures.signed(f['improvement']):>11}  {when}{'  running' if s['live'] else ''}")
    lines.append("")
    lines.append(f"`harness status TAG` for one run (the latest: {refs[-1].tag}).")
    return "\n".join(cut(line, width) for line in lines)


def waiting_text(repo: Path, tag: str) -> str:
    return (f"run {tag}: not started yet\nwaiting for its first row\n(the baseline trains first)\n"
            f"under {Path(repo) / 'runs'}")


def terminal_width(default: int = 80) -> int:
    try:
        return os.get_terminal_size().columns
    except OSError:
        return int(os.environ.get("COLUMNS", default))


def unknown_note(n: int) -> str:
    """How many calls' usage is unknown (killed before they reported): not counted above as zero."""
    return f" ({n} call{'s' if n != 1 else ''} with unknown usage, budgeted at the largest call)" if n else ""
