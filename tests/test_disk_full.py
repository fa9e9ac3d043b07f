"""A full disk stops the run with what to free and where, loses nothing, and blames no candidate
(issue 26, item 3): real runs on a size-limited tmpfs that fills up between iterations (a
researcher's neighbour writes a big file) and during training (the job's neighbour does)."""
from __future__ import annotations

import contextlib
import subprocess

import pytest

from harness.driver import loop as driver
from harness import ledger
from harness.agents import Proposal
from harness.config.load import resolve
from harness.lifecycle.disk import DiskFull

from conftest import FAKE_TRAIN, ScriptedResearcher, make_repo, set_globals

FILL = '''import os as _os
_fill = _os.environ.get("FILL_TO")
if _fill and _os.environ.get("HARNESS_ITERATION") == "1" and not _os.path.exists(_fill + ".once"):
    open(_fill + ".once", "w").close()
    with open(_fill, "wb") as _f:  # another process on the machine fills the disk while this job trains
        while True:
            _f.write(b"\\0" * (1 << 20))
'''


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(path) -> None:
    with contextlib.suppress(OSError), open(path, "wb") as f:  # until the disk is full
        while True:
            f.write(b"\0" * (1 << 20))


def config(repo, **extra):
    return resolve(repo, "full", {"baseline_runs": 1, "iterations": 1, "job_disk_mb": 0, "health_every": 0,
                                  "gate": "strict", "policy": False, **extra})


def test_a_disk_that_fills_during_training_stops_the_run_and_the_candidate_trains_again(small_disk, monkeypatch):
    repo = make_repo(small_disk / "r", FILL + FAKE_TRAIN)
    filler = small_disk / "neighbour.bin"
    monkeypatch.setenv("FILL_TO", str(filler))
    cfg = config(repo)
    with pytest.raises(DiskFull) as stopped:
        driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.5}]))
    message = str(stopped.value)
    assert "is full" in message and "free at least" in message and "harness run --resume --tag full" in message
    rows = ledger.read_rows(cfg.ledger_path)
    assert [r["status"] for r in rows] == ["keep"]  # no crash row blames the candidate
    assert list(cfg.run_dir.glob("inflight-*.json"))  # it is journalled for --resume
    filler.unlink()  # the user frees the space
    driver.run(config(repo), resume=True, researcher=ScriptedResearcher([]))
    rows = ledger.read_rows(cfg.ledger_path)
    assert [(r["iteration"], r["status"]) for r in rows] == [(0, "keep"), (1, "keep")], rows
    assert rows[1]["metric"] == 0.5


def test_a_disk_that_fills_between_iterations_stops_the_run_with_the_message(small_disk):
    repo = make_repo(small_disk / "r")
    filler = small_disk / "neighbour.bin"

    def neighbour_fills_the_disk(task) -> Proposal:
        fill(filler)
        path = task.worktree / "train.py"
        try:
            path.write_text(set_globals(path.read_text(), VALUE=0.5))
        except OSError:
            pass  # the researcher's own write may fail too: the harness still says what happened
        return Proposal("VALUE=0.5")
    cfg = config(repo)
    with pytest.raises(DiskFull) as stopped:
        driver.run(cfg, researcher=ScriptedResearcher([neighbour_fills_the_disk]))
    assert "is full" in str(stopped.value) and "--resume" in str(stopped.value)
    assert [r["status"] for r in ledger.read_rows(cfg.ledger_path)] == ["keep"]
    filler.unlink()
    driver.run(config(repo), resume=True, researcher=ScriptedResearcher([{"VALUE": 0.5}]))
    rows = ledger.read_rows(cfg.ledger_path)
    assert [r["status"] for r in rows][-1] == "keep" and rows[-1]["metric"] == 0.5
    assert len([r for r in rows if r["iteration"] == 1]) == 1  # one row for the iteration, no gap
