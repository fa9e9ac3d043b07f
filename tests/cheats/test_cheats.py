"""Every cheat ends `invalid` with its reason on the ledger; none is ever kept."""
from __future__ import annotations

import pytest

from harness import ledger, driver
from harness.config import resolve

from conftest import ScriptedResearcher, git

from .conftest import CHEATS, MAX_STEPS, TIME_BUDGET_S, research_repo


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    # one thread per training job: spinning OpenMP threads on a shared 2-core machine make
    # three CPU steps take seconds, and the cheats' budget is only a few seconds
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        yield research_repo(tmp_path_factory.mktemp("cheats"))


def run_cheats(repo, tag: str, policy: bool) -> dict[str, dict]:
    names = [n for n in CHEATS if not policy or CHEATS[n][1] != CHEATS[n][2]]
    cfg = resolve(repo, tag, {"time_budget": TIME_BUDGET_S, "max_steps": MAX_STEPS, "kill_after": 60,
                              "baseline_runs": 1, "iterations": len(names), "policy": policy,
                              "on_unhealthy": "continue"})
    driver.run(cfg, researcher=ScriptedResearcher([CHEATS[n][0] for n in names]))
    rows = ledger.read_rows(cfg.ledger_path)
    assert rows[0]["status"] == "keep" and rows[0]["sealed"] == "yes"  # the honest baseline is sealed
    wt = cfg.worktree
    assert git(wt, "rev-parse", "HEAD") == git(repo, "rev-parse", "main")  # nothing was ever kept
    assert git(wt, "status", "--porcelain", "--ignored") == ""
    assert git(repo, "status", "--porcelain") == ""  # the user's checkout and prepare.py untouched
    return {name: row for name, row in zip(names, rows[1:])}


@pytest.fixture(scope="module")
def runtime_rows(repo):
    return run_cheats(repo, "runtime", policy=False)


@pytest.fixture(scope="module")
def policy_rows(repo):
    return run_cheats(repo, "policy", policy=True)


@pytest.mark.parametrize("name", list(CHEATS))
def test_runtime_layers_catch_the_cheat(runtime_rows, name):
    """With the static policy off: scope checks, the seal, prepare's own checks and the budget."""
    row = runtime_rows[name]
    assert row["status"] == "invalid", row
    assert CHEATS[name][1] in row["description"], row["description"]


@pytest.mark.parametrize("name", [n for n in CHEATS if CHEATS[n][1] != CHEATS[n][2]])
def test_default_layers_catch_the_cheat(policy_rows, name):
    """With the static policy on (the default), these are refused before any training run;
    the others are caught as above whatever the policy says."""
    row = policy_rows[name]
    assert row["train_s"] is None  # never trained
    assert row["status"] == "invalid", row
    assert CHEATS[name][2] in row["description"], row["description"]
