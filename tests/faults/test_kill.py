"""SIGKILL of the supervisor at every phase of an iteration, for real, then `--resume`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.ledger import events

from .conftest import agent_arg, alive, assert_recovered, harness_run, slow_repo

ITERATIONS = 3


@pytest.mark.parametrize("fault", ["after_propose", "after_commit", "during_train:2", "after_train",
                                   "mid_ledger_write:2"])
def test_sigkill_at_each_phase_then_resume(tmp_path: Path, fault: str):
    repo = slow_repo(tmp_path / "r")
    args = ("--agent", agent_arg(tmp_path), "--iterations", str(ITERATIONS))
    killed = harness_run(repo, "k", *args, fault=fault)
    assert killed.returncode == -9, killed.stderr
    run_dir = repo / "runs" / "k"
    if fault.startswith("mid_ledger_write"):
        assert not (run_dir / "results.tsv").read_bytes().endswith(b"\n")  # really torn
    resumed = harness_run(repo, "k", *args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    rows = assert_recovered(repo, "k", ITERATIONS)
    first = rows[1]
    phase = fault.split(":")[0]
    if phase in ("after_commit", "during_train", "after_train"):
        # committed, never judged: trained on resume, once, with the proposal's spend on its row
        assert first["status"] in ("keep", "discard") and "interrupted" not in first["description"]
        assert first["train_s"] > 0 and first["agent_s"] is not None
        assert sum(1 for r in rows if r["iteration"] == 1 and r["status"] != "repeat") == 1
    elif phase == "mid_ledger_write":
        # the row was half written: the torn line was cut off and the row completed from the harness's copy
        assert first["status"] == "keep" and "interrupted" not in first["description"]
        kinds = [e["kind"] for e in events.read(run_dir)[0]]
        assert "ledger_repaired" in kinds and "ledger_restored" in kinds
        assert (run_dir / "results.tsv.torn").exists()
    else:  # after_propose: nothing was committed; the iteration simply runs again
        assert first["status"] == "keep"


def test_sigkill_during_the_researcher_then_resume(tmp_path: Path):
    """The researcher itself kills the supervisor and stays behind; the resume stops it."""
    repo = slow_repo(tmp_path / "r", sleep_s=0.0)
    killed = harness_run(repo, "k", "--agent", agent_arg(tmp_path, "kill_parent"), "--iterations", "2")
    assert killed.returncode == -9, killed.stderr
    orphan = int((repo / "runs/k/agent.pid").read_text())
    assert alive(orphan)
    resumed = harness_run(repo, "k", "--agent", agent_arg(tmp_path, "kill_parent"), "--iterations", "2", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert not alive(orphan)
    assert "orphan_killed" in resumed.stderr
    rows = assert_recovered(repo, "k", 2)
    assert [r["status"] for r in rows] == ["keep", "keep", "keep"]
    assert json.loads((repo / "runs/k/run.json").read_text())["agent"] == "cmd"
