"""Every way a run is stopped, under every mode of the one driver: SIGINT, SIGTERM and SIGHUP
(Ctrl-C, `timeout`/`systemctl stop`, a closed terminal), SIGKILL at a kill point, a researcher
that ignores SIGTERM, and tmux kill-session. After each: no process of the run is left, no
scratch worktree, and --resume puts every experiment on the ledger exactly once, HEAD at best."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT
from fakes.helpers import install_stand_ins

from .conftest import (agent_arg, alive, assert_recovered, harness_run, run_processes, slow_repo, start_run,
                       wait_for, worktrees)

ITERATIONS = 3
MODES = {
    "classic": [],
    "pipeline": ["--pipeline"],
    "lanes": ["--gpus", "0,1"],
}


def training(run_dir: Path, iteration: int = 1) -> bool:
    """A training job of the iteration (or later) is running: its process record is on disk."""
    for record in (run_dir / "procs").glob("*.json"):
        try:
            name = json.loads(record.read_text())["name"]
        except (OSError, ValueError, KeyError):
            continue
        if name.startswith("train iter-") and int(name[len("train iter-"):][:4]) >= iteration:
            return True
    return False


def driven(run_dir: Path) -> bool:
    """A supervisor still holds the run (its flock), e.g. while it cleans up."""
    import fcntl
    fd = os.open(run_dir / "supervisor.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def expected_worktrees(repo: Path, run_dirs: list[Path]) -> list[str]:
    """What may stay between sessions: each run's worktree and its lanes' worktrees."""
    out = []
    for run_dir in run_dirs:
        out.append(str((run_dir / "worktree").resolve()))
        lanes = run_dir / "lanes"
        out += [str(p.resolve()) for p in lanes.iterdir()] if lanes.exists() else []
    return sorted(out)


def stop_and_check(proc: subprocess.Popen, sig: int, repo: Path, run_dir: Path, arms: list[Path]) -> str:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 128 + sig, err
    assert "interrupted" in err and "--resume" in err, err
    assert run_processes(run_dir) == [], "a process of the run outlived its supervisor"
    assert worktrees(repo) == expected_worktrees(repo, arms), "a scratch or slot worktree was left"
    assert not list((run_dir / "procs").glob("*.json")), "a process record outlived its process"
    return err


@pytest.mark.parametrize("mode,sig", [("classic", signal.SIGINT), ("classic", signal.SIGTERM),
                                      ("classic", signal.SIGHUP), ("pipeline", signal.SIGTERM),
                                      ("lanes", signal.SIGHUP)])
def test_a_signal_during_training_stops_everything_then_resume(tmp_path: Path, mode: str, sig: int):
    hold = tmp_path / "hold"
    hold.touch()
    repo = slow_repo(tmp_path / "r", sleep_s=0.0, hold=hold)
    args = ["--repo", str(repo), "--tag", "s", "--baseline-runs", "1", "--agent", agent_arg(tmp_path),
            "--iterations", str(ITERATIONS), *MODES[mode]]
    run_dir = repo / "runs" / "s"
    proc = start_run(args)
    wait_for(lambda: training(run_dir), what="iteration 1 to train")
    stop_and_check(proc, sig, repo, run_dir, [run_dir])
    hold.unlink()
    resumed = harness_run(repo, "s", *args[4:], "--resume", timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert_recovered(repo, "s", ITERATIONS)
    assert run_processes(run_dir) == []


def test_a_signal_stops_a_parallel_ab_and_both_arms_resume(tmp_path: Path):
    hold = tmp_path / "hold"
    hold.touch()
    repo = slow_repo(tmp_path / "r", sleep_s=0.0, hold=hold)
    args = ["--repo", str(repo), "--tag", "ab", "--baseline-runs", "1", "--agent", agent_arg(tmp_path),
            "--iterations", "2", "--gpus", "0,1", "--schedule", "parallel"]
    run_dir = repo / "runs" / "ab"
    proc = start_run(args, command="ab")
    wait_for(lambda: training(run_dir), what="an arm's iteration 1 to train")
    stop_and_check(proc, signal.SIGTERM, repo, run_dir, [run_dir / "a", run_dir / "b"])
    hold.unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env["PYTHONPATH"] = str(ROOT)
    resumed = subprocess.run([sys.executable, "-m", "harness", "ab", *args, "--resume"], env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    for arm in "ab":
        assert_recovered(repo, f"ab-{arm}", 2, run_dir=run_dir / arm)
    assert run_processes(run_dir) == []


@pytest.mark.parametrize("mode", ["pipeline", "lanes"])
def test_sigkill_while_lanes_train_then_resume_stops_the_orphans(tmp_path: Path, mode: str):
    """The lanes' jobs outlive a SIGKILLed supervisor; the resume stops them before anything else."""
    repo = slow_repo(tmp_path / "r", sleep_s=3.0)
    args = ("--agent", agent_arg(tmp_path), "--iterations", str(ITERATIONS), *MODES[mode])
    killed = harness_run(repo, "k", *args, fault="during_train:2", timeout=240)
    assert killed.returncode == -9, killed.stderr
    run_dir = repo / "runs" / "k"
    orphans = run_processes(run_dir)
    assert orphans, "the fault left no job running: the test would prove nothing"
    resumed = harness_run(repo, "k", *args, "--resume", timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert "orphan_killed" in resumed.stderr
    assert run_processes(run_dir) == []
    assert_recovered(repo, "k", ITERATIONS)


STUBBORN = r'''
import json, signal, sys, time
from pathlib import Path
signal.signal(signal.SIGTERM, signal.SIG_IGN)
Path(sys.argv[2]).write_text("thinking")
time.sleep(120)
'''


def test_a_researcher_that_ignores_sigterm_is_gone_within_the_grace_period(tmp_path: Path):
    repo = slow_repo(tmp_path / "r", sleep_s=0.0)
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    marker = tmp_path / "thinking"
    args = ["--repo", str(repo), "--tag", "st", "--baseline-runs", "1", "--iterations", "2",
            "--agent", f"cmd:{sys.executable} {script} {{workdir}} {marker}"]
    run_dir = repo / "runs" / "st"
    proc = start_run(args)
    wait_for(marker.exists, what="the researcher to start thinking")
    t0 = time.monotonic()
    stop_and_check(proc, signal.SIGINT, repo, run_dir, [run_dir])
    assert time.monotonic() - t0 < 60  # SIGTERM's grace, then SIGKILL (wide margin for a busy machine)


def test_a_cli_researcher_is_stopped_with_the_run(tmp_path: Path, monkeypatch):
    """The stand-in codex (pipelined by default) hangs, with a grandchild that ignores SIGTERM,
    when SIGTERM comes: both go with the run."""
    bin_dir = install_stand_ins(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "modes").write_text("hang\n")
    monkeypatch.setenv("FAKE_AGENT_SCRIPT", str(tmp_path / "modes"))
    monkeypatch.setenv("FAKE_AGENT_PID_FILE", str(tmp_path / "grandchild.pid"))
    repo = slow_repo(tmp_path / "r", sleep_s=0.0)
    args = ["--repo", str(repo), "--tag", "cx", "--baseline-runs", "1", "--iterations", "2", "--agent", "codex"]
    run_dir = repo / "runs" / "cx"
    proc = start_run(args)

    def researcher_running() -> bool:
        return any(json.loads(r.read_text())["name"].startswith("researcher")
                   for r in (run_dir / "procs").glob("*.json") if r.stat().st_size)
    wait_for(researcher_running, what="codex to start")
    wait_for((tmp_path / "grandchild.pid").exists, what="codex's grandchild")
    stop_and_check(proc, signal.SIGTERM, repo, run_dir, [run_dir])
    assert not alive(int((tmp_path / "grandchild.pid").read_text()))


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_overnight_in_tmux_then_kill_session_leaves_nothing_and_resume_continues(tmp_path: Path):
    hold = tmp_path / "hold"
    hold.touch()
    repo = slow_repo(tmp_path / "r", sleep_s=0.0, hold=hold)
    shim = tmp_path / "bin" / "harness"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m harness \"$@\"\n")
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARNESS_", "TMUX"))}
    env["PATH"] = f"{shim.parent}{os.pathsep}{env['PATH']}"
    env["TMUX_TMPDIR"] = str(tmp_path)  # a tmux server of the test's own
    agent = agent_arg(tmp_path)
    started = subprocess.run(["bash", str(ROOT / "scripts" / "overnight.sh"), "tm", "--agent", agent,
                              "--iterations", str(ITERATIONS), "--baseline-runs", "1"],
                             cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr
    run_dir = repo / "runs" / "tm"
    try:
        try:
            wait_for(lambda: training(run_dir), timeout_s=120, what="iteration 1 to train in tmux")
        except AssertionError as e:  # say what the panes showed
            panes = [subprocess.run(["tmux", "capture-pane", "-p", "-t", f"harness-tm:0.{i}"], env=env,
                                    capture_output=True, text=True, timeout=30).stdout for i in (0, 1)]
            raise AssertionError(f"{e}; the run's pane:\n{panes[0]}\nthe status pane:\n{panes[1]}") from None
    finally:
        subprocess.run(["tmux", "kill-session", "-t", "harness-tm"], env=env, capture_output=True, timeout=30)
    # the supervisor itself (not in the run folder) still holds the run while it cleans up
    wait_for(lambda: run_processes(run_dir) == [] and not driven(run_dir), timeout_s=60,
             what="the run to stop after kill-session")
    subprocess.run(["tmux", "kill-server"], env=env, capture_output=True, timeout=30)
    # The pane's SIGHUP goes to the terminal's whole process group, the clean-up's git included:
    # the slot's worktree is still removed (driver/signals.py's quiet).
    assert worktrees(repo) == expected_worktrees(repo, [run_dir])
    hold.unlink()
    resumed = harness_run(repo, "tm", "--agent", agent, "--iterations", str(ITERATIONS), "--resume", timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert_recovered(repo, "tm", ITERATIONS)
    assert worktrees(repo) == expected_worktrees(repo, [run_dir])


def test_a_signal_during_a_health_rerun_leaves_no_job_and_no_worktree(tmp_path: Path):
    """The best's re-run at a health checkpoint trains in an executor slot: a stop there kills it,
    and the slot's worktree goes with the run."""
    repo = slow_repo(tmp_path / "r", sleep_s=2.0)
    args = ["--repo", str(repo), "--tag", "hc", "--baseline-runs", "1", "--agent", agent_arg(tmp_path),
            "--iterations", "2", "--health-every", "1"]
    run_dir = repo / "runs" / "hc"

    def health_rerun() -> bool:
        return any("health" in r.read_text() for r in (run_dir / "procs").glob("*.json") if r.stat().st_size)
    proc = start_run(args)
    wait_for(health_rerun, timeout_s=120, what="the health re-run to train")
    stop_and_check(proc, signal.SIGINT, repo, run_dir, [run_dir])
    resumed = harness_run(repo, "hc", *args[4:], "--resume", timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert_recovered(repo, "hc", 2)
