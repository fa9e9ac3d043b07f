"""Cancelling a researcher call: the CLI's whole process group is gone, the API call stops."""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from harness.agents import Task, make_researcher
from harness.agents.process import STOP_GRACE_S
from harness.lifecycle.supervise import members
from fakes.helpers import TEST_KEY, install_stand_ins
from fakes.openai_server import Fail, Hang, ScriptedServer

# A CLI that ignores SIGTERM, and so does the child it starts; both print their pids.
STUBBORN = """\
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
code = "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nwhile True: time.sleep(1)"
child = subprocess.Popen([sys.executable, "-c", code])
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
while True:
    time.sleep(1)
"""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False


def cancel_after(event: threading.Event, ready, delay_s: float) -> None:
    def go():
        deadline = time.monotonic() + 30
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(delay_s)
        event.set()
    threading.Thread(target=go, daemon=True).start()


def test_cancel_stops_a_cli_that_ignores_sigterm_within_the_grace(tmp_path: Path):
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    pids = tmp_path / "pids"
    researcher = make_researcher(f"cmd:{sys.executable} {script} {pids}", None)
    cancel = threading.Event()
    task = Task(tmp_path, "improve it", ("train.py",), 120, tmp_path / "logs" / "agent.log", 1, 0, cancel=cancel)
    cancel_after(cancel, pids.exists, 0.2)
    started = time.monotonic()
    proposal = researcher.propose(task)
    took_s = time.monotonic() - started
    leader, child = (int(p) for p in pids.read_text().split())
    assert proposal.error_kind == "cancelled" and "cancelled" in proposal.error
    assert proposal.usage.known is False  # a killed call reported nothing: unknown, not free
    assert took_s < STOP_GRACE_S + 10  # promptly: the grace period and the SIGKILL, not the 120 s timeout
    assert not alive(leader) and not alive(child)
    assert members(pgid=leader) == []  # nothing of its process group is left (scanned in /proc)
    assert not (tmp_path / "logs" / "agent.log.pid").exists()
    assert "--- cancelled after" in (tmp_path / "logs" / "agent.log").read_text()


def test_cancel_of_a_stand_in_codex_keeps_nothing_running(tmp_path: Path, monkeypatch):
    bin_dir = install_stand_ins(tmp_path / "bin")
    monkeypatch.setenv("FAKE_AGENT_SCRIPT", str(tmp_path / "script.txt"))
    monkeypatch.setenv("FAKE_AGENT_PID_FILE", str(tmp_path / "grandchild.pid"))
    (tmp_path / "script.txt").write_text("hang\n")
    researcher = make_researcher("codex", "m", {"executable": str(bin_dir / "codex")})
    cancel = threading.Event()
    (tmp_path / "wt").mkdir()
    task = Task(tmp_path / "wt", "improve it", ("train.py",), 120, tmp_path / "agent.log", 1, 0, cancel=cancel)
    cancel_after(cancel, (tmp_path / "grandchild.pid").exists, 0.2)
    proposal = researcher.propose(task)
    assert proposal.error_kind == "cancelled"
    assert not alive(int((tmp_path / "grandchild.pid").read_text()))


def test_cancel_stops_the_openai_backend_in_a_request_and_between_retries(tmp_path: Path):
    (tmp_path / "train.py").write_text("VALUE = 1.0\n")
    for behaviour, options in ((Hang(60), {}), (Fail(500), {"max_retries": 5})):
        with ScriptedServer(default=behaviour) as s:
            researcher = make_researcher("openai", "gpt-5.4", {"base_url": s.url, "api_key": TEST_KEY,
                                                               "request_timeout": 60, **options})
            cancel = threading.Event()
            task = Task(tmp_path, "improve it", ("train.py",), 120, tmp_path / "agent.log", 1, 0, cancel=cancel)
            cancel_after(cancel, lambda: len(s.requests) > 0, 0.3)
            started = time.monotonic()
            proposal = researcher.propose(task)
            assert time.monotonic() - started < 10, behaviour
            assert proposal.error_kind == "cancelled", (behaviour, proposal.error)
            assert len(s.requests) == 1  # no request after the cancel
        assert (tmp_path / "train.py").read_text() == "VALUE = 1.0\n"
    # The researcher still works after a cancel (a fresh client).
    with ScriptedServer() as s:
        researcher.base_url = s.url
        proposal = researcher.propose(Task(tmp_path, "improve it", ("train.py",), 30, tmp_path / "a.log", 2, 0))
    assert proposal.error is None and os.path.exists(tmp_path / "train.py")
