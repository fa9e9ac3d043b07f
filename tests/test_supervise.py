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


def test_a_stop_finds_a_setsid_daemon_by_its_token_and_reads_no_older_process_environment(tmp_path, monkeypatch):
    """Supervisor.stop kills a process's group and whatever carries its token (a double-forked
    setsid daemon left its group): still found, while the environment of every process that
    started before the spawn (all the machine's others) is never read."""
    import psutil
    older = {p.pid for p in psutil.process_iter(["create_time"])  # the machine's processes, long before the spawn
             if p.info["create_time"] and p.info["create_time"] < time.time() - 30}
    assert 1 in older
    sup = supervise.Supervisor(tmp_path / "run")
    pidfile = tmp_path / "daemon.pid"
    proc = sup.spawn("job", ["python3", "-c",
                             "import os, subprocess, sys, time\n"
                             "if os.fork() == 0:\n"
                             "    os.setsid()\n"
                             f"    p = subprocess.Popen(['sleep', '300'])\n"
                             f"    open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
                             "    os._exit(0)\n"
                             "time.sleep(300)\n"])
    read: list[int] = []
    real = supervise._environ
    monkeypatch.setattr(supervise, "_environ", lambda pid: (read.append(pid), real(pid))[1])
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        daemon = int(pidfile.read_text())
        assert os.getpgid(daemon) != proc.pid  # out of the job's group: only its token finds it
        sup.stop(proc, grace_s=1.0)
        assert proc.poll() is not None
        deadline = time.monotonic() + 30
        while supervise.alive(daemon) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not supervise.alive(daemon)
        assert read and not older & set(read)  # only processes younger than the spawn
    finally:
        if proc.poll() is None:
            sup.stop(proc, grace_s=0)
