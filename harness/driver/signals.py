"""The one interrupt path: SIGINT, SIGTERM and SIGHUP raise `Interrupted` in the main thread during
the set-up, and are only noted while the loop runs (it raises between its steps) or once the run
ends (`quiet`). `Cancelled`: a proposal that came back after the stop."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

POLL_S = 0.2  # s the loop waits at most between its steps (lets a noted signal through)
SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}


class Interrupted(KeyboardInterrupt):
    """A stop asked for by a signal (SIGINT, SIGTERM, SIGHUP)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(SIGNALS.get(signum, str(signum)))
        self.signum = signum

    @property
    def why(self) -> str:
        return SIGNALS.get(self.signum, f"signal {self.signum}")


class Cancelled(BaseException):
    """A proposal that returned after the stop: never committed; its spend goes on a `stopped` row."""

    def __init__(self, proposal: Any = None):
        super().__init__("the run is stopping")
        self.proposal = proposal


@contextlib.contextmanager
def interrupts() -> Iterator[dict[str, Any]]:
    """The one interrupt path: the first SIGINT/SIGTERM/SIGHUP raises Interrupted in the main
    thread; later ones are only noted (the clean-up must run once, whole)."""
    # quiet: the run is ending, only note it; defer: the loop runs, it raises Interrupted between steps
    seen: dict[str, Any] = {"signum": None, "quiet": False, "defer": False}
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def handler(signum, frame):
        if seen["signum"] is None:
            seen["signum"] = signum
            if not seen["quiet"] and not seen["defer"]:
                raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield seen
    finally:
        for s in signal.sigpending() & set(SIGNALS):  # held back during the clean-up: noted now
            signal.sigtimedwait([s], 0)
            seen["signum"] = seen["signum"] or s
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        for s, h in old.items():
            signal.signal(s, h)


def quiet(seen: dict[str, Any]) -> None:
    """The run is ending: later signals are only noted, and the main thread's children (git's
    clean-up of worktrees) do not get them. A closed tmux pane or a second Ctrl-C signals the
    terminal's whole process group, and a git killed half-way would leave its worktree behind;
    blocked here, the signals stay blocked in what the main thread starts (the mask is inherited),
    while the other threads still take them for the handler to note."""
    seen["quiet"] = True
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
