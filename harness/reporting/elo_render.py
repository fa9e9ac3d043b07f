"""`harness elo`'s result as markdown tables and plots (matplotlib Agg, no pyplot state)."""
from __future__ import annotations

import io
import math
from typing import Any

from .elo import ONE_TASK

PLOT_DPI = 100
MAX_CURVE_PANELS = 12  # tasks drawn in the best-so-far figure; the rest are in elo.json
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _num(value: float | None, spec: str = ".0f") -> str:
    return "—" if value is None else format(value, spec)


def _tokens(value: float | None) -> str:
    if value is None:
        return "unknown"
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    return f"{value / 1e3:.1f}k" if value >= 1e3 else f"{value:.0f}"


def _usd(value: float | None) -> str:
    return "unknown" if value is None else f"${value:.4f}"


def _ci(ci: list[float] | None) -> str:
    return "—" if ci is None else f"[{ci[0]:.0f}, {ci[1]:.0f}]"


def method(result: dict[str, Any]) -> str:
    """How the intervals were drawn, in words."""
    if result.get("interval") == "bootstrap":
        return f"{result['draws']} bootstrap draws over tasks"
    return (f"{result['draws']} draws of the Bradley-Terry posterior under Jeffreys' prior (each task's pairs "
            f"weighed by 3 / (its arms + 1))")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def ratings_table(result: dict[str, Any], arms: list[dict[str, Any]]) -> list[str]:
    return _table(*ratings_rows(result, arms))


def ratings_rows(result: dict[str, Any], arms: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    pct = f"{result['level']:.0%}"
    one = {c for c, g in enumerate(result["components"]) if g["tasks"] == 1}
    rows = [[a["arm"], str(a["agent"] or "?"), str(a["model"] or "—"), str(a["tasks"]),
             f"{a['wins']}-{a['losses']}-{a['ties']}", _num(a["win_rate"], ".0%"), _num(a["elo"]),
             ONE_TASK if a["component"] in one and a["ci"] is None else _ci(a["ci"])]
            for a in sorted(arms, key=lambda a: -(a["elo"] if a["elo"] is not None else -math.inf))]
    return ["arm", "agent", "model", "tasks", "W-L-T", "win rate", "Elo", f"{pct} interval"], rows


def marginal_table(result: dict[str, Any], component: int) -> list[str]:
    return _table(*marginal_rows(result, component))


def _per_dollar(value: float | None, note: str | None) -> str:
    return note if value is None and note else _num(value, "+.0f")


def marginal_rows(result: dict[str, Any], component: int) -> tuple[list[str], list[list[str]]]:
    arms = {a["arm"]: a for a in result["arms"]}
    by_usd = result["components"][component].get("cost_order") == "usd"
    rows = []
    for step in (s for s in result["marginal"] if s["component"] == component):
        a = arms[step["arm"]]
        if step["vs"] is None:
            plus = "—"
        elif by_usd:
            per = step["d_elo_per_usd"]
            plus = (f"{step['d_elo']:+.0f} for +{_usd(step['d_usd'])} vs {step['vs']}"
                    + (f" ({per:+.0f}/$)" if per is not None else f" ({step['d_elo_per_usd_note']})"))
        else:
            plus = (f"{step['d_elo']:+.0f} for {'+' if step['d_tokens'] >= 0 else '-'}"
                    f"{_tokens(abs(step['d_tokens']))} vs {step['vs']}"
                    + ("" if step["d_elo_per_1k_tokens"] is None else f" ({step['d_elo_per_1k_tokens']:+.1f}/1k)"))
        rows.append([a["arm"], _usd(a.get("usd_per_task")), _tokens(a.get("tokens_per_task")),
                     _num(a["win_rate"], ".0%"), f"{_num(a['elo'])} {_ci(a['ci'])}",
                     _per_dollar(a.get("elo_per_usd"), a.get("elo_per_usd_note")),
                     _num(a["elo_per_1k_tokens"], "+.1f"), plus])
    return ["arm", "$/task", "tokens/task", "win rate", "Elo", "Elo/$", "Elo/1k tokens",
            "+Elo for +$" if by_usd else "+Elo for +tokens"], rows


def cost_heading(result: dict[str, Any], component: int) -> str:
    """What the cost table is ordered by, and why when it is not dollars."""
    if result["components"][component].get("cost_order") == "usd":
        return "cheapest in dollars first"
    rated = [a for a in result["arms"] if a["component"] == component and a["elo"] is not None]
    unknown = [a["arm"] for a in rated if a.get("usd_per_task") is None]
    why = f"the dollars of {', '.join(unknown)} are unknown" if unknown else "no arm spent dollars"
    return f"fewest tokens first: {why}"


def budget_table(result: dict[str, Any]) -> list[str]:
    points = list(result["by_budget"])
    rows = [[a["arm"], *[_num(result["by_budget"][p].get(a["arm"])) for p in points]] for a in result["arms"]]
    return _table(["arm", *[f"{float(p):.0%}" for p in points]], rows)


def pairwise_table(result: dict[str, Any]) -> list[str]:
    """Head to head: the row's wins-losses-ties against the column's arm, over all tasks."""
    arms = [a["arm"] for a in result["arms"]]
    cells = {(p["arm"], p["opponent"]): f"{p['wins']}-{p['losses']}-{p['ties']}" for p in result.get("pairwise", [])}
    rows = [[a, *["" if a == b else cells.get((a, b), "—") for b in arms]] for a in arms]
    return _table(["W-L-T against", *arms], rows)


def tasks_table(result: dict[str, Any]) -> list[str]:
    rows = []
    for t in result["tasks"]:
        best = ", ".join(f"{arm} {b['value']:.6g}" for arm, b in t["best"].items())
        unit = "iterations" if t["budget"] == "iterations" else result["unit"]
        rows.append([t["task"], f"{t['compared_at']:.4g} {unit}", _num(t["sigma"], ".3g"), best])
    return _table(["task", "compared at", "noise sigma", "best so far"], rows)


def consistency_blocks(c: dict[str, Any] | None) -> list[tuple]:
    """The consistency of repeats (harness/repeats.py) as report_render's blocks; none without repeats."""
    if not c or not (c["spread"] or c["pairs"]):
        return []
    out: list[tuple] = []
    if c["spread"]:
        out.append(("table", ["arm", "workload", "repeats", "final improvement: mean", "sd", "min to max"],
                    [[s["arm"], s["workload"], str(s["repeats"]), f"{s['mean']:+.4g}", f"{s['sd']:.3g}",
                      f"{s['min']:+.4g} to {s['max']:+.4g}"] for s in c["spread"]]))
    return out + pair_blocks(c) + [("p", line) for line in c.get("disagree", [])]


def pair_blocks(c: dict[str, Any] | None) -> list[tuple]:
    """Per pair of arms, how often their repeats agree on the order; the most and least consistent arm."""
    if not c or not c["pairs"]:
        return []
    per_arm = c["per_arm"]
    return [("table", ["arm", "opponent", "tasks", "same order across repeats"],
             [[p["arm"], p["opponent"], str(p["tasks"]), f"{p['rate']:.0%}"] for p in c["pairs"]]),
            ("p", f"Most consistent: {c['most']} ({per_arm[c['most']]:.0%} on average over its pairs); "
                  f"least: {c['least']} ({per_arm[c['least']]:.0%}); gap {c['gap']:.0%}. "
                  f"50% is a coin toss, 100% the same order every time.")]


def _block_lines(blocks: list[tuple]) -> list[str]:
    lines: list[str] = []
    for b in blocks:
        lines += (_table(b[1], b[2]) if b[0] == "table" else [b[1]]) + [""]
    return lines


def markdown(result: dict[str, Any]) -> str:
    n_tasks, arms = len(result["tasks"]), result["arms"]
    lines = [f"# Elo of {len(arms)} arms over {n_tasks} tasks", "",
             f"Each task compares its arms' best so far at the {result['unit']} every one of them reached; "
             f"a gap within {result['tie_z']:g} standard error(s) of the task's noise floor is a tie. "
             f"Bradley-Terry fit on the Elo scale; {result['level']:.0%} intervals from {method(result)} "
             f"(seed {result['seed']}).", ""]
    several = len(result["components"]) > 1
    for c, group in enumerate(result["components"]):
        members = [a for a in arms if a["component"] == c]
        title = f"Group {c + 1}: " if several else ""
        lines += [f"## {title}Ratings (anchor: {group['anchor']} = {result['anchor_elo']:.0f})", "",
                  *ratings_table(result, members), ""]
        if len(members) > 1:
            lines += [f"## {title}Cost and marginal gain ({cost_heading(result, c)}; spend per task normalised "
                      f"per task)", "",
                      *marginal_table(result, c), ""]
    if len(arms) > 1:
        lines += ["## Head to head (the row's wins-losses-ties against the column)", "", *pairwise_table(result), ""]
    if consistency_blocks(result.get("consistency")):
        lines += ["## Consistency of repeats", "", *_block_lines(consistency_blocks(result["consistency"]))]
    lines += ["## Elo at fractions of each task's budget", "", *budget_table(result), "",
              "## Tasks", "", *tasks_table(result), ""]
    if result["notes"]:
        lines += ["## Notes", "", *[f"- {n}" for n in result["notes"]], ""]
    return "\n".join(lines)


def report_blocks(result: dict[str, Any] | None) -> list[tuple]:
    """The comparison report's Elo section, as report_render's blocks (markdown and HTML alike)."""
    if result is None:
        return []
    out: list[tuple] = [("h2", "Elo across tasks")]
    if "error" in result:
        return out + [("p", f"Not available: {result['error']}")]
    out.append(("p", f"Bradley-Terry ratings over {len(result['tasks'])} task(s) (see docs/elo.md; "
                     f"`harness elo` gives more): each task's arms compared at the {result['unit']} all reached, "
                     f"{result['level']:.0%} intervals from {method(result)}."))
    for c, group in enumerate(result["components"]):
        members = [a for a in result["arms"] if a["component"] == c]
        out.append(("table", *ratings_rows(result, members)))
        if len(members) > 1:
            out.append(("table", *marginal_rows(result, c)))
    return out + [("p", note) for note in result["notes"]]


# ---------------------------------------------------------------------------
# Plots


def _margins(fig, left: float, bottom: float, right: float = 0.15, top: float = 0.35, **gaps: float) -> None:
    """Fixed margins in inches (a layout engine would draw the figure once more to measure it:
    most of the plots' time)."""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=left / w, bottom=bottom / h, right=1 - right / w, top=1 - top / h, **gaps)


def _png(fig) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PLOT_DPI, metadata={"Software": None})
    return buf.getvalue()


def elo_vs_tokens(result: dict[str, Any]) -> bytes | None:
    """Elo against tokens per task (log scale) with intervals: where returns diminish."""
    from matplotlib.figure import Figure

    names = [a["arm"] for a in result["arms"]]
    rated = [a for a in result["arms"] if a["elo"] is not None]
    spent = sorted((a for a in rated if (a.get("tokens_per_task") or 0) > 0), key=lambda a: a["tokens_per_task"])
    if not spent:
        return None
    fig = Figure(figsize=(7.0, 4.2))
    _margins(fig, left=0.75, bottom=0.55, top=0.15)
    ax = fig.add_subplot()
    for a in spent:
        lo, hi = a["ci"] if a["ci"] else (a["elo"], a["elo"])
        ax.errorbar([a["tokens_per_task"]], [a["elo"]], yerr=[[a["elo"] - lo], [hi - a["elo"]]], fmt="o",
                    capsize=4, color=COLORS[names.index(a["arm"]) % len(COLORS)], label=a["arm"])
    for a in rated:  # no tokens (the mutate control): no place on a log axis, a level line instead
        if not (a.get("tokens_per_task") or 0) > 0:
            ax.axhline(a["elo"], ls="--", lw=1, color=COLORS[names.index(a["arm"]) % len(COLORS)],
                       label=f"{a['arm']} (no tokens)")
    ax.set_xscale("log")
    ax.set_xlabel("tokens per task (normalised per task)")
    ax.set_ylabel("Elo")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _png(fig)


def curves(result: dict[str, Any]) -> bytes | None:
    """Best so far against spend, one panel per task, every arm on the same axes."""
    from matplotlib.figure import Figure

    tasks = result["tasks"][:MAX_CURVE_PANELS]
    if not tasks:
        return None
    names = [a["arm"] for a in result["arms"]]
    cols = min(3, len(tasks))
    rows = math.ceil(len(tasks) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.0 * rows))
    _margins(fig, left=0.6, bottom=0.5, hspace=0.55, wspace=0.3)
    for k, t in enumerate(tasks):
        ax = fig.add_subplot(rows, cols, k + 1)
        for arm, points in t["curves"].items():
            xs, ys = zip(*points)
            ax.step(xs, ys, where="post", color=COLORS[names.index(arm) % len(COLORS)], label=arm)
        ax.axvline(t["compared_at"], color="#888", lw=0.8, ls="--")
        ax.set_title(t["task"], fontsize="small")
        ax.set_xlabel("iterations" if t["budget"] == "iterations" else result["unit"], fontsize="small")
        ax.grid(alpha=0.3)
        if k == 0:
            ax.legend(fontsize="x-small")
    return _png(fig)


def plots(result: dict[str, Any]) -> dict[str, bytes]:
    """The PNGs that can be drawn; none without matplotlib (the tables do not need it)."""
    try:
        drawn = {"elo_vs_tokens": elo_vs_tokens(result), "best_so_far": curves(result)}
    except ImportError:
        return {}
    return {k: v for k, v in drawn.items() if v is not None}
