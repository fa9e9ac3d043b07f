"""Progress printed from a thread of its own (`Printer`: bounded queue, bounded flush), so that a
paused terminal holds up no decision; `safe`: a progress callback whose failures never reach the loop."""
from __future__ import annotations

import collections
import contextlib
import sys
import threading
import time
from typing import Any

from ..lifecycle.runs import Progress
from .signals import POLL_S

FLUSH_S = 5.0  # s the end of a run waits for its progress to be printed
IDLE_S = 1.0  # s a Printer's thread waits for the next event before it ends


class Printer:
    """Progress handed to one printing thread: a paused terminal (Ctrl-S) or a pipe nobody reads
    blocks that thread only, never the loop that decides. Events wait in a bounded queue (the
    oldest dropped past it, and counted); flush() waits a bounded time at the end of a run."""

    LIMIT = 10_000

    def __init__(self, progress: Progress):
        self.progress, self.dropped = progress, 0
        self.queue: collections.deque = collections.deque()
        self.cond = threading.Condition()
        self.busy = False
        self.thread: threading.Thread | None = None  # started with the first event, gone when idle

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        with self.cond:
            if len(self.queue) >= self.LIMIT:
                self.queue.popleft()
                self.dropped += 1
            self.queue.append((event, data))
            if self.thread is None:
                self.thread = threading.Thread(target=self._work, name="progress", daemon=True)
                self.thread.start()
            self.cond.notify_all()

    def _work(self) -> None:
        while True:
            with self.cond:
                self.busy = False
                self.cond.notify_all()
                if not self.queue:
                    self.cond.wait(IDLE_S)
                if not self.queue:
                    self.thread = None
                    return
                event, data = self.queue.popleft()
                self.busy = True
            try:
                self.progress(event, data)
            except (OSError, ValueError):  # a closed terminal (SIGHUP) makes printing fail
                pass
            except Exception as e:  # noqa: BLE001 - a display's bug must not stop the run
                with contextlib.suppress(Exception):
                    sys.stderr.write(f"harness: progress display failed: {type(e).__name__}: {e}\n")

    def flush(self, timeout_s: float = FLUSH_S) -> bool:
        """Wait until everything queued is printed (True), or timeout_s (a terminal that stays paused)."""
        until = time.monotonic() + timeout_s
        with self.cond:
            while self.queue or self.busy:
                left = until - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, POLL_S))
        return True


def safe(progress: Progress) -> Progress:
    """Progress that can never stop the run: a closed terminal (SIGHUP) makes printing fail. A
    Printer is safe already (and prints from its own thread)."""
    if isinstance(progress, Printer):
        return progress

    def emit(event: str, data: dict[str, Any]) -> None:
        try:
            progress(event, data)
        except (OSError, ValueError):
            pass
    return emit
