"""The `codex` researcher: `codex exec --json` in the run's worktree.

Codex edits the worktree itself: inside the harness's researcher sandbox (agents/sandboxed.py:
no .git, no capabilities) with its own sandbox off, since its nested bubblewrap cannot start
there; with `--agent-sandbox off`, inside its own workspace-write sandbox (it cannot commit:
the worktree's git directory lies outside that sandbox). The JSONL event stream gives the usage
(the last `turn.completed`: codex sums every request of the turn there), the errors, its
own retries (`Reconnecting... n/m`) and the final message. With `--base-url` the harness
generates a model provider on the command line (`-c model_providers.harness...`), so no
`CODEX_HOME/config.toml` is needed.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ..errors import AgentError
from .base import KEY_VARS, Task, Usage, json_object, last_line
from .cli import CLIOutput, CLIResearcher

INSTALL_HINT = ("Install it with `npm install -g @openai/codex`, then run `codex login` "
                "(or set OPENAI_API_KEY / CODEX_API_KEY), or name it with --agent-executable.")
PROVIDER = "harness"  # the name of the provider generated for --base-url
WIRE_APIS = ("responses", "chat")
RETRY_RE = re.compile(r"\b(?:reconnecting|retrying)\b\D{0,40}?(\d+)\s*/\s*(\d+)", re.I)


def parse_codex_events(text: str) -> CLIOutput:
    """Read `codex exec --json` output. Lines that are not JSON events are ignored.

    An `error` event followed by a `turn.completed` was transient (codex retried it itself);
    each `Reconnecting... n/m` is one retry.
    """
    usage, message, error, found, retries = None, "", None, False, 0
    for line in text.splitlines():
        event = json_object(line)
        if event is None:
            continue
        found = True
        kind = event.get("type")
        if kind == "item.completed":
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
            text_ = event.get("message") or "error"
            if RETRY_RE.search(text_):
                retries += 1
            error = text_
    return CLIOutput(usage, last_line(message), error, found, retries)


class CodexResearcher(CLIResearcher):
    name = "codex"
    config_names = (".codex",)  # its login and settings, bound into its sandbox
    config_vars = ("CODEX_HOME",)
    default_executable = "codex"
    install_hint = INSTALL_HINT
    key_vars = KEY_VARS["codex"]
    provider = "openai"

    def __init__(self, model: str | None = None, reasoning_effort: str | None = None,
                 executable: str | None = None, agent_args=None, base_url: str | None = None,
                 wire_api: str | None = None):
        super().__init__(model, executable, agent_args, base_url)
        if wire_api is not None and wire_api not in WIRE_APIS:
            raise AgentError(f"--wire-api must be one of {', '.join(WIRE_APIS)}, got {wire_api!r}.")
        self.reasoning_effort = reasoning_effort
        self.wire_api = wire_api or "responses"

    def provider_name(self) -> str:
        return PROVIDER if self.base_url else self.provider

    def settings(self) -> dict[str, Any]:
        return {"sandbox": "workspace-write", "reasoning_effort": self.reasoning_effort,
                "wire_api": self.wire_api if self.base_url else None}

    def provider_args(self) -> list[str]:
        """`-c` overrides that define and select a provider at --base-url (values are TOML)."""
        if not self.base_url:
            return []
        table = f"model_providers.{PROVIDER}"
        args = [f"model_provider={json.dumps(PROVIDER)}", f"{table}.name={json.dumps(PROVIDER)}",
                f"{table}.base_url={json.dumps(self.base_url)}", f"{table}.wire_api={json.dumps(self.wire_api)}"]
        key_var = self.key_var()
        if key_var:  # the variable's name goes on the command line, never the key
            args.append(f"{table}.env_key={json.dumps(key_var)}")
        return [part for arg in args for part in ("-c", arg)]

    def environment(self) -> dict[str, str]:
        # Its home named (its own default): in the harness's sandbox HOME is the researcher's own
        # folder, under /tmp in a run there, where codex refuses to put its helper binaries.
        return {} if os.environ.get("CODEX_HOME") else {"CODEX_HOME": str(Path.home() / ".codex")}

    def command(self, task: Task) -> list[str]:
        # Inside the harness's sandbox codex's own (a nested bubblewrap) cannot start: no capability
        # is left to map its user namespace. The harness's confines it to the same worktree.
        own = "danger-full-access" if task.jail is not None and task.jail.on else "workspace-write"
        argv = [self.executable, "exec", "--json", "--sandbox", own, "--ephemeral",
                "--skip-git-repo-check", "-C", str(task.worktree)]
        if self.model:
            argv += ["-m", self.model]
        if self.reasoning_effort:
            argv += ["-c", f'model_reasoning_effort="{self.reasoning_effort}"']
        return argv + self.provider_args()

    def command_tail(self, task: Task) -> list[str]:
        return ["-"]  # the prompt comes on stdin

    def parse(self, stdout: str, stderr: str = "") -> CLIOutput:
        return parse_codex_events(stdout)
