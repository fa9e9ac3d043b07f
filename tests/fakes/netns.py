"""A loopback-only network namespace for the real researcher CLIs, and a scripted server in it.

The real CLIs look up external hosts at start (telemetry, update checks, model lists) even
with a custom base URL. Inside this namespace only `lo` exists: every lookup and every
connection that is not to 127.0.0.1 fails at once, so nothing leaves the machine, and each
one is recorded (egress.py, the namespace's first process: every address routed to `lo`,
SYNs and datagrams seen there, every DNS name asked answered NXDOMAIN).

    ns = Netns.start(log)          # `unshare -n` holding a namespace open (root, or user namespaces)
    server = ns.server("responses", folder)   # tests/fakes/llm_server.py inside it
    subprocess.run(ns.argv(["python", "-m", "harness", "run", ...]))  # the harness inside it
    mark = ns.mark(); ...; ns.attempts(mark)  # what tried to leave since the mark

Processes join with `nsenter --net=/proc/PID/ns/net`. A namespace that cannot be made is
a skip with the reason, never a silent run on the real network.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SERVER = Path(__file__).parent / "llm_server.py"
RECORDER = Path(__file__).parent / "egress.py"
START_S = 20.0  # s to wait for the namespace or the server to come up


def unavailable() -> str | None:
    """Why no loopback-only namespace can be made here, or None."""
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (util-linux / iproute2)"
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up && ip route add local 0.0.0.0/0 dev lo"],
                           capture_output=True,
                           text=True, timeout=20)
    if probe.returncode:
        return f"cannot make a network namespace: {probe.stderr.strip() or probe.returncode}"
    return None


@dataclass
class Server:
    proc: subprocess.Popen
    folder: Path
    port: int

    def url(self, suffix: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{suffix}"

    def script(self, *behaviours) -> None:
        """The behaviours of the next fresh requests (see llm_server.py), replacing any left."""
        # A nonce makes every script new to the server, even one equal to the last.
        (self.folder / "script.json").write_text(json.dumps(list(behaviours) + [{"do": "edit", "nonce": time.time()}]))
        (self.folder / "requests.jsonl").unlink(missing_ok=True)

    def requests(self) -> list[dict]:
        path = self.folder / "requests.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def reported(self) -> dict[str, int]:
        """The usage the server reported, summed over every answered request."""
        total = {"input_tokens": 0, "cached_tokens": 0, "output_tokens": 0}
        for request in self.requests():
            for key, value in (request.get("usage") or {}).items():
                total[key] = total.get(key, 0) + value
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def describe(entry: dict) -> str:
    """One recorded attempt, for a failure message: `dns AAAA api.openai.com`, `tcp 1.2.3.4:443`."""
    if entry["kind"] == "dns":
        return f"dns {entry['type']} {entry['name']}"
    return f"{entry['kind']} {entry['address']}:{entry['port']}"


class Netns:
    def __init__(self, holder: subprocess.Popen, log: Path):
        self.holder = holder
        self.log = log
        self.servers: list[Server] = []

    @classmethod
    def start(cls, log: Path) -> "Netns":
        """The namespace, held by the egress recorder, which writes its attempts to log."""
        # The holder lives as long as the test process: it exits when it is orphaned.
        log.parent.mkdir(parents=True, exist_ok=True)
        log.touch()
        holder = subprocess.Popen(["unshare", "-n", sys.executable, str(RECORDER), "--parent", str(os.getpid()),
                                   "--log", str(log)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
        line = holder.stdout.readline().strip()
        if line != "up":
            holder.kill()
            raise RuntimeError(f"the network namespace did not come up: {holder.stderr.read()[-2000:]}")
        return cls(holder, log)

    def mark(self) -> int:
        """A place in the record: attempts(mark) are those made after it."""
        return len(self.log.read_text().splitlines())

    def attempts(self, since: int = 0) -> list[dict]:
        """Every attempt to leave the namespace recorded after `since`, in order."""
        if self.holder.poll() is not None:
            raise RuntimeError("the egress recorder is gone: nothing after its end was recorded")
        return [json.loads(line) for line in self.log.read_text().splitlines()[since:]]

    @property
    def path(self) -> str:
        return f"/proc/{self.holder.pid}/ns/net"

    def argv(self, argv: list[str]) -> list[str]:
        """argv, run inside the namespace."""
        return ["nsenter", f"--net={self.path}", "--", *[str(a) for a in argv]]

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(argv), **kwargs)

    def server(self, wire: str, folder: Path) -> Server:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "port").unlink(missing_ok=True)  # a port file left by an earlier server is no sign of life
        proc = subprocess.Popen(self.argv([sys.executable, str(SERVER), "--wire", wire, "--dir", str(folder)]),
                                stderr=open(folder / "server.err", "w"), start_new_session=True)
        deadline = time.monotonic() + START_S
        while not (folder / "port").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the scripted server did not start: {(folder / 'server.err').read_text()}")
            time.sleep(0.05)
        server = Server(proc, folder, int((folder / "port").read_text()))
        self.servers.append(server)
        return server

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        try:
            os.killpg(self.holder.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.holder.wait(timeout=10)
