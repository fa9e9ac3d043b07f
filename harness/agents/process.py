"""Running a CLI agent: its own process group, a hard timeout, cancellation, the output to a log.

Agent CLIs hang forever without a network, and they spawn children (shells, language
servers): on timeout or cancel the whole process group is stopped, not just the leader
(SIGTERM, then SIGKILL after STOP_GRACE_S, also for a child that ignores SIGTERM).
The researcher's process is started and stopped through the run's supervisor (supervise.py):
it is on disk before it runs, and a resumed run stops one a killed supervisor left behind.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import AgentError
from ..lifecycle import supervise

STDERR_TAIL_CHARS = 500  # chars of stderr quoted in an error message
STOP_GRACE_S = 3.0  # s between SIGTERM and SIGKILL of a stopped agent's process group
POLL_S = 0.05  # s between looks at the process, the deadline and the cancel event


@dataclass
class ProcessResult:
    stdout: str
    stderr: str
    returncode: int | None  # None when it was killed or could not start
    timed_out: bool
    agent_s: float  # s of wall time
    launch_error: str | None = None
    cancelled: bool = False  # stopped because the task's cancel event was set

    @property
    def killed(self) -> bool:
        """It did not end by itself: it never started, ran out of time or was cancelled."""
        return bool(self.launch_error or self.timed_out or self.cancelled)

    def failure(self, name: str, timeout_s: float) -> str | None:
        """Why the process failed (not counting what its output says), or None."""
        if self.launch_error:
            return f"could not start {name}: {self.launch_error}"
        if self.cancelled:
            return f"{name} was cancelled; its process group was stopped"
        if self.timed_out:
            return f"{name} did not finish within {timeout_s:g}s (--agent-timeout); its process group was killed"
        if self.returncode:
            tail = self.stderr.strip()[-STDERR_TAIL_CHARS:] or self.stdout.strip()[-STDERR_TAIL_CHARS:]
            return f"{name} exited with code {self.returncode}" + (f": {tail}" if tail else "")
        return None


def find_executable(name: str, install_hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        where = "does not exist" if os.sep in name else "is not on PATH"
        raise AgentError(f"the `{name}` command {where}. {install_hint}")
    return path


def start_process(argv: list[str], cwd: Path, env: dict[str, str] | None, stdout, stderr,
                  with_stdin: bool, name: str = "researcher") -> subprocess.Popen:
    """The researcher's process, leader of its own process group, under the run's supervisor."""
    return supervise.spawn(name, argv, cwd=cwd, env=env, stdout=stdout, stderr=stderr,
                           stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL)


def stop_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group (and whatever carries its mark), SIGKILL what is left after grace_s."""
    supervise.stop(proc, grace_s)


def _feed(proc: subprocess.Popen, text: str) -> None:
    """Write the prompt to stdin from a thread: a big prompt must not block the polling."""
    try:
        proc.stdin.write(text.encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass  # it exited (or was stopped) without reading all of it


def run_agent(argv: list[str], cwd: Path, timeout_s: float, log_path: Path,
              stdin_text: str | None = None, env: dict[str, str] | None = None,
              cancel: threading.Event | None = None) -> ProcessResult:
    """Run argv (never through a shell) until it exits, timeout_s passes or cancel is set.

    Everything it printed goes to log_path. Returns promptly after a cancel: the group is
    stopped within STOP_GRACE_S (plus the SIGKILL).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = start_process(argv, cwd, env, out, err, stdin_text is not None, f"researcher {log_path.name}")
        except OSError as e:
            result = ProcessResult("", "", None, False, time.monotonic() - start, launch_error=str(e))
            _write_log(log_path, argv, stdin_text, result)
            return result
        if stdin_text is not None:
            threading.Thread(target=_feed, args=(proc, stdin_text), daemon=True).start()
        timed_out = cancelled = False
        try:
            while proc.poll() is None:
                if cancel is not None and cancel.is_set():
                    cancelled = True
                elif time.monotonic() - start >= timeout_s:
                    timed_out = True
                if timed_out or cancelled:
                    stop_group(proc)
                    break
                supervise.wait_exit(proc, POLL_S)
        finally:  # a child it left behind, an error, a KeyboardInterrupt: nothing of it outlives the call
            stop_group(proc)
        agent_s = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        result = ProcessResult(out.read().decode("utf-8", errors="replace"),
                               err.read().decode("utf-8", errors="replace"),
                               None if (timed_out or cancelled) else proc.returncode, timed_out, agent_s,
                               cancelled=cancelled)
    _write_log(log_path, argv, stdin_text, result)
    return result


def _write_log(log_path: Path, argv: list[str], stdin_text: str | None, result: ProcessResult) -> None:
    shown = " ".join(argv)
    stdin_note = "" if stdin_text is None else f" < prompt ({len(stdin_text)} chars)"
    end = ("could not start: " + result.launch_error if result.launch_error else
           "cancelled" if result.cancelled else
           "killed at the timeout" if result.timed_out else f"exit code {result.returncode}")
    with open(log_path, "a", encoding="utf-8") as f:
        f.write(f"$ {shown}{stdin_note}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n"
                f"{result.stderr}\n--- {end} after {result.agent_s:.1f}s ---\n")


# ---------------------------------------------------------------------------
# Telling failures apart from an agent's error text (pure)

KIND_PATTERNS = (
    ("not_logged_in", r"/login|not logged in|log ?in (first|again|with)|please run .*login|"
                      r"invalid api key|no (api key|credentials)|missing api key|invalid auth method"),
    ("auth", r"\b401\b|unauthori[sz]ed|incorrect api key|authentication"),
    ("rate_limit", r"\b429\b|rate.?limit|too many requests|quota|usage limit"),
    ("not_found", r"\b404\b|model .*(not found|does not exist)|not_found"),
    ("timeout", r"timed? ?out|timeout"),
    ("server", r"\b5\d\d\b|internal server error|overloaded|service unavailable|high demand|"
               r"server_error|bad gateway"),
    # A 200 whose body is not the API's format: a web page, a proxy's error page, a cut-off stream.
    ("bad_response", r"malformed response|incomplete json|closed before response\.completed|"
                     r"invalid (json|response)|unexpected end of json"),
    ("connection", r"connection (refused|reset|error)|could not resolve|network|stream disconnected"),
)


def classify(text: str) -> str:
    """The ERROR_KINDS entry an agent's error text points to ('agent' when none does)."""
    for kind, pattern in KIND_PATTERNS:
        if re.search(pattern, text or "", re.I):
            return kind
    return "agent"
