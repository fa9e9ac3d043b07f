"""When a run stops starting candidates: one policy for every run, lane and A/B arm.

- `--iterations N`: N proposals (the baseline, repeats and the re-evaluation of a win whose best
  moved meanwhile are not proposals), counted over the whole run, across --resume.
- `--hours H`: the run's own elapsed time - the time a harness was driving it, summed over every
  session (`runs/<tag>/clock.json`) - so a resumed run continues its budget instead of restarting
  it. A candidate is not started when, at the slowest of the last iterations, it would not
  finish in time.
- `--max-tokens` / `--max-cost`: the next iteration, at the mean spend so far (and the proposals
  already spending), would pass the cap; the run then writes one final `budget` row.
- the health monitor's verdict (health.py).
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from ..ledger import atomic
from .. import ledger
from ..agents import pricing
from ..config import RunConfig
from ..ledger import Row

CLOCK_NAME = "clock.json"
REEVALUATED_RE = re.compile(r"re-evaluated on it as iteration (\d+)")  # ledgers before the `kind` column
WALL_WINDOW = 5  # iterations whose slowest wall time estimates the next one


class RunClock:
    """The run's own elapsed time, carried across restarts."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / CLOCK_NAME
        self.before_s = self._load()
        self.start = time.monotonic()

    def _load(self) -> float:
        try:
            return float(json.loads(self.path.read_text())["elapsed_s"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0.0

    def elapsed_s(self) -> float:
        return self.before_s + time.monotonic() - self.start

    def save(self) -> None:
        """Write-and-rename: a kill leaves the last saved value (at most one iteration behind)."""
        if not self.path.parent.exists():
            return
        try:
            atomic.atomic_write(self.path, json.dumps({"elapsed_s": round(self.elapsed_s(), 3)}))
        except OSError:
            pass  # a full disk: the clock is advisory; the ledger is what must not be lost


def proposals(rows: list[dict[str, Any]]) -> int:
    """Candidates the researcher proposed, from the ledger alone."""
    again = {int(m) for r in rows if r.get("kind") is None
             for m in REEVALUATED_RE.findall(r.get("description") or "")}
    return sum(1 for r in rows if (r.get("iteration") or 0) > 0
               and r.get("status") not in ("repeat", "budget", "stopped")  # a stopped call is spend only
               and r.get("kind") != "reeval" and r.get("iteration") not in again)


class Spend:
    """Running totals of the researcher's spend, so no check re-reads the whole ledger. A call whose
    usage is unknown (killed before it reported) counts at the largest known call (spend.py)."""

    def __init__(self, rows: list[dict[str, Any]]):
        self.count = self.unknown = self.known_tokens = self.max_tokens = 0
        self.known_cost_usd, self.max_cost_usd, self.unpriced = 0.0, 0.0, False
        for r in rows:
            self.add(r)

    def add(self, row: dict[str, Any] | Row) -> None:
        get = row.get if isinstance(row, dict) else lambda k: getattr(row, k, None)
        if (get("iteration") or 0) <= 0 or get("agent_s") is None or get("status") in ("repeat", "budget"):
            return
        self.count += 1
        if get("input_tokens") is None and get("output_tokens") is None:
            self.unknown += 1
            return
        tokens = (get("input_tokens") or 0) + (get("output_tokens") or 0)
        self.known_tokens += tokens
        self.max_tokens = max(self.max_tokens, tokens)
        cost = get("cost_usd")
        self.known_cost_usd += cost or 0.0
        self.max_cost_usd = max(self.max_cost_usd, cost or 0.0)
        self.unpriced = self.unpriced or (cost is None and tokens > 0)

    @property
    def tokens(self) -> int:
        return self.known_tokens + self.unknown * self.max_tokens

    @property
    def cost_usd(self) -> float:
        return self.known_cost_usd + self.unknown * self.max_cost_usd


class StopPolicy:
    def __init__(self, cfg: RunConfig, rows: list[dict[str, Any]], clock: RunClock):
        self.cfg, self.clock = cfg, clock
        self.resync(rows)

    def resync(self, rows: list[dict[str, Any]]) -> None:
        """Counts from the ledger (after rows were written elsewhere: the baseline, a resume's training)."""
        self.proposed = proposals(rows)
        self.spend = Spend(rows)
        self.walls = [r.get("wall_s") or 0.0 for r in rows if r.get("status") not in ("repeat", "budget")][-WALL_WINDOW:]

    def after_row(self, row: Row) -> None:
        self.spend.add(row)
        if row.status not in ("repeat", "budget", "stopped"):
            self.walls = (self.walls + [row.wall_s or 0.0])[-WALL_WINDOW:]
        self.clock.save()

    def reason(self, in_flight: int = 0) -> str | None:
        """Why no new proposal may start now, or None. in_flight: proposals not on the ledger yet."""
        cfg = self.cfg
        if cfg.iterations is not None and self.proposed >= cfg.iterations:
            return f"reached --iterations {cfg.iterations}"
        if cfg.hours is not None:
            estimate_s = max(self.walls or [0.0])
            if self.clock.elapsed_s() + estimate_s > cfg.hours * 3600:
                return f"reached --hours {cfg.hours:g} (the next iteration would not finish in time)"
        return self.budget_reason(in_flight)

    def budget_reason(self, in_flight: int = 0) -> str | None:
        cfg, sp = self.cfg, self.spend
        if not sp.count or (cfg.max_tokens is None and cfg.max_cost is None):
            return None
        ahead = 1 + in_flight
        if cfg.max_tokens is not None and sp.tokens + ahead * sp.tokens / sp.count > cfg.max_tokens:
            return f"the next iteration would pass --max-tokens {cfg.max_tokens} (spent {sp.tokens})"
        if cfg.max_cost is not None and sp.unpriced:
            return (f"--max-cost {cfg.max_cost:g} cannot be enforced: model {cfg.model or '?'} has no price "
                    f"(add one with --prices FILE)")
        if cfg.max_cost is not None and sp.cost_usd + ahead * sp.cost_usd / sp.count > cfg.max_cost:
            return f"the next iteration would pass --max-cost {cfg.max_cost:g} USD (spent {sp.cost_usd:.4f})"
        return None

    def take(self) -> None:
        """A proposal is starting."""
        self.proposed += 1


def budget_row(cfg: RunConfig, best_commit: str, iteration: int, reason: str, agent: str) -> Row:
    """The final row of a run stopped by --max-tokens or --max-cost."""
    return Row(commit=best_commit, metric=None, status="budget", iteration=iteration, arm=cfg.arm,
               description=f"stopped: {reason}", kind="budget", reason="budget", agent=agent, model=pricing.resolve_model(cfg.model) or "",
               started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def is_budget(reason: str) -> bool:
    return "--max-tokens" in reason or "--max-cost" in reason


def ledger_rows(cfg: RunConfig) -> list[dict[str, Any]]:
    return ledger.read_rows(cfg.ledger_path) if cfg.ledger_path.exists() else []
