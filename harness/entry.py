"""The `harness` command's entry: a Ctrl-C in its first second (while the CLI's modules import,
before the run's own handlers exist, driver/signals.py's interrupts) ends it with one line and 130, never a
traceback; then the CLI (cli/) takes over. Whatever ends it, no git deadline's timer holds its exit."""
from __future__ import annotations

import os
import signal
import threading

EARLY = "harness: interrupted while starting; nothing was changed\n"


def _early(signum, frame) -> None:
    os.write(2, EARLY.encode())
    os._exit(128 + signum)


def cancel_git_timers() -> int:
    """Cancel the deadline timers GitPython left behind; how many. Its `kill_after_timeout` (every
    call gitgate makes) is a non-daemon threading.Timer that the call cancels only when the git
    command returns: an interrupt raised inside the call leaves it waiting out the whole deadline
    (GIT_TIMEOUT_S), and Python's exit joins it first. Its git is gone with the interrupted call."""
    timers = [t for t in threading.enumerate() if isinstance(t, threading.Timer)
              and getattr(getattr(t, "function", None), "__qualname__", "").endswith("kill_process")]
    for t in timers:
        t.cancel()
    return len(timers)


def main() -> None:
    signal.signal(signal.SIGINT, _early)
    from .cli import main as cli
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        cli()
    finally:
        cancel_git_timers()
