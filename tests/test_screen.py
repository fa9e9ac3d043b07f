"""What the screen shows: the live panel of `harness run` / `harness ab` in a real terminal (a
tmux pane), plain lines in a log, and the status pane of scripts/overnight.sh beside a run."""
from __future__ import annotations

import os
import re
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
# A `cmd:` researcher under a long name (a long label) that lowers VALUE by 10% and reports its
# tokens and cost, so every figure of the panel has a value to show.
RESEARCHER = """import json, re, sys, uuid
path = sys.argv[1] + "/train.py"
src = open(path).read()
value = float(re.search(r"^VALUE = ([0-9.]+)", src, re.M).group(1)) * 0.9
src = re.sub(r"^VALUE = .*$", f"VALUE = {value:.4f}", src, count=1, flags=re.M)
open(path, "w").write(src + f"# {uuid.uuid4()}\\n")  # never the same code twice: every call trains
print(json.dumps({"input_tokens": 1500, "output_tokens": 250, "cost_usd": 0.0125,
                  "description": f"VALUE to {value:.4f}"}))
"""
# The panel's figures, each whole: a cut one ("0.90…", "$0.…") does not match.
FIGURES = {"best": r"\d\.\d{6}", "improvement": r"[+-]\d\.\d{6}", "keep": r"\d+/\d+ \d+%",
           "tokens": r"\d+(\.\d)?[kM]?", "cost": r"\$\d+\.\d{4}", "GPU": r"\d+%"}


def cmd_agent(tmp_path: Path) -> str:
    script = tmp_path / "a_researcher_with_a_rather_long_name_for_tonight.py"
    script.write_text(RESEARCHER)
    return f"cmd:{sys.executable} {script} {{workdir}} --and-some-flags {tmp_path / 'somewhere' / 'else'}"


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
    for column in ("iter", "best", "improv.", "keep", "tokens", "cost", "now"):
        assert column in screen, screen
    assert "GPU" not in screen  # no GPUs, no GPU column
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
    assert all("ETA" in f and "keep" in f and "tokens" in f and "cost" in f for f in figures)
    assert not any("GPU" in f for f in figures)  # no GPUs: no GPU duty
    assert "keep 0/2" in figures[-1] or "keep 1/2" in figures[-1] or "keep 2/2" in figures[-1]


def last_panel(screen: str) -> list[str]:
    """The panel's lines as last drawn: from the last `elapsed` line down."""
    lines = screen.rstrip("\n").splitlines()
    start = max(i for i, line in enumerate(lines) if line.lstrip("┃ ").startswith("elapsed"))
    return [line.rstrip() for line in lines[start:] if line.strip()]


def panel_figures(panel: list[str]) -> dict[str, str]:
    """The figures the panel shows, by name, read from either layout: the table (one cell per
    figure) or the compact one (`label value` pairs)."""
    heads = next((line for line in panel if line.startswith("┃")), None)
    if heads is not None:
        names = [c.strip() for c in heads.strip("┃").split("┃")]
        row = next(line for line in panel if line.startswith("│") and "(" in line)
        cells = dict(zip(names, (c.strip() for c in row.strip("│").split("│"))))
        return {"improvement" if k == "improv." else k: v for k, v in cells.items()}
    text = "  ".join(panel)
    found = {}
    for name, label, pattern in (("best", "best", r"\S+"), ("improvement", "impr", r"\S+"),
                                 ("keep", "keep", r"\S+ \S+"), ("GPU", "GPU", r"\S+"),
                                 ("tokens", "tok", r"\S+"), ("cost", "cost", r"\S+"), ("iter", "iter", r"\S+")):
        m = re.search(rf"(?:^|  ){label} ({pattern})", text)
        if m:
            found[name] = m.group(1)
    return found


def assert_whole(figures: dict[str, str], gpu: bool, screen: str) -> None:
    for name, pattern in FIGURES.items():
        if name == "GPU" and not gpu:
            assert "GPU" not in figures, screen
            continue
        assert name in figures, f"{name} missing:\n{screen}"
        assert re.fullmatch(pattern, figures[name]), f"{name} is cut: {figures[name]!r}\n{screen}"


def test_live_panel_fits_any_width_and_never_cuts_a_figure(tmp_path: Path, tmux: Tmux):
    """A `cmd:` researcher's label is long, the run has GPUs (two lanes): at 220 and 120 columns
    the table (the label gives way, no figure), at 80 and 40 (a half-width pane) the compact layout."""
    hold = tmp_path / "hold"  # the jobs after the first researched rows train until the test is done
    hold.touch()
    held = FAKE_TRAIN.replace("SLEEP_S = 0.0", f"SLEEP_S = 0.5\nHOLD = {str(hold)!r}").replace(
        "time.sleep(SLEEP_S)\n", "time.sleep(SLEEP_S)\nwhile VALUE < 0.85 and os.path.exists(HOLD):\n    time.sleep(0.1)\n")
    repo = make_repo(tmp_path / "r", train_source=held)
    cmd = harness_cmd("run", "--repo", repo, "--tag", "wide", "--agent", f"'{cmd_agent(tmp_path)}'",
                      "--iterations", "8", "--baseline-runs", "1", "--gpus", "0,1",
                      "--time-budget", "30") + "; sleep 60"
    tmux("new-session", "-d", "-s", "wide", "-x", "220", "-y", "40", cmd)
    tmux.wait_for("wide", "VALUE to 0.9000", "training iteration", timeout_s=120)  # a researched row is in
    for width, table in ((220, True), (120, True), (80, False), (40, False)):
        tmux("resize-window", "-t", "wide", "-x", str(width), "-y", "40")
        time.sleep(1.5)  # the panel redraws twice a second at the terminal's new width
        screen = tmux.capture("wide")
        panel = last_panel(screen)
        assert all(len(line) <= width for line in panel)
        assert any(line.startswith("┃") for line in panel) == table, screen
        assert "┃┃" not in screen.split("elapsed")[-1], screen
        figures = panel_figures(panel)
        assert_whole(figures, gpu=True, screen=screen)
        assert figures["GPU"] != "-"  # filled: the share of the time the GPUs trained
        if width == 220:  # the label, shortened to the researcher's script, whole
            assert "no model (cmd: a_researcher_with_a_rather_long_name_for_tonight.py)" in screen, screen
    hold.unlink()
    tmux.wait_for("wide", "reached --iterations 8", timeout_s=300)


def test_overnight_default_window_both_panes_readable(tmp_path: Path, tmux: Tmux):
    """scripts/overnight.sh in its default 80x24 window: the run in the left pane (40 columns),
    `status --watch` in the right one. During the baseline the run's ETA comes from --iterations;
    the status pane lives through the baseline (no ledger row yet); each fits its half width
    and 24 rows with every figure whole."""
    slow_baseline = FAKE_TRAIN.replace("time.sleep(SLEEP_S)", "time.sleep(6.0 if VALUE == 1.0 else 1.0)")
    repo = make_repo(tmp_path / "r", train_source=slow_baseline)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "harness"
    shim.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m harness \"$@\"\n")
    shim.chmod(0o755)
    env = {**tmux.env, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TMUX_TMPDIR": str(tmp_path)}
    # overnight.sh talks to the default server of TMUX_TMPDIR: point our helper at that socket.
    tmux.socket = tmp_path / f"tmux-{os.getuid()}" / "default"
    tmux.env = env
    subprocess.run(["tmux", "new-session", "-d", "-s", "keep", "-x", "80", "-y", "24"], env=env, check=True,
                   timeout=30)  # a server of the given size for overnight.sh's session
    out = subprocess.run(["bash", str(ROOT / "scripts/overnight.sh"), "nite", "--agent", cmd_agent(tmp_path),
                          "--iterations", "6", "--baseline-runs", "1", "--time-budget", "30"],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    tmux("resize-window", "-t", "harness-nite", "-x", "80", "-y", "24", check=False)
    assert tmux("display", "-p", "-t", "harness-nite", "#{window_width}x#{window_height}").strip() == "80x24"
    screen = tmux.wait_for("harness-nite:0.0", "training the baseline", "ETA", timeout_s=30)
    assert "ETA ≥0:00:" in screen and "ETA unknown" not in screen, screen  # --iterations 6, the baseline so far
    screen = tmux.wait_for("harness-nite:0.1", "the baseline trains first", timeout_s=30)
    assert "waiting for its first row" in screen or "no rows yet" in screen
    time.sleep(1.5)
    assert len(tmux("list-panes", "-t", "harness-nite").splitlines()) == 2  # still alive
    left, right = (int(tmux("display", "-p", "-t", f"harness-nite:0.{i}", "#{pane_width}").strip()) for i in (0, 1))
    assert left <= 40 and right <= 41
    screen = tmux.wait_for("harness-nite:0.0", "$0.0", "keep 2/", timeout_s=120)
    panel = last_panel(screen)
    assert "┃" not in "".join(panel) and all(len(line) <= left for line in panel), screen
    assert_whole(panel_figures(panel), gpu=False, screen=screen)
    screen = tmux.wait_for("harness-nite:0.1", "baseline:      1.000000", "improvement", "cost:",
                           timeout_s=120)  # the baseline's row is in
    lines = [line for line in screen.splitlines() if line.strip()]
    assert all(len(line) <= right for line in lines) and len(screen.splitlines()) <= 24
    assert any(line.startswith("baseline:") for line in lines)  # one figure a line, not wrapped
    best = next(line for line in lines if line.startswith("best:"))
    assert re.match(r"best: +\d\.\d{6} ", best), best
    assert "waiting for --resume" not in screen
    # A pane shorter than the ledger's last rows: fewer rows, still every figure and the events.
    final = tmux.wait_for("harness-nite:0.0", "reached --iterations 6", timeout_s=120)
    shown = tmux.wait_for("harness-nite:0.1", "not running", timeout_s=30)  # the two panes agree
    cost = next(line for line in shown.splitlines() if line.startswith("cost:")).split()[1]
    assert panel_figures(last_panel(final.split("reached --iterations")[0]))["cost"] == cost, (final, shown)
    tmux("new-session", "-d", "-s", "short", "-x", "40", "-y", "16",
         harness_cmd("status", "nite", "--repo", repo, "--watch", "--interval", "0.5") + "; sleep 60")
    screen = tmux.wait_for("short", "events:", timeout_s=30)
    lines = screen.rstrip("\n").splitlines()
    assert lines[0].startswith("run nite") and any(line.startswith("cost:") for line in lines), screen
    assert sum(1 for line in lines if re.match(r" +\d+ [0-9a-f]{7} ", line)) >= 1, screen


def test_live_panel_says_what_each_lane_is_doing(tmp_path: Path, tmux: Tmux):
    repo = make_repo(tmp_path / "r", train_source=FAKE_TRAIN.replace("SLEEP_S = 0.0", "SLEEP_S = 2.0"))
    cmd = harness_cmd("run", "--repo", repo, "--tag", "lanes", "--agent", "mutate", "--iterations", "4",
                      "--baseline-runs", "1", "--gpus", "0,1", "--time-budget", "30") + "; sleep 60"
    tmux("new-session", "-d", "-s", "lanes", "-x", "170", "-y", "40", cmd)
    tmux.wait_for("lanes", "lane 0: training iteration", "lane 1: training iteration")
    tmux.wait_for("lanes", "reached --iterations 4", timeout_s=120)
