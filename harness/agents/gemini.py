"""The `gemini` researcher: `gemini -p ... --output-format json` in the run's worktree.

`--approval-mode auto_edit` lets it edit files without asking and refuses what would need
an approval (shell commands), as claude's acceptEdits does. The prompt comes on stdin (the
`-p` text is appended to it). The JSON object it prints at the end carries the answer
(`response`), an `error`, and per-model token counts (`stats.models.*.tokens`: prompt,
cached, candidates, thoughts); a call that fails prints its error object on stderr instead,
after the stack trace; its retries print `Attempt N failed with status S. Retrying with
backoff...` on stderr, or, for a 429 whose answer names a delay (`Please retry in 2s`, a
RetryInfo), `Attempt N failed: MESSAGE. Retrying after Mms...`.

`--base-url` sets GOOGLE_GEMINI_BASE_URL. gemini 0.61 then takes its auth type to be a
"gateway" sign-in that its headless mode refuses ("Invalid auth method selected") unless the
settings say `security.auth.selectedType = "gemini-api-key"`. The harness gives it a home of
its own for the run (GEMINI_CLI_HOME, which gemini reads instead of HOME): its
`.gemini/settings.json` is the user's, if any, with that auth type set, and the rest of the user's
`~/.gemini` is linked in. No user file is needed, and the user's own is never written. (The
system-settings path, GEMINI_CLI_SYSTEM_SETTINGS_PATH, would win over the user's file too, but gemini
skips a system file that is not root's in root-owned folders.)
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ..ledger import atomic
from .base import KEY_VARS, Task, Usage, json_object, last_line
from .cli import CLIOutput, CLIResearcher

INSTALL_HINT = ("Install it with `npm install -g @google/gemini-cli`, then set GEMINI_API_KEY "
                "(or run `gemini` once and log in), or name it with --agent-executable.")
APPROVAL_MODE = "auto_edit"
PROMPT_FLAG_TEXT = "Follow the instructions above."  # -p wants a text; the program is on stdin
# Both forms of its retry line: `... failed with status 429. Retrying with backoff...`, `... failed
# with 429 error (no Retry-After header)...`, and a quota error's `... failed: MESSAGE. Retrying after 1234ms...`.
ATTEMPT_RE = re.compile(r"^(Attempt \d+ failed(?: with status \d+| with \d{3} error|: .*Retrying after \d+ms).*)$",
                        re.M)
QUOTA_RETRY_RE = re.compile(r"^Attempt \d+ failed: .*Retrying after \d+ms")
API_KEY_AUTH = "gemini-api-key"  # security.auth.selectedType for a key sent to --base-url


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
    if not attempts:
        return 0, None
    last = attempts[-1]
    if QUOTA_RETRY_RE.match(last):  # only a 429/499/503 quota error is retried after a named delay
        last = f"rate limited (429, quota), retrying: {last}"
    return len(attempts), last


EDIT_TOOLS = ("replace", "write_file", "edit")
TOOL_ERROR_RE = re.compile(r"^Error executing tool (\w+): (.*)$", re.M)


def edit_failures(stats: dict[str, Any], stderr: str) -> list[str]:
    """Its edit tools' failed calls (`stats.tools.byName.<tool>.fail`), with their words from stderr."""
    said = {name: text for name, text in TOOL_ERROR_RE.findall(stderr or "")}
    by_name = ((stats or {}).get("tools") or {}).get("byName") or {}
    failed = []
    for name in EDIT_TOOLS:
        count = int(((by_name.get(name) or {}).get("fail")) or 0)
        if count:
            words = " ".join(said.get(name, "").split())
            failed.append(f"its {name} failed {count}x" + (f" ({words[:160]})" if words else ""))
    return failed


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
                     str(error)[:500] if error else None, True, max(api_retries(stats), retried),
                     edit_failures=tuple(edit_failures(stats, stderr)))


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

    def call_environment(self, task: Task) -> dict[str, str]:
        env = self.environment()
        if self.base_url:
            env["GEMINI_CLI_HOME"] = str(self.write_home(task))
        return env

    def home_for(self, task: Task) -> Path:
        """The per-run home gemini gets with --base-url: in the researcher's own home (in its view
        when sandboxed), else beside the call's log."""
        where = task.jail.home if task.jail is not None else task.log_path.parent
        return Path(where) / "gemini-home"

    def write_home(self, task: Task) -> Path:
        """GEMINI_CLI_HOME for one call: its .gemini/settings.json is the user's own with the API-key
        auth type set; everything else of the user's ~/.gemini (login, trusted folders) is linked in."""
        real = Path(os.environ.get("GEMINI_CLI_HOME") or Path.home()) / ".gemini"
        home = self.home_for(task)
        folder = home / ".gemini"
        folder.mkdir(parents=True, exist_ok=True)
        if real.is_dir() and real.resolve() != folder.resolve():
            for entry in real.iterdir():
                link = folder / entry.name
                if entry.name != "settings.json" and (link.is_symlink() or not link.exists()):
                    link.unlink(missing_ok=True)
                    link.symlink_to(entry.resolve())
        base = read_settings(real / "settings.json")
        security = base.get("security") if isinstance(base.get("security"), dict) else {}
        auth = security.get("auth") if isinstance(security.get("auth"), dict) else {}
        base["security"] = {**security, "auth": {**auth, "selectedType": API_KEY_AUTH}}
        atomic.atomic_write(folder / "settings.json", json.dumps(base, indent=2))
        return home

    def command(self, task: Task) -> list[str]:
        # --skip-trust: the run's fresh worktree is trusted for this call only; in a folder it does
        # not trust, gemini falls back to asking for every edit, which print mode cannot answer.
        argv = [self.executable, "--output-format", "json", "--approval-mode", APPROVAL_MODE, "--skip-trust"]
        return argv + (["--model", self.model] if self.model else [])

    def command_tail(self, task: Task) -> list[str]:
        return ["-p", PROMPT_FLAG_TEXT]

    def parse(self, stdout: str, stderr: str = "") -> CLIOutput:
        return parse_gemini_output(stdout, stderr)


def read_settings(path: Path) -> dict[str, Any]:
    """A gemini settings file as a dict ({} when it is missing or not a JSON object)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
