"""The `claude` researcher: `claude -p --output-format stream-json --verbose` in the worktree.

`--permission-mode acceptEdits` lets it edit files without asking; anything else that would
need approval (shell commands) is refused in print mode, so it cannot train or commit.
The stream's last line is the same result object `--output-format json` prints; before it,
a `system` event with subtype `api_retry` marks each retry (429, 529, 5xx), so a rate-limit
storm shows in the agent log and in `retries`. A not-logged-in answer still says
`subtype: success`: `is_error` is what tells. `--base-url` sets ANTHROPIC_BASE_URL.
"""
from __future__ import annotations

import json
import re
from typing import Any

from .base import KEY_VARS, Task, Usage, json_object, last_line, reported_number
from .cli import CLIOutput, CLIResearcher

INSTALL_HINT = ("Install it with `npm install -g @anthropic-ai/claude-code`, then run `claude` once "
                "and /login (or set ANTHROPIC_API_KEY), or name it with --agent-executable.")
PERMISSION_MODE = "acceptEdits"


def _events(text: str) -> list[dict[str, Any]]:
    text = text.strip()
    whole = json_object(text)
    if whole is not None:
        return [whole]
    return [e for e in (json_object(line) for line in text.splitlines()) if e is not None]


def result_usage(data: dict[str, Any], cost: float | None) -> Usage:
    """The result's tokens: `modelUsage` (every request of every model, the side requests that
    name the session included) when it is there, else `usage` (the main model's turns).
    Input includes the cache reads and writes; cached = the cache reads; the cache writes are kept
    apart for their price, the 1-hour ones by `usage.cache_creation.ephemeral_1h_input_tokens`
    (modelUsage does not split them by lifetime)."""
    u = data.get("usage") or {}
    long_writes = int((u.get("cache_creation") or {}).get("ephemeral_1h_input_tokens") or 0)
    models = data.get("modelUsage")
    if isinstance(models, dict) and models:
        total = Usage(cost_usd=cost)
        for m in models.values():
            read, write = m.get("cacheReadInputTokens") or 0, m.get("cacheCreationInputTokens") or 0
            total = total + Usage((m.get("inputTokens") or 0) + read + write, read, m.get("outputTokens") or 0,
                                  cache_write_tokens=write)
    else:
        read, write = u.get("cache_read_input_tokens") or 0, u.get("cache_creation_input_tokens") or 0
        total = Usage((u.get("input_tokens") or 0) + read + write, read, u.get("output_tokens") or 0, cost,
                      cache_write_tokens=write)
    total.cache_write_1h_tokens = min(long_writes, total.cache_write_tokens)
    return total


EDIT_TOOLS = ("Edit", "MultiEdit", "Write", "NotebookEdit")


def edit_failures(events: list[dict[str, Any]]) -> list[str]:
    """Its edit tools' calls that answered with an error (`tool_result` with `is_error`): an edit it
    tried and did not make ("String to replace not found"), whatever its answer says afterwards."""
    calls: dict[str, tuple[str, str]] = {}
    failed = []
    for event in events:
        content = (event.get("message") or {}).get("content")
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use" and block.get("name") in EDIT_TOOLS:
                path = str((block.get("input") or {}).get("file_path") or "a file")
                calls[str(block.get("id"))] = (str(block["name"]), path.rsplit("/", 1)[-1])
            elif block.get("type") == "tool_result" and block.get("is_error") and str(block.get("tool_use_id")) in calls:
                name, path = calls[str(block.get("tool_use_id"))]
                said = block.get("content")
                said = said if isinstance(said, str) else json.dumps(said)
                said = re.sub(r"</?tool_use_error>", "", said).strip().splitlines()
                failed.append(f"its {name} of {path} failed" + (f" ({said[0][:120]})" if said else ""))
    return failed


def parse_claude_result(text: str) -> CLIOutput:
    """Read claude's output: `stream-json` lines or one `json` result object."""
    events = _events(text)
    retries = sum(1 for e in events if e.get("type") == "system" and e.get("subtype") == "api_retry")
    data = next((e for e in reversed(events) if e.get("type") == "result"), None)
    if data is None:
        retry = next((e for e in reversed(events) if e.get("subtype") == "api_retry"), None)
        if retry is None:  # killed before it answered, or no stream at all: no error text of its own
            return CLIOutput(None, "", "claude printed no JSON result object", False, retries)
        error = f"claude was still retrying: {retry.get('error_status') or ''} {retry.get('error') or ''}".strip()
        return CLIOutput(None, "", error, True, retries)
    cost, _ = reported_number(data, "total_cost_usd", whole=False)  # a negative or garbled cost: unknown
    usage = result_usage(data, cost)
    result = data.get("result") if isinstance(data.get("result"), str) else ""
    error = None
    if data.get("is_error") or data.get("subtype") not in (None, "success"):
        error = (result.strip() or str(data.get("subtype") or "error"))[:500]
    return CLIOutput(usage, "" if error else last_line(result), error, True, retries,
                     edit_failures=tuple(edit_failures(events)))


class ClaudeResearcher(CLIResearcher):
    name = "claude"
    config_names = (".claude", ".claude.json")  # its login and settings, bound into its sandbox
    config_vars = ("CLAUDE_CONFIG_DIR",)
    default_executable = "claude"
    install_hint = INSTALL_HINT
    key_vars = KEY_VARS["claude"]
    provider = "anthropic"
    reports_cost = True  # total_cost_usd

    def settings(self) -> dict[str, Any]:
        return {"permission_mode": PERMISSION_MODE}

    def environment(self) -> dict[str, str]:
        return {"ANTHROPIC_BASE_URL": self.base_url} if self.base_url else {}

    def command(self, task: Task) -> list[str]:
        argv = [self.executable, "-p", "--output-format", "stream-json", "--verbose",
                "--permission-mode", PERMISSION_MODE]
        return argv + (["--model", self.model] if self.model else [])  # the prompt comes on stdin

    def parse(self, stdout: str, stderr: str = "") -> CLIOutput:
        return parse_claude_result(stdout)
