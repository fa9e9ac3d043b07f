"""Lanes: one per GPU, each with its own worktrees, sharing one best and one ledger."""
from __future__ import annotations

import dataclasses
import threading
from collections import defaultdict
from pathlib import Path

import pytest

from harness.driver import loop as driver
from harness import ledger
from harness.agents import Proposal
from harness.config.load import resolve
from harness.errors import ConfigError

from conftest import ScriptedResearcher, make_repo, set_globals
from test_pipeline import KNOBS_TRAIN, check_run, head_watch

EDITS = {1: {"A": 0.1}, 2: {"B": 0.2}, 3: {"VALUE": 1.5}, 4: {"VALUE": 2.0}}


class BarrierResearcher:
    """Four proposals made at once from the baseline: iterations 1 and 2 both win."""
    name, model = "barrier", None

    def __init__(self):
        self.barrier = threading.Barrier(4)
        self.calls = []

    def describe(self):
        return {"backend": "barrier"}

    def propose(self, task):
        self.calls.append(task)
        edit = EDITS[task.iteration]
        train = task.worktree / "train.py"
        train.write_text(set_globals(train.read_text(), **edit))
        self.barrier.wait(timeout=20)
        return Proposal(", ".join(f"{k}={v}" for k, v in edit.items()))


def gpu_intervals(log: Path) -> dict[str, list[tuple[float, float]]]:
    out = defaultdict(list)
    for line in log.read_text().splitlines():
        gpu, start, end = line.split()
        out[gpu].append((float(start), float(end)))
    return out


@pytest.mark.parametrize("pipelined", [False, True])
def test_four_lanes_two_win_at_once(tmp_path: Path, monkeypatch, pipelined):
    repo = make_repo(tmp_path / "r", KNOBS_TRAIN)
    gpu_log = tmp_path / "gpus.log"
    monkeypatch.setenv("FAKE_GPU_LOG", str(gpu_log))
    cfg = resolve(repo, "lanes", {"baseline_runs": 1, "gate": "strict", "iterations": 4,
                                  "gpus": ("0", "1", "2", "3"), "pipeline": pipelined})
    researcher = BarrierResearcher()
    progress, _ = head_watch(cfg)
    summary = driver.run(cfg, progress=progress, researcher=researcher)
    rows = check_run(repo, cfg)
    by_iter = {r["iteration"]: r for r in rows}
    assert sorted(by_iter) == [0, 1, 2, 3, 4, 5]
    base = rows[0]["commit"]
    assert all(by_iter[i]["parent"] == base for i in (1, 2, 3, 4))  # all four proposed at once
    assert {by_iter[i]["lane"] for i in (1, 2, 3, 4)} == {0, 1, 2, 3}
    # One of the two winners is kept; the other beat its parent but the best had moved:
    # it is rebased onto the new best and trained again (iteration 5) before it is kept.
    first, second = sorted((1, 2), key=lambda i: by_iter[i]["status"] != "keep")
    assert by_iter[first]["status"] == "keep" and by_iter[second]["status"] == "discard"
    assert "another lane moved the best" in by_iter[second]["description"]
    assert "re-evaluated on it as iteration 5" in by_iter[second]["description"]
    again = by_iter[5]
    assert again["status"] == "keep" and again["parent"] == by_iter[first]["commit"]
    assert f"rebased onto {by_iter[first]['commit']}" in again["description"]
    assert again["lane"] == by_iter[second]["lane"] and again["input_tokens"] == 0
    assert again["metric"] == pytest.approx(0.7) and summary.best_value == pytest.approx(0.7)
    assert by_iter[3]["status"] == by_iter[4]["status"] == "discard"
    # A GPU is never shared by two training jobs, and every GPU was used.
    intervals = gpu_intervals(gpu_log)
    assert set(intervals) == {"0", "1", "2", "3"}
    for spans in intervals.values():
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    worktrees = {str(t.worktree) for t in researcher.calls}
    assert len(worktrees) == 4 and str(cfg.worktree) not in worktrees
    # --iterations counts proposals: the re-evaluation (5) was not one, so --iterations 5 on
    # resume makes exactly one more.
    more = ScriptedResearcher([{}, {}])
    more.name, more.describe = researcher.name, researcher.describe  # the same researcher, resumed
    driver.run(dataclasses.replace(cfg, iterations=5), resume=True, researcher=more)
    assert len(more.calls) == 1
    assert sorted(r["iteration"] for r in ledger.read_rows(cfg.ledger_path) if r["status"] != "repeat") == list(range(7))


def test_gpus_listed_twice_are_refused(repo: Path):
    with pytest.raises(ConfigError, match="twice"):
        driver.run(resolve(repo, "dup", {"gpus": ("0", "0"), "baseline_runs": 1}))


def test_cli_run_with_lanes_and_pipeline(repo: Path):
    from click.testing import CliRunner
    from harness.cli import main
    result = CliRunner().invoke(main, ["run", "--repo", str(repo), "--tag", "cli", "--agent", "mutate",
                                       "--iterations", "4", "--baseline-runs", "1", "--gpus", "0,1",
                                       "--pipeline"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    cfg = resolve(repo, "cli", {})
    rows = check_run(repo, cfg)
    assert {r["lane"] for r in rows[1:] if r["status"] != "repeat"} <= {0, 1}
    assert len([r for r in rows if r["status"] != "repeat"]) >= 5
    assert (cfg.run_dir / "lanes" / "1b").is_dir()


class DroppedAtTheStop:
    """Lane 0's proposal (iteration 1) is still thinking when Ctrl-C comes, while iteration 2 trains."""
    name, model = "dropped", None

    def __init__(self, stop: bool):
        self.stop = stop  # False: the resumed session, plain edits

    def describe(self):
        return {"backend": "dropped"}

    def propose(self, task):
        import os
        import signal
        import time
        train = task.worktree / "train.py"
        if self.stop and task.iteration == 1:
            time.sleep(2.5)  # past the Ctrl-C: a stop commits no proposal
        elif self.stop and task.iteration == 2:
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
            train.write_text(set_globals(train.read_text(), SLEEP_S=5.0))
        train.write_text(set_globals(train.read_text(), VALUE=2.0 + task.iteration / 10))
        return Proposal(f"iteration {task.iteration}")


def test_a_proposal_dropped_at_the_stop_keeps_its_number_and_its_spend(tmp_path: Path):
    """Iteration 1 came back after the stop (never committed), iteration 2 was training: iteration 1
    is a `stopped` row with what it spent, and after --resume the ledger's numbers are 1..N, each once."""
    repo = make_repo(tmp_path / "r", KNOBS_TRAIN)
    cfg = resolve(repo, "gap", {"baseline_runs": 1, "gate": "strict", "iterations": 3, "gpus": ("0", "1"),
                                "pipeline": False, "time_budget": 20})
    summary = driver.run(cfg, researcher=DroppedAtTheStop(stop=True))
    assert "interrupted" in summary.stopped
    rows = ledger.read_rows(cfg.ledger_path)
    assert [(r["iteration"], r["status"]) for r in rows] == [(0, "keep"), (1, "stopped")]  # 2 journaled
    assert rows[1]["agent_s"] >= 2.0 and rows[1]["train_s"] is None and "iteration 1" in rows[1]["description"]
    driver.run(cfg, resume=True, researcher=DroppedAtTheStop(stop=False))
    rows = ledger.read_rows(cfg.ledger_path)
    # --iterations 3 is three experiments (2, 3, 4); the stopped call kept its number and its spend
    assert sorted(r["iteration"] for r in rows) == [0, 1, 2, 3, 4], rows
    assert [r["iteration"] for r in rows if r["status"] == "stopped"] == [1]
