"""The driver's one decision loop (driver/): workers only propose and train; the loop alone
decides, moves the branch and writes rows, so a blocked display, a stop in the middle of several
lanes' decisions, a proposal that comes back late and a failed confirmation all leave the ledger
and the branch in agreement."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from harness.driver import loop as driver
from harness.driver.printer import Printer
from harness import ledger
from harness.agents import Proposal, Usage
from harness.config.load import resolve

from conftest import ScriptedResearcher, git, make_repo, set_globals
from test_gate import noisy
from test_pipeline import KNOBS_TRAIN, check_run


class Knobs:
    """Each proposal sets its own knob value: lanes' changes merge cleanly, every one a win."""
    name, model = "knobs", None

    def __init__(self, usage: Usage | None = None, sleep_s: float = 0.0):
        self.usage, self.sleep_s = usage, sleep_s

    def describe(self):
        return {"backend": "knobs"}

    def propose(self, task):
        time.sleep(self.sleep_s)
        train = task.worktree / "train.py"
        knob = "A" if task.iteration % 2 else "B"
        train.write_text(set_globals(train.read_text(), **{knob: task.iteration / 1000}))
        return Proposal(f"iteration {task.iteration}: {knob}", self.usage or Usage())


def test_a_display_that_blocks_holds_up_no_lane(tmp_path: Path):
    """A paused terminal (Ctrl-S) or a pipe nobody reads blocks the printing only: every row is on
    the ledger while the display is still stuck on the first event."""
    repo = make_repo(tmp_path / "r", KNOBS_TRAIN)
    cfg = resolve(repo, "paused", {"baseline_runs": 1, "gate": "strict", "iterations": 6, "gpus": ("0", "1")})
    paused, seen = threading.Event(), []

    def stuck(event, data):  # the terminal: it takes the first line and then never reads again
        seen.append(event)
        paused.wait(120)
    summary = driver.run(cfg, progress=Printer(stuck), researcher=Knobs())
    rows = ledger.read_rows(cfg.ledger_path)
    assert len(seen) == 1 and not paused.is_set()  # the display never got past its first event
    numbers = sorted(r["iteration"] for r in rows if r["status"] != "repeat")
    assert numbers == list(range(len(numbers)))  # re-evaluations of wins another lane overtook included
    assert sum(1 for r in rows if r["kind"] == "candidate") == 6
    assert summary.stopped == "reached --iterations 6"
    check_run(repo, cfg)
    paused.set()


@pytest.mark.parametrize("after_rows", [1, 3])
def test_a_stop_while_three_lanes_decide_leaves_branch_and_ledger_in_agreement(tmp_path: Path, after_rows):
    """SIGINT lands right after a row, with three lanes' candidates finishing together: nothing is
    decided half-way, the branch's HEAD is the ledger's best, and --resume is accepted and goes on."""
    repo = make_repo(tmp_path / "r", KNOBS_TRAIN)
    cfg = resolve(repo, "three", {"baseline_runs": 1, "gate": "strict", "iterations": 9,
                                  "gpus": ("0", "1", "2"), "pipeline": True})
    rows_seen = []

    def progress(event, data):
        if event == "row":
            rows_seen.append(data["row"].iteration)
            if len(rows_seen) == after_rows:
                os.kill(os.getpid(), signal.SIGINT)
    summary = driver.run(cfg, progress=progress, researcher=Knobs())
    assert "interrupted" in summary.stopped
    waiting = len(list(cfg.run_dir.glob("inflight*.json")))
    check_run(repo, cfg, waiting=waiting)
    driver.run(cfg, resume=True, researcher=Knobs())  # the trust check accepts the branch as left
    rows = check_run(repo, cfg)
    primary = [r for r in rows if r["status"] != "repeat"]
    numbers = sorted(r["iteration"] for r in primary)
    assert numbers == list(range(len(numbers))) and len(numbers) >= 10  # 0..N, each once, no gap


def test_a_late_proposal_s_tokens_and_cost_are_on_the_ledger(tmp_path: Path):
    """A researcher call that returns after Ctrl-C is never committed, but what it spent is a
    `stopped` row: --max-tokens and --max-cost count it across resumes."""
    repo = make_repo(tmp_path / "r", KNOBS_TRAIN)
    cfg = resolve(repo, "late", {"baseline_runs": 1, "gate": "strict", "iterations": 3,
                                 "model": "gpt-5.4", "pipeline": False})

    class Late(Knobs):
        def propose(self, task):
            if task.iteration == 1:
                threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
                time.sleep(2.0)  # still thinking when the stop comes
            return super().propose(task)
    summary = driver.run(cfg, researcher=Late(Usage(12000, 2000, 800)))
    assert "interrupted" in summary.stopped
    rows = ledger.read_rows(cfg.ledger_path)
    assert [(r["iteration"], r["status"]) for r in rows] == [(0, "keep"), (1, "stopped")]
    late = rows[1]
    assert (late["input_tokens"], late["cached_tokens"], late["output_tokens"]) == (12000, 2000, 800)
    assert late["cost_usd"] > 0 and late["agent_s"] >= 2.0 and late["kind"] == "stopped"
    assert summary.input_tokens == 12000 and summary.iterations == 0  # spend counted; not an experiment
    for lane in (cfg.run_dir / "lanes").iterdir():
        assert "iteration 1" not in git(lane, "log", "-1", "--format=%s")
    driver.run(cfg, resume=True, researcher=Knobs())
    rows = ledger.read_rows(cfg.ledger_path)
    # --iterations 3 is three experiments: the stopped call is spend, not one of them
    assert [(r["iteration"], r["status"] == "stopped") for r in rows if r["status"] != "repeat"] == \
        [(0, False), (1, True), (2, False), (3, False), (4, False)]


def test_a_failed_confirmation_is_a_repeat_row_and_one_experiment(repo: Path, tmp_path: Path, monkeypatch):
    """A win whose confirmation run crashes is discarded: the crash is a `repeat` row of its
    candidate (kind confirm, its reason coded), so four iterations are four experiments."""
    noisy(repo, tmp_path, monkeypatch, noise=0.01)  # a noise estimate: the gate confirms wins
    cfg = resolve(repo, "confirm", {"baseline_runs": 2, "gate": "noise", "confirm": 1, "iterations": 4})

    def crashes_on_other_seeds(task):  # a big win on seed 42 that crashes on the confirmation's seed
        train = task.worktree / "train.py"
        text = set_globals(train.read_text(), VALUE=0.5)
        train.write_text(text.replace('time.sleep(SLEEP_S)\n', 'time.sleep(SLEEP_S)\n'
                                      'if os.environ.get("HARNESS_SEED") != "42":\n'
                                      '    raise RuntimeError("diverged on another seed")\n', 1))
        return Proposal("a win on one seed only")
    script = [{"VALUE": 1.2}, crashes_on_other_seeds, {"VALUE": 1.3}, {"VALUE": 1.4}]
    summary = driver.run(cfg, researcher=ScriptedResearcher(script))
    rows = ledger.read_rows(cfg.ledger_path)
    two = [r for r in rows if r["iteration"] == 2]
    assert [(r["status"], r["kind"]) for r in two] == [("discard", "candidate"), ("repeat", "confirm")], two
    assert "a confirmation run failed" in two[0]["description"]
    assert two[1]["metric"] is None and two[1]["reason"] == "exit" and two[1]["candidate"] == 2
    assert two[1]["description"].startswith("repeat of iteration 2 (seed 43) [crash:")
    assert summary.iterations == 4 and summary.counts.get("crash", 0) == 0
    assert [r["iteration"] for r in rows if r["status"] != "repeat"] == [0, 1, 2, 3, 4]
