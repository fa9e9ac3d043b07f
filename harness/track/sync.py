"""The live hook's worker: syncs a run's ledger to its tracker in a background thread.

The loop only nudges (after each ledger row is safely on disk) and never waits, so a tracker
that is down or slow cannot stop or slow a night. A failed sync becomes one event
(`tracking_failed`) and a retry every RETRY_S seconds or at the next nudge; a sync that
works again after a failure is a `tracking_recovered` event. At the end of the run close()
waits at most `track_timeout` seconds; what is still unsynced then is a `tracking_incomplete`
event, and `harness track RUN_DIR` (the same sync_run) logs it later.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from ..ledger import events
from .base import SyncResult, Tracker, run_info, sync_run

RETRY_S = 60.0  # s between retries while the tracker fails


class Syncer:
    def __init__(self, run_dir: Path, connect: Callable[[], Tracker], uri: str, timeout_s: float = 30.0):
        self.run_dir, self.connect, self.uri = Path(run_dir), connect, uri
        self.timeout_s = timeout_s  # how long close() waits
        self.tracker: Tracker | None = None
        self.failing: str | None = None  # the last error while the tracker fails
        self.last: SyncResult | None = None
        self.closing = False
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._work, name=f"track-{self.run_dir.name}", daemon=True)
        self.started = False
        self.lock = threading.Lock()

    def nudge(self) -> None:
        """New rows are on the ledger: sync soon. Returns at once."""
        with self.lock:
            if not self.started:
                self.started = True
                self.thread.start()
        self.wake.set()

    def _work(self) -> None:
        while True:
            self.wake.wait(RETRY_S if self.failing else None)
            self.wake.clear()
            closing = self.closing
            self._attempt()
            if closing:
                return

    def _attempt(self) -> None:
        try:
            if self.tracker is None:
                self.tracker = self.connect()
            self.last = sync_run(run_info(self.run_dir), self.tracker)
        # Whatever an external tracker raises (its client's errors, HTTP, the database) must cost
        # a retry, never the night: the ledger is the record, the tracker a copy.
        except Exception as e:  # noqa: BLE001
            self.tracker = None  # connect again next time
            if self.failing is None:
                events.record(self.run_dir, "tracking_failed",
                              f"the tracker at {self.uri} failed ({type(e).__name__}: {str(e)[:300]}); the run goes "
                              f"on, the sync retries every {RETRY_S:g}s, and `harness track {self.run_dir}` "
                              f"back-fills what is missing")
            self.failing = f"{type(e).__name__}: {str(e)[:300]}"
            return
        if self.failing is not None:
            events.record(self.run_dir, "tracking_recovered",
                          f"the tracker at {self.uri} works again; {self.last.rows} rows in experiment "
                          f"{self.last.experiment!r}")
        self.failing = None

    def close(self, timeout_s: float | None = None) -> bool:
        """One last sync, waited for at most timeout_s; True when every row is in the tracker."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        self.closing = True
        self.nudge()
        self.thread.join(timeout_s)
        if self.thread.is_alive() or self.failing is not None:
            why = (f"did not finish within {timeout_s:g}s" if self.thread.is_alive()
                   else f"failed ({self.failing})")
            events.record(self.run_dir, "tracking_incomplete",
                          f"the last sync to {self.uri} {why}; the ledger is complete: run "
                          f"`harness track {self.run_dir}` to log the missing rows")
            return False
        return True
