"""Two parts of the Ray executor (ray_executor.py), each a mixin whose methods use its state:
`ClusterWatch`, the cluster's head watched with plain TCP connects (a Ray call blocks while the
head is gone), and `TaskRecords`, the record on disk of every task that runs, so that a later
supervisor on the same folder stops what a killed one left on the nodes.
"""
from __future__ import annotations

import json
import socket
import time
from typing import Any

from ..errors import ClusterGone
from ..ledger import atomic, events
from .base import settle

WATCH_S = 1.0  # s between checks that the cluster's head answers
PROBE_TIMEOUT_S = 2.0  # s a TCP connect to the head may take
REAP_TIMEOUT_S = 60.0  # s for the clean-up task on a node


class ClusterWatch:
    """The cluster going away: its head unanswered for the grace (RayExecutor's gcs, grace_s, gone)."""

    def _gcs_address(self) -> tuple[str, int] | None:
        try:
            host, _, port = self.ray.get_runtime_context().gcs_address.rpartition(":")
            return host, int(port)
        except Exception:  # noqa: BLE001 - not known: the head is not watched
            return None

    def answers(self) -> bool:
        """Does the cluster's head (its GCS) accept a connection now? A plain TCP connect, never a Ray call."""
        if self.gcs is None:
            return True
        try:
            socket.create_connection(self.gcs, timeout=PROBE_TIMEOUT_S).close()
            return True
        except OSError:
            return False

    def _watch(self) -> None:
        """The head watched: unanswered for the grace, the cluster has gone (every job's future told)."""
        since: float | None = None
        while not self.closed:
            if self.answers():
                since = None
            else:
                since = since or time.monotonic()
                if time.monotonic() - since >= self.grace_s:
                    self._lost()
                    return
            time.sleep(WATCH_S)

    def _lost(self) -> None:
        host = f"{self.gcs[0]}:{self.gcs[1]}" if self.gcs else self.address
        self.gone = (f"the Ray cluster went away: its head at {host} has not answered for {self.grace_s:g} s. "
                     f"The run stopped; the candidate(s) in flight are kept. Start the cluster again (or another) "
                     f"and continue with `harness run --resume` (--ray-address if its address changed)")
        events.record(self.folder, "cluster_gone", self.gone)
        with self.cond:
            futures = list(self.futures)
            self.cond.notify_all()
        for f in futures:
            settle(f, exc=ClusterGone(self.gone))

    def _check_gone(self) -> None:
        if self.gone is not None:
            raise ClusterGone(self.gone)

    def _hold_while_unreachable(self) -> None:
        """An attempt failed while the head does not answer: wait (the grace at most) for the watch
        thread's verdict, so that a cluster going away is not recorded as the candidate's crash."""
        deadline = time.monotonic() + self.grace_s + 2 * WATCH_S + PROBE_TIMEOUT_S
        while self.gone is None and not self.answers() and time.monotonic() < deadline:
            time.sleep(WATCH_S / 2)
        self._check_gone()


class TaskRecords:
    """The tasks that run, on disk under the executor's tasks_dir (RayExecutor's ray, reaper, folder)."""

    def _write_record(self, record: dict[str, Any]) -> None:
        self.tasks_dir.mkdir(parents=True, exist_ok=True)
        path = self.tasks_dir / f"{record['token']}.json"
        atomic.atomic_write(path, json.dumps(record))

    def _reap(self, record: dict[str, Any]) -> None:
        """What a killed task left on its node (the job's process group): stopped there, if the node lives."""
        node_id = record.get("node_id")
        nodes = [n["NodeID"] for n in self.ray.nodes() if n.get("Alive")]
        targets = [node_id] if node_id in nodes else ([] if node_id else nodes)
        self._reap_on(targets, [record["token"]])

    def _reap_on(self, node_ids: list[str], tokens: list[str]) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        refs = [self.reaper.options(num_cpus=0, max_retries=0,
                                    scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(tokens)
                for n in node_ids]
        try:
            self.ray.get(refs, timeout=REAP_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a node that died meanwhile took its processes with it
            pass

    def cancel_leftovers(self) -> list[dict[str, Any]]:
        """Tasks an earlier supervisor of this folder left on disk: their jobs stopped on every node."""
        records = []
        for path in sorted(self.tasks_dir.glob("*.json")) if self.tasks_dir.exists() else []:
            try:
                records.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                pass
        if records:
            nodes = [n["NodeID"] for n in self.ray.nodes() if n.get("Alive")]
            self._reap_on(nodes, [r["token"] for r in records])
            events.record(self.folder, "ray_tasks_cancelled",
                          f"{len(records)} Ray task(s) of an earlier supervisor stopped: "
                          + ", ".join(r.get("job", "?") for r in records))
        for path in self.tasks_dir.glob("*") if self.tasks_dir.exists() else []:
            path.unlink(missing_ok=True)
        return records
