"""Render the program the researcher reads: program.md + current best + recent results + last failure.

Everything added is bounded, so the prompt does not grow with the number of iterations.
"""
from __future__ import annotations

from typing import Any

MAX_FAILURE_CHARS = 3000  # chars of the last failing log's tail
MAX_DESCRIPTION_CHARS = 120  # chars per description in the results table
PLACEHOLDERS = ("{{BEST}}", "{{RESULTS}}", "{{LAST_FAILURE}}")


def _num(value: Any, digits: int = 6) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _decided(row: dict[str, Any]) -> Any:
    """The value a decision used (a confirmed candidate's mean), as the ledger's metric column holds it."""
    if row.get("status") != "repeat" and row.get("mean") is not None:
        return row["mean"]
    return row.get("metric")


def best_text(best: dict[str, Any] | None, metric: str, direction: str) -> str:
    goal = "lower" if direction == "minimize" else "higher"
    if best is None:
        return f"No result yet ({goal} {metric} is better)."
    return (f"Current best {metric}: {_num(_decided(best))} at commit {best.get('commit', '')[:12]} "
            f"({best.get('description', '')}). {goal.capitalize()} is better.")


def results_text(rows: list[dict[str, Any]], metric: str, limit: int) -> str:
    recent = rows[-limit:] if limit else []
    if not recent:
        return "(no experiments yet)"
    lines = [f"| iter | commit | {metric} | status | description |", "|---|---|---|---|---|"]
    for r in recent:
        desc = str(r.get("description") or "")
        if len(desc) > MAX_DESCRIPTION_CHARS:
            desc = desc[: MAX_DESCRIPTION_CHARS - 3] + "..."
        lines.append(f"| {r.get('iteration', '')} | {str(r.get('commit') or '')[:8]} | "
                     f"{_num(_decided(r))} | {r.get('status', '')} | {desc.replace('|', '/')} |")
    return "\n".join(lines)


def failure_text(log_tail: str) -> str:
    if not log_tail.strip():
        return "(no failures so far)"
    cut = log_tail[-MAX_FAILURE_CHARS:]
    return "```\n" + cut.strip("\n") + "\n```"


def render(program: str, *, metric: str, direction: str, best: dict[str, Any] | None,
           rows: list[dict[str, Any]], history_rows: int, last_failure: str,
           editable: tuple[str, ...], note: str = "") -> str:
    """The full prompt. Placeholders are filled where program.md has them; else sections are appended."""
    values = {
        "{{BEST}}": best_text(best, metric, direction),
        "{{RESULTS}}": results_text(rows, metric, history_rows),
        "{{LAST_FAILURE}}": failure_text(last_failure),
    }
    text = program
    missing = []
    for key, value in values.items():
        if key in text:
            text = text.replace(key, value)
        else:
            missing.append(key)
    titles = {"{{BEST}}": "Current best", "{{RESULTS}}": "Recent results",
              "{{LAST_FAILURE}}": "Tail of the last failing log"}
    for key in missing:
        text += f"\n\n## {titles[key]}\n\n{values[key]}"
    text += ("\n\n## This iteration\n\nYou may edit only: " + ", ".join(editable) +
             ". Make one change, do not run the training yourself, and finish with a one-line "
             "description of the change as the last line of your answer.")
    if note:
        text += "\n\n" + note
    return text + "\n"
