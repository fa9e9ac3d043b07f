"""The researcher protocol: propose(task) -> Proposal.

A researcher edits the worktree (CLI agents in place; the API agent applies the edits it
gets back) and returns a one-line description plus its token usage. It never commits,
trains or judges: the step does.
"""
from __future__ import annotations

import hashlib
import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# Why an invocation failed, for `harness check` to tell the user what to fix.
ERROR_KINDS = ("missing_key", "auth", "not_found", "rate_limit", "not_logged_in", "timeout",
               "server", "bad_response", "connection", "bad_request", "agent", "cancelled")

# The environment variables each backend takes its key from, in the order they are looked up.
KEY_VARS = {"openai": ("OPENAI_API_KEY",), "codex": ("CODEX_API_KEY", "OPENAI_API_KEY"),
            "claude": ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"),
            "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY")}


@dataclass(frozen=True)
class Task:
    worktree: Path  # checked out at the parent commit
    prompt: str  # the rendered program, bounded in size
    editable: tuple[str, ...]
    timeout_s: float  # hard limit for this invocation
    log_path: Path  # the invocation's whole output goes here
    iteration: int
    seed: int
    tried: frozenset[str] = frozenset()  # content hashes of editable files already evaluated
    cancel: threading.Event | None = None  # set from another thread: stop now, return "cancelled"
    jail: Any = None  # sandboxed.Jail: how a CLI researcher's process is confined; None = not at all


@dataclass
class Usage:
    input_tokens: int = 0  # including cached input tokens
    cached_tokens: int = 0
    output_tokens: int = 0  # reasoning tokens included
    cost_usd: float | None = None  # only when the backend reports it
    known: bool = True  # False: the call ended (killed, cancelled) before its usage was reported
    # Input tokens written to the prompt cache (part of input_tokens, not of cached_tokens), and the
    # 1-hour part of them: priced apart (models.toml cache_write, cache_write_1h); not ledger columns.
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0

    @classmethod
    def unknown(cls) -> "Usage":
        """The usage of a call that was billed but never said how much: not zero, unknown."""
        return cls(known=False)

    def cells(self) -> tuple[int | None, int | None, int | None]:
        """(input, cached, output) for the ledger: empty cells when unknown."""
        if not self.known:
            return None, None, None
        return self.input_tokens, self.cached_tokens, self.output_tokens

    def __add__(self, other: "Usage") -> "Usage":
        cost = None
        if self.cost_usd is not None or other.cost_usd is not None:
            cost = (self.cost_usd or 0.0) + (other.cost_usd or 0.0)
        return Usage(self.input_tokens + other.input_tokens,
                     self.cached_tokens + other.cached_tokens,
                     self.output_tokens + other.output_tokens, cost, self.known and other.known,
                     self.cache_write_tokens + other.cache_write_tokens,
                     self.cache_write_1h_tokens + other.cache_write_1h_tokens)


@dataclass
class Proposal:
    description: str
    usage: Usage = field(default_factory=Usage)
    agent_s: float = 0.0  # s of wall time for the invocation
    retries: int = 0
    error: str | None = None  # the invocation failed; the step records it as a crash
    error_kind: str | None = None  # one of ERROR_KINDS when error is set
    problems: tuple[str, ...] = ()  # what was wrong in its report (the step records them as events)


# ---------------------------------------------------------------------------
# A researcher's own report, validated: a number it gives is a count or a price, or it is unknown

DESCRIPTION_CHARS = 200  # a row's description: one line a person reads
TOKEN_FIELDS = ("input_tokens", "cached_tokens", "output_tokens")


def reported_number(data: dict[str, Any], key: str, whole: bool) -> tuple[float | int | None, str | None]:
    """data[key] as a finite, non-negative number (an int when whole), None when absent; (None, why)
    when it is there but not one (a negative cost would lower the run's spend under --max-cost)."""
    value = data.get(key)
    if value is None:
        return None, None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if ok and whole and float(value) != int(value):
        ok = False
    if not ok:
        return None, f"{key} {str(value)[:40]!r} is not a non-negative number"
    return (int(value) if whole else float(value)), None


def reported_usage(data: dict[str, Any], cost_key: str = "cost_usd") -> tuple[Usage, list[str]]:
    """The usage a report states: a bad token count makes the call's usage unknown (never 0); a bad
    cost makes its cost unknown (the price table may still price its tokens)."""
    problems: list[str] = []
    counts = []
    for key in TOKEN_FIELDS:
        value, why = reported_number(data, key, whole=True)
        problems += [why] if why else []
        counts.append(value or 0)
    cost, why = reported_number(data, cost_key, whole=False)
    problems += [why] if why else []
    if any(p.split()[0] in TOKEN_FIELDS for p in problems):
        return Usage(cost_usd=cost, known=False), problems
    return Usage(*counts, cost_usd=cost), problems


def printable(text: str, limit: int = DESCRIPTION_CHARS) -> str:
    """A description as one line of printable text (control bytes and binary garbage become '?'), cut."""
    flat = "".join(c if c.isprintable() else ("?" if c not in "\t\n\r" else " ") for c in str(text or ""))
    flat = " ".join(flat.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class Researcher(Protocol):
    name: str
    model: str | None

    def propose(self, task: Task) -> Proposal: ...

    def describe(self) -> dict[str, Any]:
        """Settings for the run manifest (never a key)."""
        ...


def key_fingerprint(key: str | None) -> str | None:
    """A short, one-way fingerprint of a key for the manifest: the key itself is never stored."""
    return hashlib.sha256(key.encode()).hexdigest()[:8] if key else None


def json_object(text: str) -> dict[str, Any] | None:
    """text as a JSON object, or None when it is not one (agent output mixes JSON and prose)."""
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def last_line(text: str) -> str:
    """The last non-empty line of text (an agent's one-line description), stripped."""
    for line in reversed((text or "").splitlines()):
        if line.strip():
            return line.strip()
    return ""
