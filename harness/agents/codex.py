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
import tempfile
from pathlib import Path
from typing import Any

from ..errors import AgentError
from .base import KEY_VARS, Task, Usage, json_object, last_line
from .cli import CLIOutput, CLIResearcher

INSTALL_HINT = ("Install it with `npm install -g @openai/codex`, then run `codex login` "
                "(or set OPENAI_API_KEY / CODEX_API_KEY), or name it with --agent-executable.")
PROVIDER = "harness"  # the name of the provider generated for --base-url
WIRE_APIS = ("responses", "chat")
# A tool call of its that failed, as its log on stderr says it; only an edit's failure counts here.
TOOL_ERROR_RE = re.compile(r"codex_core::tools::router: error=(.*(?:\n(?!\d{4}-\d\d-\d\dT).*){0,3})")
EDIT_ERROR_RE = re.compile(r"apply_patch|failed to write file|patch", re.I)
RETRY_RE = re.compile(r"\b(?:reconnecting|retrying)\b\D{0,40}?(\d+)\s*/\s*(\d+)", re.I)


def stderr_edit_failures(stderr: str) -> list[str]:
    """The failed edits codex logged on stderr (a patch that did not apply, a file it could not write)."""
    found = []
    for m in TOOL_ERROR_RE.finditer(stderr or ""):
        text = " ".join(m.group(1).split())
        if EDIT_ERROR_RE.search(text):
            found.append(text[:200])
    return found


def parse_codex_events(text: str, stderr: str = "") -> CLIOutput:
    """Read `codex exec --json` output. Lines that are not JSON events are ignored.

    An `error` event followed by a `turn.completed` was transient (codex retried it itself);
    each `Reconnecting... n/m` is one retry. A `file_change` item that ended `failed` is an edit
    it tried and did not make (its final message may still say it did).
    """
    usage, message, error, found, retries = None, "", None, False, 0
    failed_edits: list[str] = []
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
            elif item.get("type") == "file_change" and item.get("status") == "failed":
                paths = ", ".join(Path(str(c.get("path"))).name for c in item.get("changes") or [])
                failed_edits.append(f"its change of {paths or 'a file'} failed")
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
    failed_edits += stderr_edit_failures(stderr)
    return CLIOutput(usage, last_line(message), error, found, retries, edit_failures=tuple(failed_edits))


# ---------------------------------------------------------------------------
# Where codex keeps its home. Under the temporary folder (/tmp, $TMPDIR) it "refuses to create helper
# binaries", and then its workspace-write sandbox cannot write a file: its patch fails, yet it says
# it made the change. The default home there (a HOME under /tmp, as on CI runners) is moved to
# OUTSIDE_TMP, with the user's login and settings linked in.

OUTSIDE_TMP = Path("/var/tmp")  # kept across reboots, not the temporary folder codex refuses
LINKED = ("auth.json", "config.toml")  # the login and the settings of the user's own codex home


def temp_roots() -> list[Path]:
    roots = [Path("/tmp"), Path(tempfile.gettempdir())]
    if os.environ.get("TMPDIR"):
        roots.append(Path(os.environ["TMPDIR"]))
    return [r.resolve() for r in roots]


def under_temp(path: Path) -> bool:
    real = path.resolve()
    return any(real.is_relative_to(root) for root in temp_roots() if root != Path("/"))


def codex_home() -> Path:
    """Where codex keeps its home: CODEX_HOME as you set it, else ~/.codex, made if missing (codex
    stops when the folder it names does not exist). A default one under the temporary folder is
    replaced by a folder of the user's under /var/tmp with the login and settings linked in; a
    CODEX_HOME you named is yours (a failed edit there is still reported as codex's failure)."""
    if os.environ.get("CODEX_HOME"):
        home = Path(os.environ["CODEX_HOME"]).expanduser()
        home.mkdir(parents=True, exist_ok=True)
        return home
    home = Path.home() / ".codex"
    if under_temp(home):
        own = OUTSIDE_TMP / f"autoresearch-harness-{os.getuid()}" / "codex-home"
        if under_temp(own):
            raise AgentError(f"codex's home {home} lies under the temporary folder, where codex refuses its "
                             f"helper binaries, and so does {own}: set CODEX_HOME to a folder outside it.")
        own.mkdir(parents=True, exist_ok=True)
        for name in LINKED:
            link = own / name
            if (home / name).exists() and (link.is_symlink() or not link.exists()):
                link.unlink(missing_ok=True)  # a link to an earlier home's file: this one's now
                link.symlink_to((home / name).resolve())
        return own
    home.mkdir(parents=True, exist_ok=True)
    return home


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
        # Its home named: in the harness's sandbox HOME is the researcher's own folder, which may
        # lie under /tmp (a run there), where codex refuses to put its helper binaries.
        return {"CODEX_HOME": str(codex_home())}

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
        return parse_codex_events(stdout, stderr)
