"""Rendering of the report: plots (matplotlib Agg, no pyplot state), markdown and self-contained HTML.

Both documents are built from one list of blocks, so they always say the same thing.
"""
from __future__ import annotations

import base64
import html as html_mod
import io
import re
from datetime import datetime, timezone
from typing import Any

import pandas as pd

from ..workload import testsplit
from . import elo_render

STATUS_COLORS = {"keep": "#2ca02c", "discard": "#ff7f0e", "crash": "#d62728", "timeout": "#9467bd",
                 "invalid": "#7f7f7f", "skip": "#bcbd22", "budget": "#17becf", "repeat": "#aec7e8"}
ARM_COLORS = ("#1f77b4", "#e377c2", "#8c564b", "#17becf", "#bcbd22", "#9467bd")
PLOT_DPI = 100
PLOT_SIZE_IN = (9.0, 3.6)

# ---------------------------------------------------------------------------
# Plots


def _png(fig) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PLOT_DPI, metadata={"Software": None})
    return buf.getvalue()


def _progress_plot(summary: dict[str, Any], series: dict[str, dict[str, list]], key: str, xlabel: str) -> bytes:
    from matplotlib.figure import Figure

    fig = Figure(figsize=PLOT_SIZE_IN, layout="constrained")
    ax = fig.add_subplot()
    unknown, scale = [], 1.0
    known = [x for s in series.values() for x in s[key] if x is not None]
    if key == "wall_h" and known and max(known) < 1:  # a short run reads better in minutes
        scale, xlabel = 60.0, "wall time (minutes)"
    for i, (label, s) in enumerate(series.items()):
        points = [(x * scale, y) for x, y in zip(s[key], s["best"]) if x is not None and y is not None]
        if not points:
            unknown.append(label)
            continue
        xs, ys = zip(*points)
        ax.step(xs, ys, where="post", color=ARM_COLORS[i % len(ARM_COLORS)], linewidth=2.5,
                marker="o", markersize=4, label=label)
    if unknown:
        ax.text(0.01, 0.02, "unknown for: " + ", ".join(unknown), transform=ax.transAxes, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"best {summary['metric']} so far")
    ax.set_title(f"best-so-far against {xlabel}")
    ax.grid(alpha=0.3)
    if len(unknown) < len(series):
        ax.legend(title="arm")
    return _png(fig)


def _experiments_plot(summary: dict[str, Any], arms) -> bytes:
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator
    from matplotlib.transforms import blended_transform_factory

    fig = Figure(figsize=(PLOT_SIZE_IN[0], 0.4 + 2.6 * len(arms)), layout="constrained")
    axes = fig.subplots(len(arms), 1, sharey=True, squeeze=False)[:, 0]
    for ax, arm in zip(axes, arms):
        low = blended_transform_factory(ax.transData, ax.transAxes)
        for n, r in enumerate(arm.rows):
            x = r.get("iteration") if r.get("iteration") is not None else n
            color = STATUS_COLORS.get(r.get("status"), "#000000")
            if r.get("metric") is None:  # no figure to show: a cross on the axis
                ax.plot([x], [0.03], marker="x", color=color, markersize=9, mew=2.5, transform=low)
            else:
                ax.plot([x], [r["metric"]], marker="*" if n == 0 else "o", color=color, linestyle="none",
                        markersize=15 if n == 0 else 6 if r.get("status") == "repeat" else 9, zorder=1 if n else 3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{arm.label}: every experiment (star = baseline, x = no {summary['metric']})")
        ax.set_xlabel("iteration")
        ax.set_ylabel(summary["metric"])
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], marker="o", linestyle="none", color=c, label=s) for s, c in STATUS_COLORS.items()]
    axes[0].legend(handles=handles, ncols=4, fontsize=8, loc="best")
    return _png(fig)


PROGRESS_PLOTS = (("best_vs_wall", "wall_h", "wall time (hours)", "wall time"),
                  ("best_vs_tokens", "tokens_m", "cumulative tokens (millions)", "tokens"),
                  ("best_vs_cost", "cost_usd", "cumulative cost (USD)", "cost"))


def plots(summary: dict[str, Any], arms, series: dict[str, dict[str, list]]) -> dict[str, bytes]:
    """The plots the ledgers have data for: a best-so-far plot needs one arm whose ledger records
    its x (wall time, tokens, cost) beside a best; a plot of nothing is left out, with a note."""
    out = {}
    for name, key, xlabel, what in PROGRESS_PLOTS:
        if any(x is not None and y is not None for s in series.values() for x, y in zip(s[key], s["best"])):
            out[name] = _progress_plot(summary, series, key, xlabel)
        else:
            summary.setdefault("notes", []).append(f"No plot of the best against {what}: no ledger records it.")
    out["experiments"] = _experiments_plot(summary, arms)
    return out


# ---------------------------------------------------------------------------
# Formatting: None is "unknown", never 0


FORMATS = {"int": "{:,}", "rate": "{:.1%}", "pct": "{:+.2f}%", "usd": "${:.4f}", "s": "{:.1f}",
           "tokens": "{:,.0f}", "signed": "{:+.6g}", "num": "{:.6g}"}


def fmt(value: Any, kind: str = "num") -> str:
    """A figure for the report; None is shown as unknown, never as zero."""
    if value is None:
        return "unknown"
    if kind == "text":
        return str(value)
    return FORMATS[kind].format(value)


def _na(f: dict[str, Any], key: str) -> str | None:
    """Why a ratio is not applicable (a known zero denominator), as opposed to unknown."""
    zero = {"acceptance_rate": ("experiments", "no experiments"),
            "improvement_per_gpu_hour": ("train_s", "no training time"),
            "improvement_per_1m_tokens": ("tokens", "no tokens used"),
            "improvement_per_usd": ("cost_usd", "no cost"),
            "gpu_duty": ("wall_s", "no wall time")}.get(key)
    if zero and f.get(key) is None and f.get(zero[0]) == 0 and f.get("improvement") is not None:
        return f"n/a ({zero[1]})"
    return None


def table_rows(summary: dict[str, Any]) -> list[list[str]]:
    """One column per arm: an arm's repeats are pooled (counts and spend summed, levels averaged)."""
    metric = summary["metric"]
    arms = summary.get("pooled") or summary["arms"]
    spec = [("agent", "agent", "text"), ("model", "model", "text")]
    if any(f.get("repeats", 1) > 1 for f in arms):
        spec.append(("repeats pooled (levels: their mean)", "repeats", "int"))
    spec.append(("experiments", "experiments", "int"))
    rows = [[name] + [fmt(f[key], kind) for f in arms] for name, key, kind in spec]
    counts = pd.DataFrame([f["counts"] for f in arms]).fillna(0).astype(int)  # arm x status, in first-seen order
    rows += [[f"  {status}"] + [fmt(int(n), "int") for n in counts[status]] for status in counts]
    spec = [
        ("acceptance rate (skips left out)", "acceptance_rate", "rate"),
        (f"baseline {metric}", "baseline", "num"), (f"best {metric}", "best", "num"),
        ("improvement", "improvement", "signed"), ("improvement %", "improvement_pct", "pct"),
        ("noise floor sigma (latest)", "noise_sigma", "num"),
        ("repeat training runs", "repeat_runs", "int"),
        ("runs with unsealed results (stdout)", "unsealed_runs", "int"),
        ("sandbox", "sandbox", "text"),
        ("GPU-minutes on discarded and failed runs", "gpu_minutes_discarded_failed", "s"),
        ("mean researcher seconds per iteration", "mean_agent_s", "s"),
        ("mean iteration wall seconds", "mean_wall_s", "s"),
        ("GPU duty (training / wall time)", "gpu_duty", "rate"),
        ("input tokens per iteration", "input_tokens_per_iteration", "tokens"),
        ("cached tokens per iteration", "cached_tokens_per_iteration", "tokens"),
        ("output tokens per iteration", "output_tokens_per_iteration", "tokens"),
        ("cost", "cost_text", "text"), ("cost from", "cost_source", "text"),
        ("calls with unknown usage (killed before reporting)", "unknown_usage_calls", "int"),
        ("improvement per GPU-hour", "improvement_per_gpu_hour", "num"),
        ("improvement per 1M tokens", "improvement_per_1m_tokens", "num"),
        ("improvement per dollar", "improvement_per_usd", "num"),
    ]
    rows += [[name] + [_na(f, key) or fmt(f[key], kind) for f in arms] for name, key, kind in spec]
    return rows


# ---------------------------------------------------------------------------
# One list of blocks, two renderers


def blocks(summary: dict[str, Any], images: dict[str, Any]) -> list[tuple]:
    arms = summary["arms"]
    setup = summary.get("ab") or {}
    sense = "lower is better" if summary["direction"] == "minimize" else "higher is better"
    title = f"A/B report: {setup['tag']}" if setup.get("tag") else "Research run report"
    out: list[tuple] = [("h1", title), ("p", f"Metric {summary['metric']} ({sense}). Generated "
                        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC from "
                        + ", ".join(f"`{f['ledger']}`" for f in arms) + ".")]
    if setup:
        out.append(("p", f"Schedule {setup.get('schedule')}, baseline commit "
                         f"`{str(setup.get('baseline_commit', ''))[:12]}`, GPUs {setup.get('gpus') or 'inherited'}."))
    out.append(("h2", "Verdict"))
    out += [("p", line) for line in summary["verdict"]["text"]]
    out.append(("h2", "Side by side"))
    out.append(("table", ["", *[f["label"] for f in summary.get("pooled") or arms]], table_rows(summary)))
    out += consistency_blocks(summary)
    out += elo_render.report_blocks(summary.get("elo"))
    out.append(("h2", "Plots"))
    out += [("p", note) for note in summary.get("notes", [])]
    for name, alt in (("best_vs_wall", "best-so-far against wall time"),
                      ("experiments", "every experiment's metric coloured by status"),
                      ("best_vs_tokens", "best-so-far against cumulative tokens"),
                      ("best_vs_cost", "best-so-far against cumulative cost")):
        if name in images:
            out.append(("img", images[name], alt))
    out += testsplit.blocks(summary)  # validation vs test, per arm
    out.append(("h2", "Kept changes, in order"))
    for f in arms:
        out.append(("h3", f["label"]))
        if not f["kept"]:
            out.append(("p", "None yet."))
            continue
        out.append(("table", ["iteration", "commit", summary["metric"], "improvement", "description"],
                    [[fmt(k["iteration"], "text"), k["commit"] or "", fmt(k["metric"]),
                      fmt(k.get("improvement"), "signed"), k["description"]] for k in f["kept"]]))
    out.append(("h2", "Events"))
    for f in arms:
        shown = f.get("events") or []
        if len(arms) > 1:
            out.append(("h3", f["label"]))
        if not shown:
            out.append(("p", "None: no ledger repairs, restores, health warnings or drift."))
            continue
        out.append(("table", ["at", "kind", "message"],
                    [[e.get("at", ""), e.get("kind", ""), str(e.get("message", ""))[:300]] for e in shown[-30:]]))
    conv = summary["convergent"]
    out.append(("h2", "Convergent findings"))
    if conv["hyperparameters"] is None:
        out.append(("p", "Unknown: the kept commits of every arm could not be diffed (no git checkout found), "
                         "or there is only one arm."))
    else:
        out.append(("p", "Hyperparameters every arm changed in kept commits: "
                         + (", ".join(f"`{n}`" for n in conv["hyperparameters"]) or "none") + "."))
        out.append(("p", "Code areas every arm changed in kept commits: "
                         + (", ".join(f"`{n}`" for n in conv["code"]) or "none") + "."))
    for label, names in conv["per_arm"].items():
        if names is not None:
            out.append(("p", f"{label} changed: hyperparameters "
                             + (", ".join(names["hyperparameters"]) or "none") + "; code "
                             + (", ".join(names["code"]) or "none") + "."))
    return out


def consistency_blocks(summary: dict[str, Any]) -> list[tuple]:
    """Would the same researcher do it again: each arm's repeats, and the order of arms across them."""
    arms = (summary.get("consistency") or {}).get("arms") or {}
    if not arms:
        return []
    out: list[tuple] = [("h2", "Consistency of repeats")]
    rows = []
    for label, a in arms.items():
        s, rec = a["spread"], a["recurring"]
        names = "unknown (no checkout to diff)" if rec is None else ", ".join(
            f"`{n}` ({c})" for n, c in rec["hyperparameters"] + rec["code"]) or "none"
        rows.append([label, fmt(s and s["repeats"], "int"), fmt(s and s["mean"], "signed"), fmt(s and s["sd"]),
                     "unknown" if s is None else f"{s['min']:+.6g} to {s['max']:+.6g}", names])
    out.append(("table", ["arm", "repeats", "improvement: mean", "sd", "min to max",
                          "kept changes in two repeats or more (repeats)"], rows))
    return out + elo_render.pair_blocks((summary.get("elo") or {}).get("consistency"))


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def markdown(summary: dict[str, Any], image_paths: dict[str, str]) -> str:
    lines: list[str] = []
    for b in blocks(summary, image_paths):
        if b[0] in ("h1", "h2", "h3"):
            lines += ["#" * int(b[0][1]) + " " + b[1], ""]
        elif b[0] == "p":
            lines += [b[1], ""]
        elif b[0] == "table":
            lines.append("| " + " | ".join(_md_cell(h) for h in b[1]) + " |")
            lines.append("|" + "---|" * len(b[1]))
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b[2]]
            lines.append("")
        elif b[0] == "img":
            lines += [f"![{b[2]}]({b[1]})", ""]
    return "\n".join(lines)


def _inline(text: str) -> str:
    """Escape, then the two bits of markdown the blocks use: **bold** and `code`."""
    text = html_mod.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


CSS = """body{font-family:system-ui,sans-serif;max-width:1000px;margin:1em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}img{max-width:100%;display:block;margin:.5em 0}
code{background:#f3f3f3;padding:0 3px}"""


def html(summary: dict[str, Any], pngs: dict[str, bytes]) -> str:
    """One file, no external URL: the plots are embedded as base64 PNG."""
    images = {k: "data:image/png;base64," + base64.b64encode(v).decode() for k, v in pngs.items()}
    body: list[str] = []
    for b in blocks(summary, images):
        if b[0] in ("h1", "h2", "h3"):
            body.append(f"<{b[0]}>{_inline(b[1])}</{b[0]}>")
        elif b[0] == "p":
            body.append(f"<p>{_inline(b[1])}</p>")
        elif b[0] == "table":
            head = "".join(f"<th>{_inline(h)}</th>" for h in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{html_mod.escape(str(c))}</td>" for c in row) + "</tr>"
                           for row in b[2])
            body.append(f"<table><tr>{head}</tr>{rows}</table>")
        elif b[0] == "img":
            body.append(f'<img src="{b[1]}" alt="{html_mod.escape(b[2])}">')
    title = html_mod.escape(next(b[1] for b in blocks(summary, {}) if b[0] == "h1"))
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
