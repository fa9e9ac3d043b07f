"""What the screen shows: the live panel of `harness run` / `harness ab` in a real terminal (a
tmux pane), plain lines in a log, and the status pane of scripts/overnight.sh beside a run."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAKE_TRAIN, ROOT, make_repo
from fakes.helpers import harness

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
SLOW_TRAIN = FAKE_TRAIN.replace("SLEEP_S = 0.0", "SLEEP_S = 1.5")


class Tmux:
    """A private tmux server (its own socket in tmp_path): never the user's sessions."""

    def __init__(self, tmp_path: Path):
        self.socket = tmp_path / "tmux.sock"
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}
        for name in ("TMUX", "COLUMNS", "LINES"):  # xdist's workers set COLUMNS=80: the pane's size must rule
            self.env.pop(name, None)

    def __call__(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(["tmux", "-S", str(self.socket), *args], env=self.env, capture_output=True,
                             text=True, timeout=30)
        if check:
            assert out.returncode == 0, out.stderr
        return out.stdout

    def capture(self, target: str) -> str:
        return self("capture-pane", "-p", "-t", target)

    def wait_for(self, target: str, *words: str, timeout_s: float = 90) -> str:
        deadline = time.monotonic() + timeout_s
        screen = ""
        while time.monotonic() < deadline:
            out = self("capture-pane", "-p", "-t", target, check=False)
            if not out and self("has-session", "-t", target, check=False) == "" and not self.alive(target):
                raise AssertionError(f"{words} never appeared; the pane closed, last showing:\n{screen}")
            screen = out or screen
            if all(w in screen for w in words):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{words} never appeared; the pane shows:\n{screen}")

    def alive(self, target: str) -> bool:
        return subprocess.run(["tmux", "-S", str(self.socket), "has-session", "-t", target], env=self.env,
                              capture_output=True, timeout=30).returncode == 0

    def kill(self) -> None:
        self("kill-server", check=False)


@pytest.fixture
def tmux(tmp_path: Path):
    t = Tmux(tmp_path)
    yield t
    t.kill()


def harness_cmd(*args: str) -> str:
    return " ".join([sys.executable, "-m", "harness", *[str(a) for a in args]])


def test_live_panel_of_a_run_in_a_terminal(tmp_path: Path, tmux: Tmux):
    repo = make_repo(tmp_path / "r", train_source=SLOW_TRAIN)
    cmd = harness_cmd("run", "--repo", repo, "--tag", "live", "--agent", "mutate", "--iterations", "3",
                      "--baseline-runs", "1") + "; sleep 60"
    tmux("new-session", "-d", "-s", "live", "-x", "150", "-y", "40", cmd)
    screen = tmux.wait_for("live", "training the baseline", "elapsed")
    screen = tmux.wait_for("live", "training iteration 1")  # the candidate of iteration 1 is being trained
    for column in ("iter", "best", "improv.", "keep", "GPU", "tokens", "cost", "now"):
        assert column in screen, screen
    assert "no model (mutate)" in screen and "1/3" not in screen or "/3" in screen
    assert "ETA 0:0" in screen  # from --iterations and the measured mean iteration time
    done = tmux.wait_for("live", "reached --iterations 3", timeout_s=120)
    assert "keep rate" in done and "3/3" in done  # the last panel stays above the summary


def test_live_panel_of_an_ab_shows_both_arms(tmp_path: Path, tmux: Tmux):
    repo = make_repo(tmp_path / "r", train_source=SLOW_TRAIN)
    cmd = harness_cmd("ab", "--repo", repo, "--tag", "duo", "--agent", "mutate", "--iterations", "1",
                      "--baseline-runs", "1", "--hours", "1") + " > /dev/null; sleep 60"
    tmux("new-session", "-d", "-s", "duo", "-x", "150", "-y", "40", cmd)
    screen = tmux.wait_for("duo", "a no model (mutate)", "b no model (mutate)", "ETA")
    assert "ETA unknown" not in screen
    tmux.wait_for("duo", "Improvement:", timeout_s=120)  # the verdict, after both arms ended


def test_plain_lines_when_stderr_is_not_a_terminal(repo: Path):
    result = harness(["run", "--repo", str(repo), "--tag", "log", "--agent", "mutate", "--iterations", "2",
                      "--baseline-runs", "1"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert not any("\x1b[" in line for line in lines)  # no cursor movement, no colour codes
    figures = [line for line in lines if line.strip().startswith("elapsed")]
    assert len(figures) == 2  # one after each row
    assert all("ETA" in f and "keep" in f and "GPU duty" in f and "tokens" in f and "cost" in f for f in figures)
    assert "keep 0/2" in figures[-1] or "keep 1/2" in figures[-1] or "keep 2/2" in figures[-1]


def test_overnight_status_pane_waits_for_the_baseline_and_fits(tmp_path: Path, tmux: Tmux):
    """scripts/overnight.sh: the run in the left pane, `status --watch` in the right one. The
    status pane must live through the baseline (no ledger row yet) and fit its half width."""
    repo = make_repo(tmp_path / "r", train_source=FAKE_TRAIN.replace("SLEEP_S = 0.0", "SLEEP_S = 6.0"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "harness"
    shim.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m harness \"$@\"\n")
    shim.chmod(0o755)
    env = {**tmux.env, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TMUX_TMPDIR": str(tmp_path)}
    # overnight.sh talks to the default server of TMUX_TMPDIR: point our helper at that socket.
    tmux.socket = tmp_path / f"tmux-{os.getuid()}" / "default"
    tmux.env = env
    subprocess.run(["tmux", "new-session", "-d", "-s", "keep", "-x", "80", "-y", "30"], env=env, check=True,
                   timeout=30)  # a server of the given size for overnight.sh's session
    out = subprocess.run(["bash", str(ROOT / "scripts/overnight.sh"), "nite", "--agent", "mutate",
                          "--iterations", "1", "--baseline-runs", "1", "--time-budget", "30"],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    tmux("resize-window", "-t", "harness-nite", "-x", "80", "-y", "30", check=False)
    screen = tmux.wait_for("harness-nite:0.1", "the baseline trains first", timeout_s=30)
    assert "waiting for its first row" in screen or "no rows yet" in screen
    time.sleep(1.5)
    assert len(tmux("list-panes", "-t", "harness-nite").splitlines()) == 2  # still alive
    width = int(tmux("display", "-p", "-t", "harness-nite:0.1", "#{pane_width}").strip())
    assert width <= 41
    screen = tmux.wait_for("harness-nite:0.1", "baseline:", "improvement", timeout_s=120)
    lines = [line for line in screen.splitlines() if line.strip()]
    assert all(len(line) <= width for line in lines)
    assert any(line.startswith("baseline:") for line in lines)  # one figure a line, not wrapped
    assert "waiting for --resume" not in screen


def test_live_panel_says_what_each_lane_is_doing(tmp_path: Path, tmux: Tmux):
    repo = make_repo(tmp_path / "r", train_source=FAKE_TRAIN.replace("SLEEP_S = 0.0", "SLEEP_S = 2.0"))
    cmd = harness_cmd("run", "--repo", repo, "--tag", "lanes", "--agent", "mutate", "--iterations", "4",
                      "--baseline-runs", "1", "--gpus", "0,1", "--time-budget", "30") + "; sleep 60"
    tmux("new-session", "-d", "-s", "lanes", "-x", "170", "-y", "40", cmd)
    tmux.wait_for("lanes", "lane 0: training iteration", "lane 1: training iteration")
    tmux.wait_for("lanes", "reached --iterations 4", timeout_s=120)
