"""The `claude` researcher: `claude -p --output-format json` in the run's worktree.

`--permission-mode acceptEdits` lets it edit files without asking; anything else that would
need approval (shell commands) is refused in print mode, so it cannot train or commit.
A not-logged-in answer still says `subtype: success`: `is_error` is what tells.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .base import Proposal, Task, Usage, json_object, key_fingerprint, last_line
from .process import classify, find_executable, run_agent

INSTALL_HINT = ("Install it with `npm install -g @anthropic-ai/claude-code`, then run `claude` once "
                "and /login (or set ANTHROPIC_API_KEY).")
PERMISSION_MODE = "acceptEdits"


@dataclass
class ClaudeRun:
    usage: Usage
    description: str
    error: str | None


def _result_object(text: str) -> dict[str, Any] | None:
    text = text.strip()
    candidates = [text] + [line.strip() for line in reversed(text.splitlines())]
    for candidate in candidates:
        data = json_object(candidate)
        if data is not None and data.get("type") == "result":
            return data
    return None


def parse_claude_result(text: str) -> ClaudeRun:
    """Read `claude -p --output-format json` output: one result object."""
    data = _result_object(text)
    if data is None:
        return ClaudeRun(Usage(), "", "claude printed no JSON result object")
    u = data.get("usage") or {}
    cache_read = u.get("cache_read_input_tokens") or 0
    cache_write = u.get("cache_creation_input_tokens") or 0
    cost = data.get("total_cost_usd")
    usage = Usage((u.get("input_tokens") or 0) + cache_read + cache_write, cache_read,
                  u.get("output_tokens") or 0, float(cost) if cost is not None else None)
    result = data.get("result") if isinstance(data.get("result"), str) else ""
    error = None
    if data.get("is_error") or data.get("subtype") not in (None, "success"):
        error = (result.strip() or str(data.get("subtype") or "error"))[:500]
    return ClaudeRun(usage, "" if error else last_line(result), error)


class ClaudeResearcher:
    name = "claude"

    def __init__(self, model: str | None = None, executable: str = "claude"):
        self.model = model
        self.executable = find_executable(executable, INSTALL_HINT)

    def describe(self) -> dict[str, Any]:
        return {"backend": "claude", "model": self.model, "executable": self.executable,
                "permission_mode": PERMISSION_MODE,
                "key_fingerprint": key_fingerprint(os.environ.get("ANTHROPIC_API_KEY"))}

    def argv(self) -> list[str]:
        argv = [self.executable, "-p", "--output-format", "json", "--permission-mode", PERMISSION_MODE]
        return argv + (["--model", self.model] if self.model else [])  # the prompt comes on stdin

    def propose(self, task: Task) -> Proposal:
        result = run_agent(self.argv(), task.worktree, task.timeout_s, task.log_path, stdin_text=task.prompt)
        run = parse_claude_result(result.stdout)
        failure = result.failure("claude", task.timeout_s)
        if result.timed_out or result.launch_error:
            error = failure
        elif run.error and _result_object(result.stdout) is None and failure:
            error = failure  # no JSON at all: the exit code and stderr say more
        else:
            error = run.error or failure
        kind = None if not error else "timeout" if result.timed_out else classify(error)
        return Proposal(run.description, run.usage, result.agent_s, error=error, error_kind=kind)
