"""Every cheat ends without `keep`, its reason on the ledger when it is caught by name; the branch
never moves, no forged figure reaches the ledger, nothing outside the worktree changes, and no
process of a job outlives it."""
from __future__ import annotations

import os
import site
import subprocess
from collections import Counter

import pytest

from harness import ledger
from harness.driver import loop as driver
from harness.config.load import resolve

from conftest import ScriptedResearcher, git

from .conftest import CHEATS, DAEMON_MARK, MAX_STEPS, TIME_BUDGET_S, research_repo

OUTSIDE = [os.path.join(site.getsitepackages()[0], "zz_cheat.pth"),
           os.path.expanduser("~/.cache/autoresearch-harness/cheat.txt")]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    # one thread per training job: spinning OpenMP threads on a shared 2-core machine make
    # three CPU steps take seconds, and the cheats' budget is only a few seconds
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        yield research_repo(tmp_path_factory.mktemp("cheats"))


def run_cheats(repo, tag: str, policy: bool, names: list[str] | None = None,
               settings: dict | None = None) -> dict[str, dict]:
    """The cheats (all, or names) through one driver.run; settings: more of the run's (the executor)."""
    names = names or [n for n in CHEATS if not policy or CHEATS[n].expect_policy]
    cfg = resolve(repo, tag, {"time_budget": TIME_BUDGET_S, "max_steps": MAX_STEPS, "kill_after": 60,
                              "baseline_runs": 1, "iterations": len(names), "policy": policy,
                              "on_unhealthy": "continue", "gate": "strict",
                              "health_every": 0, **(settings or {})})
    driver.run(cfg, researcher=ScriptedResearcher([CHEATS[n].step for n in names]))
    rows = ledger.read_rows(cfg.ledger_path)
    assert rows[0]["status"] == "keep" and rows[0]["sealed"] == "yes"  # the baseline, by the separate evaluation
    assert len(rows) == len(names) + 1
    wt = cfg.worktree
    assert git(wt, "rev-parse", "HEAD") == git(repo, "rev-parse", "main")  # nothing was ever kept
    assert git(repo, "rev-parse", cfg.branch) == git(repo, "rev-parse", "main")
    assert git(wt, "status", "--porcelain", "--ignored") == ""
    assert git(repo, "status", "--porcelain") == ""  # the user's checkout and prepare.py untouched
    text = cfg.ledger_path.read_text()
    assert "FORGED-BY-DAEMON" not in text and "CHEATED" not in text
    return {name: row for name, row in zip(names, rows[1:])}


@pytest.fixture(scope="module")
def runtime_rows(repo):
    return run_cheats(repo, "runtime", policy=False)


@pytest.fixture(scope="module")
def policy_rows(repo):
    return run_cheats(repo, "policy", policy=True)


def check_caught(row: dict, name: str) -> None:
    assert row["status"] not in ("keep", "repeat"), row
    cheat = CHEATS[name]
    if cheat.expect:
        assert cheat.expect in row["description"], row["description"]
    if row["metric"] is not None:  # what the evaluation measured, never a figure the job made up
        assert row["metric"] > 1.0 and row["sealed"] == "yes", row


def check_nothing_left() -> None:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=30).stdout
    assert DAEMON_MARK not in out
    assert not any(os.path.exists(p) for p in OUTSIDE)


@pytest.mark.parametrize("name", list(CHEATS))
def test_runtime_layers_catch_the_cheat(runtime_rows, name):
    """With the static policy off: scope checks, the sandbox, the separate evaluation, the clock."""
    check_caught(runtime_rows[name], name)


@pytest.mark.parametrize("name", [n for n in CHEATS if CHEATS[n].expect_policy])
def test_default_layers_catch_the_cheat(policy_rows, name):
    """With the static policy on (the default), these are refused before any training run."""
    row = policy_rows[name]
    assert row["train_s"] is None  # never trained
    assert row["status"] == "invalid", row
    assert CHEATS[name].expect_policy in row["description"], row["description"]


def test_no_process_of_a_job_outlives_it_and_nothing_outside_changed(runtime_rows):
    check_nothing_left()


def test_cheats_tried_and_kept_per_cause(runtime_rows, capsys):
    tried = Counter(CHEATS[n].cause for n in runtime_rows)
    kept = Counter(CHEATS[n].cause for n, r in runtime_rows.items() if r["status"] == "keep")
    with capsys.disabled():
        for cause in tried:
            print(f"\ncheats {cause}: tried {tried[cause]}, kept {kept[cause]}", end="")
    assert sum(kept.values()) == 0


def test_the_module_runs_on_one_worker(request):
    """Its runs are made once (conftest.SERIAL_GROUPS): under xdist every test here is in one group."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        assert request.node.nodeid.endswith("@cheats"), request.node.nodeid
