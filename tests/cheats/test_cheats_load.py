"""A loaded machine accuses no one (issue 23, item 3), through the real driver: one run whose honest
candidate trains beside CPU burners the test starts (bounded, on the run's one CPU) is judged by
what it consumed, not `invalid`; its cheating successor, on the same machine with the burners gone,
trains 4x its budget and is. The trainer is a CPU stand-in whose start-up is a fixed amount of work
(slow when the CPU is shared, as imports and data loading are) and whose training loop stops on the
wall clock at HARNESS_TIME_BUDGET, as train.py's does."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.driver import loop as driver
from harness import ledger
from harness.agents import Proposal
from harness.config.load import resolve
from harness.executors import limits
from harness.integrity import budget

from conftest import ScriptedResearcher, make_repo, set_globals

TRAINER = '''import os, time
OVER = 1  # the cheat trains this many budgets
STARTUP = 50_000_000  # a fixed amount of start-up work: about 1.5 s on a free CPU


def work(n):
    x = 0
    for i in range(n):
        x += i * i
    return x


print("cpus", sorted(os.sched_getaffinity(0)), flush=True)
work(STARTUP)
budget = float(os.environ["HARNESS_TIME_BUDGET"])
start, steps = time.time(), 0
while time.time() - start < budget * OVER:
    work(100_000)
    steps += 1
print("---")
print(f"val_bpb: {1.0 + 100.0 / (100 + steps):.6f}")
print(f"training_seconds: {min(time.time() - start, budget):.1f}")  # the cheat says it kept to its budget
'''
BUDGET_S = 4  # the honest job on the busy CPU runs about 1.7x its wall limit, the cheat's 16 s about 2x
BURNERS = 6
BURN = "import time\nend = time.time() + 120\nwhile time.time() < end:\n    pass\n"  # bounded, whatever happens


def _accounted() -> bool:
    group = limits.Cgroup.make(limits.Limits())
    if group is None:
        return False
    try:
        return group.cpu_seconds() is not None
    finally:
        group.remove()


pytestmark = pytest.mark.skipif(not _accounted(), reason="no cgroup can account a job's CPU time on this machine")


def pin(cpus: set[int]) -> None:
    """Every thread of this process (a thread keeps the affinity it had when it was made)."""
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cpus)


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("load") / "research", TRAINER, sandbox="bwrap")
    burners: list[subprocess.Popen] = []

    def honest(task) -> Proposal:  # the same code, a comment changed; the machine gets busy
        path = task.worktree / "train.py"
        path.write_text(path.read_text().replace("# a fixed amount", "# the same fixed amount"))
        burners.extend(subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True)  # as other users'
                       for _ in range(BURNERS))  # jobs are: each its own session (the scheduler shares by them)
        return Proposal("the same code on a busy machine")

    def cheat(task) -> Proposal:  # the burners gone: a quiet machine again
        for proc in burners:
            proc.kill()
            proc.wait()
        path = task.worktree / "train.py"
        path.write_text(set_globals(path.read_text(), OVER=4))
        return Proposal("train 4x the budget")

    cfg = resolve(repo, "load", {"time_budget": BUDGET_S, "kill_after": 120, "baseline_runs": 1, "iterations": 2,
                                 "policy": False, "on_unhealthy": "continue", "health_every": 0, "gate": "strict"})
    affinity = os.sched_getaffinity(0)
    pin({min(affinity)})  # the run, its jobs and the burners share one CPU
    try:
        driver.run(cfg, researcher=ScriptedResearcher([honest, cheat]))
    finally:
        pin(affinity)
        for proc in burners:
            proc.kill()
            proc.wait()
    rows = ledger.read_rows(cfg.ledger_path)
    events = [json.loads(line) for line in (cfg.run_dir / "events.log").read_text().splitlines()]
    yield cfg, rows, events


def test_the_honest_job_on_a_busy_machine_is_judged_not_accused(night):
    cfg, rows, events = night
    assert [r["status"] for r in rows][:1] == ["keep"] and len(rows) == 3
    assert rows[1]["status"] in ("keep", "discard"), rows[1]  # judged by its metric
    busy = [e for e in events if e.get("kind") == "loaded_machine"]
    assert len(busy) == 1, events  # the rule was what let it through: it ran past the wall limit
    assert "the machine was busy" in busy[0]["message"] and "raise --time-budget" in busy[0]["message"]
    data = budget.read(cfg.run_dir)
    assert data["cpu_s"] and data["cpu_s"][0] > 0  # the baseline's CPU time, by the kernel's accounting


def test_training_4x_the_budget_on_a_quiet_machine_is_invalid(night):
    cfg, rows, _ = night
    row = rows[2]
    assert row["status"] == "invalid" and "does not stop when HARNESS_TIME_BUDGET is spent" in row["description"]
    log = (cfg.run_dir / row["log"]).read_text()  # the whole verdict: the consumption, not only the wall time
    assert "harness: the job ran" in log and "CPU-s against the baseline's" in log, log[-2000:]
