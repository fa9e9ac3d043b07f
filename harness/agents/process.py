"""Running a CLI agent: its own process group, a hard timeout, the whole output to a log file.

Agent CLIs hang forever without a network, and they spawn children (shells, language
servers): on timeout the whole process group is killed, not just the leader.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import AgentError
from .. import supervise

STDERR_TAIL_CHARS = 500  # chars of stderr quoted in an error message


@dataclass
class ProcessResult:
    stdout: str
    stderr: str
    returncode: int | None  # None when it was killed or could not start
    timed_out: bool
    agent_s: float  # s of wall time
    launch_error: str | None = None

    def failure(self, name: str, timeout_s: float) -> str | None:
        """Why the process failed (not counting what its output says), or None."""
        if self.launch_error:
            return f"could not start {name}: {self.launch_error}"
        if self.timed_out:
            return f"{name} did not finish within {timeout_s:g}s (--agent-timeout); its process group was killed"
        if self.returncode:
            tail = self.stderr.strip()[-STDERR_TAIL_CHARS:] or self.stdout.strip()[-STDERR_TAIL_CHARS:]
            return f"{name} exited with code {self.returncode}" + (f": {tail}" if tail else "")
        return None


def find_executable(name: str, install_hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise AgentError(f"the `{name}` command is not on PATH. {install_hint}")
    return path


def run_agent(argv: list[str], cwd: Path, timeout_s: float, log_path: Path,
              stdin_text: str | None = None, env: dict[str, str] | None = None) -> ProcessResult:
    """Run argv (never through a shell) under a hard timeout; write everything to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = supervise.spawn(f"researcher {log_path.name}", argv, cwd=cwd, env=env, stdout=out,
                                   stderr=err, stdin=subprocess.DEVNULL if stdin_text is None else subprocess.PIPE)
        except OSError as e:
            result = ProcessResult("", "", None, False, time.monotonic() - start, launch_error=str(e))
            _write_log(log_path, argv, stdin_text, result)
            return result
        timed_out = False
        try:
            proc.communicate(input=stdin_text.encode() if stdin_text is not None else None,
                             timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # a timeout, Ctrl-C or any error: nothing of the researcher outlives the call
            supervise.stop(proc)
        agent_s = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        result = ProcessResult(out.read().decode("utf-8", errors="replace"),
                               err.read().decode("utf-8", errors="replace"),
                               None if timed_out else proc.returncode, timed_out, agent_s)
    _write_log(log_path, argv, stdin_text, result)
    return result


def _write_log(log_path: Path, argv: list[str], stdin_text: str | None, result: ProcessResult) -> None:
    shown = " ".join(argv)
    stdin_note = "" if stdin_text is None else f" < prompt ({len(stdin_text)} chars)"
    end = ("could not start: " + result.launch_error if result.launch_error else
           "killed at the timeout" if result.timed_out else f"exit code {result.returncode}")
    with open(log_path, "a", encoding="utf-8") as f:
        f.write(f"$ {shown}{stdin_note}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n"
                f"{result.stderr}\n--- {end} after {result.agent_s:.1f}s ---\n")


# ---------------------------------------------------------------------------
# Telling failures apart from an agent's error text (pure)

KIND_PATTERNS = (
    ("not_logged_in", r"/login|not logged in|log ?in (first|again|with)|please run .*login|"
                      r"invalid api key|no (api key|credentials)|missing api key"),
    ("auth", r"\b401\b|unauthori[sz]ed|incorrect api key|authentication"),
    ("rate_limit", r"\b429\b|rate.?limit|too many requests|quota|usage limit"),
    ("not_found", r"\b404\b|model .*(not found|does not exist)|not_found"),
    ("timeout", r"timed? ?out|timeout"),
    ("server", r"\b5\d\d\b|internal server error|overloaded|service unavailable"),
    ("connection", r"connection (refused|reset|error)|could not resolve|network|stream disconnected"),
)


def classify(text: str) -> str:
    """The ERROR_KINDS entry an agent's error text points to ('agent' when none does)."""
    for kind, pattern in KIND_PATTERNS:
        if re.search(pattern, text or "", re.I):
            return kind
    return "agent"
