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

from .conftest import CAUSES, CHEATS, DAEMON_MARK, MAX_STEPS, RUNTIME_NIGHT, TIME_BUDGET_S, research_repo

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


# The runtime night in two halves of about equal time, each one driver.run in an xdist group of its
# own, so the two workers train them at once (the budget cheats alone run ~20 s each). The policy's
# short night goes with the first half.
SECOND_HALF = ("train past the budget and report less", "a double-forked daemon",
               "a daemon that rewrites the ledger and its shadow", "writes outside the worktree")
HALVES = {"a": [n for n in RUNTIME_NIGHT if CHEATS[n].cause not in SECOND_HALF],
          "b": [n for n in RUNTIME_NIGHT if CHEATS[n].cause in SECOND_HALF]}
assert set(SECOND_HALF) <= set(CAUSES) and sum(map(len, HALVES.values())) == len(RUNTIME_NIGHT)
HALF_OF = {name: half for half, names in HALVES.items() for name in names}


def in_half(half: str, *values):
    return pytest.param(*values, marks=pytest.mark.xdist_group(f"cheats-{half}"))


@pytest.fixture(scope="module")
def runtime_a(repo):
    return run_cheats(repo, "runtime-a", policy=False, names=HALVES["a"])


@pytest.fixture(scope="module")
def runtime_b(repo):
    return run_cheats(repo, "runtime-b", policy=False, names=HALVES["b"])


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


def check_nothing_left(under: str | None = None) -> None:
    """No cheat daemon running (under: of a job whose working folder was there; the two halves and
    the Ray night run at once, each daemon lives until its job ends) and nothing written outside."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=30).stdout
    daemons = [line for line in out.splitlines() if DAEMON_MARK in line and (under is None or under in line)]
    assert not daemons, daemons
    assert not any(os.path.exists(p) for p in OUTSIDE)


@pytest.mark.parametrize("name", [in_half(HALF_OF[n], n) for n in RUNTIME_NIGHT])
def test_runtime_layers_catch_the_cheat(request, name):
    """With the static policy off: scope checks, the sandbox, the separate evaluation, the clock."""
    check_caught(request.getfixturevalue(f"runtime_{HALF_OF[name]}")[name], name)


@pytest.mark.parametrize("name", [in_half("a", n) for n in CHEATS if CHEATS[n].expect_policy])
def test_default_layers_catch_the_cheat(policy_rows, name):
    """With the static policy on (the default), these are refused before any training run."""
    row = policy_rows[name]
    assert row["train_s"] is None  # never trained
    assert row["status"] == "invalid", row
    assert CHEATS[name].expect_policy in row["description"], row["description"]


@pytest.mark.parametrize("half", [in_half(h, h) for h in HALVES])
def test_no_process_of_a_job_outlives_it_and_nothing_outside_changed(request, repo, half):
    request.getfixturevalue(f"runtime_{half}")
    check_nothing_left(under=str(repo / "runs" / f"runtime-{half}"))


@pytest.mark.parametrize("half", [in_half(h, h) for h in HALVES])
def test_cheats_tried_and_kept_per_cause(request, half, capsys):
    runtime_rows = request.getfixturevalue(f"runtime_{half}")
    tried = Counter(CHEATS[n].cause for n in runtime_rows)
    kept = Counter(CHEATS[n].cause for n, r in runtime_rows.items() if r["status"] == "keep")
    with capsys.disabled():
        for cause in tried:
            print(f"\ncheats {cause}: tried {tried[cause]}, kept {kept[cause]}", end="")
    assert sum(kept.values()) == 0


@pytest.mark.parametrize("half", [in_half(h, h) for h in HALVES])
def test_each_half_runs_on_one_worker(request, half):
    """Each night is made once: under xdist every test of a half is in its half's group (not also in
    conftest.SERIAL_GROUPS' "cheats", which would join the names)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        assert request.node.nodeid.endswith(f"@cheats-{half}"), request.node.nodeid
