"""The `codex` researcher: `codex exec --json` in the run's worktree.

Codex edits the worktree itself inside its workspace-write sandbox (it cannot commit: the
worktree's git directory lies outside the sandbox). The JSONL event stream gives the usage
(the last `turn.completed`, cumulative for the thread), the errors and the final message.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .base import Proposal, Task, Usage, json_object, key_fingerprint, last_line
from .process import classify, find_executable, run_agent

INSTALL_HINT = ("Install it with `npm install -g @openai/codex`, then run `codex login` "
                "(or set OPENAI_API_KEY / CODEX_API_KEY).")


@dataclass
class CodexRun:
    usage: Usage
    description: str
    error: str | None
    thread_id: str | None = None


def parse_codex_events(text: str) -> CodexRun:
    """Read `codex exec --json` output. Lines that are not JSON events are ignored.

    An `error` event followed by a `turn.completed` was transient (codex retried it itself).
    """
    usage, message, error, thread_id = Usage(), "", None, None
    for line in text.splitlines():
        event = json_object(line)
        if event is None:
            continue
        kind = event.get("type")
        if kind == "thread.started":
            thread_id = event.get("thread_id")
        elif kind == "item.completed":
            item = event.get("item") or {}
            if item.get("type") == "agent_message" and item.get("text"):
                message = item["text"]
        elif kind == "turn.completed":
            u = event.get("usage") or {}
            usage = Usage(u.get("input_tokens") or 0, u.get("cached_input_tokens") or 0,
                          u.get("output_tokens") or 0)
            error = None
        elif kind == "turn.failed":
            error = ((event.get("error") or {}).get("message")) or "turn failed"
        elif kind == "error":
            error = event.get("message") or "error"
    return CodexRun(usage, last_line(message), error, thread_id)


class CodexResearcher:
    name = "codex"

    def __init__(self, model: str | None = None, reasoning_effort: str | None = None,
                 executable: str = "codex"):
        self.model = model
        self.reasoning_effort = reasoning_effort
        self.executable = find_executable(executable, INSTALL_HINT)

    def describe(self) -> dict[str, Any]:
        key = os.environ.get("CODEX_API_KEY") or os.environ.get("OPENAI_API_KEY")
        return {"backend": "codex", "model": self.model, "executable": self.executable,
                "sandbox": "workspace-write", "reasoning_effort": self.reasoning_effort,
                "key_fingerprint": key_fingerprint(key)}

    def argv(self, task: Task) -> list[str]:
        argv = [self.executable, "exec", "--json", "--sandbox", "workspace-write", "--ephemeral",
                "--skip-git-repo-check", "-C", str(task.worktree)]
        if self.model:
            argv += ["-m", self.model]
        if self.reasoning_effort:
            argv += ["-c", f'model_reasoning_effort="{self.reasoning_effort}"']
        return argv + ["-"]  # the prompt comes on stdin

    def propose(self, task: Task) -> Proposal:
        result = run_agent(self.argv(task), task.worktree, task.timeout_s, task.log_path,
                           stdin_text=task.prompt)
        run = parse_codex_events(result.stdout)
        failure = result.failure("codex", task.timeout_s)
        error = (failure if result.timed_out or result.launch_error else None) or run.error or failure
        kind = None
        if error:
            kind = "timeout" if result.timed_out else classify(error)
        # Tokens spent before a failure are still on the bill: the usage is kept either way.
        return Proposal(run.description, run.usage, result.agent_s, error=error, error_kind=kind)
