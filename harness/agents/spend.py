"""What the researcher calls of a run spent, for the budgets: unknown is not zero.

A call killed before it reported its usage (a timeout, a cancel) was billed all the same:
its ledger cells are empty, and the budgets count it at a conservative estimate, the
largest call of the run so far (tokens and cost). With no reported call yet there is no
estimate, and such a call counts as nothing until one arrives.
"""
from __future__ import annotations

from typing import Any


def is_call(row: dict[str, Any]) -> bool:
    """A ledger row of a researcher call (not the baseline, a repeat or a budget stop)."""
    return (row.get("iteration") or 0) > 0 and row.get("agent_s") is not None


def unknown(row: dict[str, Any]) -> bool:
    return is_call(row) and row.get("input_tokens") is None and row.get("output_tokens") is None


def tokens(row: dict[str, Any]) -> int:
    return (row.get("input_tokens") or 0) + (row.get("output_tokens") or 0)


def call_tokens(rows: list[dict[str, Any]]) -> list[int]:
    """Tokens of each call, the unknown ones at the largest known call's."""
    calls = [r for r in rows if is_call(r)]
    known = [tokens(r) for r in calls if not unknown(r)]
    estimate = max(known, default=0)
    return [estimate if unknown(r) else tokens(r) for r in calls]


def call_costs(rows: list[dict[str, Any]]) -> list[float | None]:
    """USD of each call: None for a call with tokens but no price; unknown ones at the largest cost."""
    calls = [r for r in rows if is_call(r)]
    known = [r.get("cost_usd") for r in calls if not unknown(r) and r.get("cost_usd") is not None]
    estimate = max(known, default=0.0)
    return [estimate if unknown(r) else r.get("cost_usd") for r in calls]


def unknown_calls(rows: list[dict[str, Any]]) -> int:
    return sum(1 for r in rows if unknown(r))
