"""The `gemini` researcher: `gemini -p ... --output-format json` in the run's worktree.

`--approval-mode auto_edit` lets it edit files without asking and refuses what would need
an approval (shell commands), as claude's acceptEdits does. The prompt comes on stdin (the
`-p` text is appended to it). The JSON object it prints at the end carries the answer
(`response`), an `error`, and per-model token counts (`stats.models.*.tokens`: prompt,
cached, candidates, thoughts); a call that fails prints its error object on stderr instead,
after the stack trace; its retries print `Attempt N failed with status S` on stderr.
`--base-url` sets GOOGLE_GEMINI_BASE_URL; gemini 0.61 then
wants `security.auth.selectedType = "gemini-api-key"` in ~/.gemini/settings.json, or it
refuses with "Invalid auth method selected" (docs/researchers.md).
"""
from __future__ import annotations

import re
from typing import Any

from .base import KEY_VARS, Task, Usage, json_object, last_line
from .cli import CLIOutput, CLIResearcher

INSTALL_HINT = ("Install it with `npm install -g @google/gemini-cli`, then set GEMINI_API_KEY "
                "(or run `gemini` once and log in), or name it with --agent-executable.")
APPROVAL_MODE = "auto_edit"
PROMPT_FLAG_TEXT = "Follow the instructions above."  # -p wants a text; the program is on stdin
ATTEMPT_RE = re.compile(r"^(Attempt \d+ failed with status \d+.*)$", re.M)


def _result_object(text: str) -> dict[str, Any] | None:
    whole = json_object(text)
    if whole is not None:
        return whole
    start = text.find("\n{")  # a banner line, then the pretty-printed object
    return json_object(text[start + 1:]) if start >= 0 else None


def _last_object(text: str) -> dict[str, Any] | None:
    """The pretty-printed object that ends text, after warnings and stack traces (a failed call's stderr)."""
    end = len(text)
    while (start := text.rfind("\n{", 0, end)) >= 0:
        found = json_object(text[start + 1:])
        if found is not None:
            return found
        end = start
    return json_object(text)


def gemini_usage(stats: dict[str, Any]) -> Usage | None:
    """Tokens summed over the models it used; output includes thoughts. None when it has none."""
    models = (stats or {}).get("models") or {}
    if not models:
        return None
    total = Usage()
    for entry in models.values():
        t = (entry or {}).get("tokens") or {}
        total = total + Usage(t.get("prompt") or 0, t.get("cached") or 0,
                              (t.get("candidates") or 0) + (t.get("thoughts") or 0))
    return total


def api_retries(stats: dict[str, Any]) -> int:
    """Requests beyond the first of each call: gemini retries failed requests itself."""
    models = (stats or {}).get("models") or {}
    retries = 0
    for entry in models.values():
        api = (entry or {}).get("api") or {}
        retries += int(api.get("totalErrors") or 0)
    return retries


def stderr_retries(stderr: str) -> tuple[int, str | None]:
    """gemini's `Attempt N failed with status S. Retrying...` lines: how many, and the last one."""
    attempts = ATTEMPT_RE.findall(stderr or "")
    return len(attempts), (attempts[-1] if attempts else None)


def parse_gemini_output(text: str, stderr: str = "") -> CLIOutput:
    retried, last = stderr_retries(stderr)
    data = _result_object(text.strip()) or _last_object((stderr or "").strip())
    if data is None:
        if last:  # still retrying when it ended: its last attempt's failure says why
            return CLIOutput(None, "", last, True, retried)
        return CLIOutput(None, "", "gemini printed no JSON result object", False)
    stats = data.get("stats") or {}
    error = data.get("error")
    if isinstance(error, dict):
        error = error.get("message") or error.get("type") or "error"
    response = data.get("response") if isinstance(data.get("response"), str) else ""
    return CLIOutput(gemini_usage(stats), "" if error else last_line(response),
                     str(error)[:500] if error else None, True, max(api_retries(stats), retried))


class GeminiResearcher(CLIResearcher):
    name = "gemini"
    config_names = (".gemini",)  # its login and settings, bound into its sandbox
    default_executable = "gemini"
    install_hint = INSTALL_HINT
    key_vars = KEY_VARS["gemini"]
    provider = "gemini"

    def settings(self) -> dict[str, Any]:
        return {"approval_mode": APPROVAL_MODE}

    def environment(self) -> dict[str, str]:
        return {"GOOGLE_GEMINI_BASE_URL": self.base_url} if self.base_url else {}

    def command(self, task: Task) -> list[str]:
        # --skip-trust: the run's fresh worktree is trusted for this call only; in a folder it does
        # not trust, gemini falls back to asking for every edit, which print mode cannot answer.
        argv = [self.executable, "--output-format", "json", "--approval-mode", APPROVAL_MODE, "--skip-trust"]
        return argv + (["--model", self.model] if self.model else [])

    def command_tail(self, task: Task) -> list[str]:
        return ["-p", PROMPT_FLAG_TEXT]

    def parse(self, stdout: str, stderr: str = "") -> CLIOutput:
        return parse_gemini_output(stdout, stderr)
