"""supervise.wait_exit: the wait on every job and researcher process (a pidfd; Popen.wait where there is none)."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from harness.lifecycle import supervise


@pytest.mark.parametrize("pidfd", [True, False])
def test_wait_exit_says_whether_the_process_ended_and_wakes_when_it_does(monkeypatch, pidfd):
    if not pidfd:  # an older kernel or Python: Popen.wait's polling
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    proc = subprocess.Popen(["sh", "-c", "read line; exit 7"], stdin=subprocess.PIPE, text=True)
    try:
        assert supervise.wait_exit(proc, 0.2) is False  # it cannot end before it reads its line
        assert proc.returncode is None
        proc.stdin.write("go\n")
        proc.stdin.close()
        started = time.monotonic()
        assert supervise.wait_exit(proc, 120) is True
        assert time.monotonic() - started < 60  # woken by the exit, not by the deadline
        assert proc.returncode == 7
        assert supervise.wait_exit(proc, 120) is True  # already reaped: at once
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_wait_exit_works_above_the_select_limit_of_1024_descriptors():
    """A supervisor with many open files (a Ray driver's sockets): the pidfd it waits on is past fd 1024."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the fd limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        proc = subprocess.Popen(["sh", "-c", "exit 3"])
        assert supervise.wait_exit(proc, 120) is True and proc.returncode == 3
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
