"""The shared base of the CLI researchers (codex, claude, gemini, `cmd:`).

A backend says how to build its command line, which environment points it at a server,
and how to read its output; the base does the rest, the same way for all: the executable
(`--agent-executable`), the user's pass-through arguments (`--agent-arg`), the timeout,
cancellation, the log, and merging the process's failure with what the output says.
"""
from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from . import pricing
from .base import Proposal, Task, Usage, key_fingerprint, printable
from . import sandboxed
from .process import ProcessResult, classify, find_executable, run_agent


@dataclass
class CLIOutput:
    """What a CLI's output says (pure parsers build it from the text)."""
    usage: Usage | None  # None: it reported no usage (a killed call is billed all the same)
    description: str
    error: str | None
    found: bool  # its structured output (events, a result object) was there at all
    retries: int = 0  # retries the CLI made itself (429s, 5xx, lost streams)
    problems: tuple[str, ...] = ()  # what was wrong in its report (base.reported_usage)
    edit_failures: tuple[str, ...] = ()  # edits its own tools reported as failed (a patch, a write)


DIGEST_MAX_BYTES = 16 * 2**20  # an editable file larger than this is compared by its size and mtime


def editable_digest(task: Task) -> str:
    """A hash of the editable files as they are, to tell whether a call changed any. Never follows a
    link the researcher may have planted (to /dev/zero, a secret) and never reads without bound."""
    digest = hashlib.sha256()
    for name in task.editable:
        path = Path(task.worktree) / name
        digest.update(name.encode() + b"\0")
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                digest.update(f"{st.st_mode}:{os.readlink(path) if stat.S_ISLNK(st.st_mode) else ''}".encode())
            elif st.st_size > DIGEST_MAX_BYTES:
                digest.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
            else:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as f:
                    digest.update(f.read(DIGEST_MAX_BYTES + 1))
        except OSError:
            digest.update(b"-")
        digest.update(b"\0")
    return digest.hexdigest()


VERSION_TIMEOUT_S = 60.0  # s for `CLI --version` (gemini's node start takes seconds on a busy machine)
_versions: dict[tuple[str, int, int], str | None] = {}


def cli_version(executable: str, env: dict[str, str] | None = None) -> str | None:
    """The first line `executable --version` prints (`codex-cli 0.171.0`, `2.1.197 (Claude Code)`,
    `0.61.0`), once per installed file; None when it prints nothing or fails."""
    try:
        st = os.stat(executable)
    except OSError:
        return None
    key = (os.path.realpath(executable), st.st_mtime_ns, st.st_size)
    if key not in _versions:
        try:
            done = subprocess.run([executable, "--version"], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                  timeout=VERSION_TIMEOUT_S, env=env, start_new_session=True)
            lines = [line.strip() for line in (done.stdout or "").splitlines() if line.strip()]
            _versions[key] = lines[0][:100] if done.returncode == 0 and lines else None
        except (OSError, subprocess.SubprocessError):
            _versions[key] = None
    return _versions[key]


def url_host(url: str | None) -> str | None:
    """host[:port] of a base URL, for the manifest (never a path, a query or credentials)."""
    if not url:
        return None
    parts = urlsplit(url if "//" in url else "//" + url)
    host = parts.hostname or ""
    return f"{host}:{parts.port}" if parts.port else host or None


def cost_source(model: str | None, reports_cost: bool = True) -> str:
    """Where this researcher's costs come from (pricing.call_cost): for the manifest and the report.
    A researcher that reports no cost of its own (codex, gemini, openai) and a model without a price: unknown."""
    if pricing.price(model) is not None:
        return "table"
    return "researcher" if reports_cost else "unknown"


def merge_error(result: ProcessResult, out: CLIOutput, name: str, timeout_s: float) -> tuple[str | None, str | None]:
    """(error, error_kind) of one call from the process's end and the CLI's own words.

    A process that was killed or never started says why; otherwise the CLI's error wins
    when its structured output was there (it knows better than the exit code), else the
    exit code and stderr. A call killed at the timeout while the CLI was reporting errors
    (a 429 storm, a 5xx) gets the kind of those errors, and their text.
    """
    failure = result.failure(name, timeout_s)
    if result.killed:
        error = failure
        if out.error and out.found and not result.launch_error:  # the CLI's own words, not "printed nothing"
            error = f"{failure}; its last error: {out.error}"
    elif out.error and (out.found or not failure):
        error = out.error
    else:
        error = failure
    if not error:
        return None, None
    if result.cancelled:
        return error, "cancelled"
    if result.timed_out:
        reported = classify(out.error) if out.error and out.found else "agent"
        return error, reported if reported not in ("agent", "timeout") else "timeout"
    return error, classify(error)


class CLIResearcher:
    """A researcher that runs a command in the worktree; subclasses fill in the hooks below."""

    name = ""
    default_executable = ""
    install_hint = ""
    key_vars: tuple[str, ...] = ()  # the variables that may hold its key, in the order looked up
    provider = ""  # where it goes without --base-url
    silent_is_free = False  # a call that exits normally without reporting usage cost nothing
    reports_cost = False  # it prints a cost of its own (claude's total_cost_usd, a cmd: JSON line)
    config_names: tuple[str, ...] = ()  # its settings in the user's home, bound into its sandbox
    config_vars: tuple[str, ...] = ()  # variables that point it at its settings elsewhere

    def __init__(self, model: str | None = None, executable: str | None = None,
                 agent_args: tuple[str, ...] | list[str] | None = None, base_url: str | None = None):
        self.model = model
        self.executable = find_executable(executable or self.default_executable, self.install_hint)
        self.agent_args = tuple(agent_args or ())
        self.base_url = base_url.rstrip("/") if base_url else None

    # --- the hooks -----------------------------------------------------------------------

    def command(self, task: Task) -> list[str]:
        """The command line before the user's --agent-arg arguments."""
        raise NotImplementedError

    def command_tail(self, task: Task) -> list[str]:
        """Arguments that must come after the user's (a `-` for the prompt on stdin)."""
        return []

    def environment(self) -> dict[str, str]:
        """Variables to set for the CLI (its base URL); the rest of the environment passes through."""
        return {}

    def call_environment(self, task: Task) -> dict[str, str]:
        """environment() for one call (a backend that writes a settings file for it overrides this)."""
        return self.environment()

    def parse(self, stdout: str, stderr: str = "") -> CLIOutput:
        raise NotImplementedError

    def stdin(self, task: Task) -> str | None:
        return task.prompt

    def settings(self) -> dict[str, Any]:
        """Backend-specific entries of the manifest."""
        return {}

    def readonly(self, task: Task) -> list:
        """Files besides its installation that it must see in its sandbox (read-only)."""
        return []

    # --- the same for every CLI ----------------------------------------------------------

    def argv(self, task: Task) -> list[str]:
        return self.command(task) + list(self.agent_args) + self.command_tail(task)

    def key_var(self) -> str | None:
        """The name of the variable its key comes from (the first one set), never its value."""
        return next((var for var in self.key_vars if os.environ.get(var)), None)

    def provider_name(self) -> str:
        return self.provider

    def describe(self) -> dict[str, Any]:
        var = self.key_var()
        return {"backend": self.name, "model": self.model, "executable": self.executable,
                "provider": self.provider_name(), "base_url": self.base_url,
                "base_url_host": url_host(self.base_url), "key_var": var,
                "key_fingerprint": key_fingerprint(os.environ.get(var)) if var else None,
                "agent_args": list(self.agent_args), "cost_source": cost_source(self.model, self.reports_cost),
                "cli_version": cli_version(self.executable), **self.settings()}

    def propose(self, task: Task) -> Proposal:
        extra = self.call_environment(task)
        env = {**os.environ, **extra} if extra else None
        argv = self.argv(task)
        before = editable_digest(task)
        jailed = sandboxed.confine(task.jail, argv, task.worktree, env, self.readonly(task),
                                   self.config_names, self.config_vars)
        try:
            result = run_agent(jailed.argv, task.worktree, task.timeout_s, task.log_path,
                               stdin_text=self.stdin(task), env=jailed.env, cancel=task.cancel)
        finally:
            jailed.close()
        out = self.parse(result.stdout, result.stderr)
        error, kind = merge_error(result, out, self.name, task.timeout_s)
        if error is None and out.edit_failures and editable_digest(task) == before:  # read again only then
            # It says what it did, but its own tool failed and nothing changed: its failure, not a
            # choice to change nothing (codex whose sandbox could not write, an edit that did not apply).
            error = (f"{self.name} changed nothing: {'; '.join(out.edit_failures)[:300]}; its last message: "
                     f"{printable(out.description) or '(none)'}")
            kind = "agent"
        usage = out.usage
        if usage is None:
            usage = Usage() if self.silent_is_free and not result.killed else Usage.unknown()
        # Tokens spent before a failure are still on the bill: the usage is kept either way.
        return Proposal(printable(out.description), usage, result.agent_s, out.retries, error=error,
                        error_kind=kind, problems=out.problems)
