"""A real local Ray cluster for the tests and the benchmark: `ray start --head` plus more nodes
(`ray start --address`), each its own process tree on this machine, that a test can add and kill.

Every node runs `ray start --block` in a session of its own with a token of its own in its
environment (supervise.TOKEN_VAR) and its own work folder (HARNESS_RAY_WORK_DIR), so a node can
be lost as a machine is: its raylet, its workers and the training jobs they started, all at once.
Usage statistics and the dashboard are off; the temp dir is private (under a short /tmp link,
Ray's socket paths must stay short). `stop()` ends every node and everything it started.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.lifecycle import supervise  # noqa: E402

START_TIMEOUT_S = 120  # a loaded 2-core machine: a node needs a few seconds, give it many
OBJECT_STORE_BYTES = 100 * 1024 ** 2  # per node: the jobs' archives are small (Ray's default takes 30% of RAM)
# Ray notices a lost node by missed health checks: 0.5 s apart, three missed (defaults: 3 s, five)
FAST_HEALTH = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3",
               "RAY_health_check_timeout_ms": "500", "RAY_health_check_initial_delay_ms": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Node:
    name: str
    proc: subprocess.Popen
    token: str
    work: Path  # its HARNESS_RAY_WORK_DIR: jobs unpack under work/jobs
    log: Path
    node_id: str = ""
    lost: bool = False


@dataclass
class LocalCluster:
    temp: Path
    nodes: list[Node] = field(default_factory=list)
    address: str = ""

    def __post_init__(self) -> None:
        self.link = Path("/tmp") / f"rt-{uuid.uuid4().hex[:8]}"
        self.link.symlink_to(self.temp)

    def env(self, token: str, work: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, **FAST_HEALTH, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT),
                supervise.TOKEN_VAR: token, "HARNESS_RAY_WORK_DIR": str(work), **(extra or {})}

    def start(self, name: str, cpus: int, gpus: int = 0, resources: dict[str, float] | None = None,
              wait: bool = True, env: dict[str, str] | None = None) -> Node:
        """The head (the first node), or one more node joining it; wait: until the cluster sees it.
        env: more of the node's environment (its jobs' environment is built from it)."""
        token, work, log = uuid.uuid4().hex, self.temp / name / "work", self.temp / f"{name}.log"
        argv = ["ray", "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", str(cpus),
                "--num-gpus", str(gpus), "--object-store-memory", str(OBJECT_STORE_BYTES), "--disable-usage-stats"]
        if resources:
            argv += ["--resources", json.dumps(resources)]
        if not self.nodes:
            self.address = f"127.0.0.1:{free_port()}"
            argv += ["--head", "--port", self.address.rsplit(":", 1)[1], "--include-dashboard=false",
                     "--temp-dir", str(self.link)]
        else:
            argv += ["--address", self.address]
        work.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(argv, env=self.env(token, work, env), stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        node = Node(name, proc, token, work, log)
        self.nodes.append(node)
        if wait:
            self.wait_alive(len(self.alive()))
            node.node_id = self.node_id_of(node)
        return node

    def alive(self) -> list[Node]:
        return [n for n in self.nodes if not n.lost]

    def probe(self, code: str, timeout_s: float = START_TIMEOUT_S) -> str:
        """Run code in a fresh driver process connected to the cluster; its stdout."""
        head = self.nodes[0]
        prelude = f"import json, ray, time\nray.init(address={self.address!r}, log_to_driver=False)\n"
        return subprocess.run([sys.executable, "-c", prelude + code], env=self.env(head.token, head.work),
                              check=True, timeout=timeout_s, capture_output=True, text=True).stdout

    def wait_alive(self, count: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until exactly count nodes are alive in the cluster's view."""
        self.probe(f"while sum(n['Alive'] for n in ray.nodes()) != {count}: time.sleep(0.2)\n", timeout_s)

    def node_id_of(self, node: Node, timeout_s: float = START_TIMEOUT_S) -> str:
        """The Ray node id of node: its raylet's --node_id."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for pid in supervise.members(pgid=node.proc.pid):
                for arg in _cmdline(pid).split(b"\0"):
                    if arg.startswith(b"--node_id="):
                        return arg.split(b"=", 1)[1].decode()
            time.sleep(0.2)
        raise AssertionError(f"node {node.name} has no raylet; see {node.log}")

    def kill(self, node: Node) -> None:
        """Lose node as a machine is lost: every process of it SIGKILLed at once, no clean-up."""
        node.lost = True
        for _ in range(3):  # workers may start while the first ones are killed
            for pid in self.processes(node):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        node.proc.wait(timeout=30)

    def processes(self, node: Node) -> list[int]:
        """node's processes: its group, its token (workers), its jobs (their folders are under its work)."""
        found = set(supervise.members(pgid=node.proc.pid)) | set(supervise.members(token=node.token))
        return sorted(found | set(processes_under(node.work)))

    def stop(self) -> None:
        """End every node and everything it started, at once. SIGKILL, as kill() loses a node: a
        `ray start --block` ignores SIGTERM (measured: still running 20 s after it), so a polite
        stop only cost each test module a 10 s wait before the SIGKILL it came to anyway."""
        for node in reversed(self.nodes):
            if not node.lost:
                self.kill(node)
        for node in self.nodes:
            supervise._kill_all(lambda: self.processes(node), grace_s=0.5)
        self.link.unlink(missing_ok=True)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def kill_driver_and_workers(supervisor: subprocess.Popen, workers: list[int]) -> None:
    """The supervisor (the Ray driver) and its tasks' workers SIGKILLed together, as when the
    supervisor's machine and the workers die at once, so that their jobs are orphans. The workers
    are stopped first: otherwise Ray may stop a worker itself when its driver dies, and such a
    worker stops its job (the other case the harness covers) before the test's SIGKILL lands."""
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    os.killpg(supervisor.pid, signal.SIGKILL)
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    supervisor.wait(timeout=30)


def processes_under(folder: Path, running: str = "") -> list[int]:
    """Processes whose working directory is inside folder (a training job left behind); with
    running, only those whose command line has it (the job itself, not the git of its unpacking)."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit() and str(folder) in os.readlink(entry / "cwd")
                    and running.encode() in _cmdline(int(entry.name))):
                out.append(int(entry.name))
        except OSError:
            continue
    return out


def wait_for(what, timeout_s: float = 120.0, poll_s: float = 0.1):
    """what()'s first true value, asked every poll_s; an AssertionError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def trained_rows(rows: list[dict]) -> list[dict]:
    """The ledger rows whose candidate trained: with two slots, a candidate proposed on the old best
    may conflict with the new one on rebase and is recorded without training (no node, no log)."""
    return [r for r in rows if r.get("reason") != "rebase_conflict"]
