"""A shared GPU accuses no one (issue 23, item 3: GPU time where the driver reports it), through the
real driver: a GPU job past its wall limit is judged by the GPU time NVML accounts to it
(executors/gputime.py, budget.shared_gpu). The machine has no GPU, so what stands in is the
device node (launch.has_gpu) and the driver's library (tests/fakes/nvml.py, pynvml's calls);
the jobs, their process trees, the sampling and the verdicts are real.

Three candidates each run 3x the budget: one slowed by another process's kernels (its own GPU time
under the baseline's: not held against it), one that works 3x the budget on a GPU of its own (more
GPU time than the baseline: invalid), one that idles past the budget on an idle GPU (no one else
held the GPU: invalid)."""
from __future__ import annotations

import sys

import pytest

from harness.driver import loop as driver
from harness import ledger
from harness.agents import Proposal
from harness.config.load import resolve
from harness.executors import gputime, launch
from harness.integrity import budget

from conftest import ScriptedResearcher, make_repo, set_globals
from fakes.nvml import FakeNvml

TRAINER = '''import os, time
OVER = 1  # budgets this job "trains" (the GPU's work is the fake driver's to report)
time.sleep(float(os.environ["HARNESS_TIME_BUDGET"]) * OVER)
print("---")
print(f"val_bpb: {1.0 - OVER * 1e-3:.6f}")
print("training_seconds: 3.0")
'''
BUDGET_S = 3


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("gpu") / "research", TRAINER, kill_after=60)
    nvml = FakeNvml(own_sm=100, others_sm=0)  # the baseline: the GPU its own

    def slowed(task) -> Proposal:  # another user's job takes 80% of the SMs: this one runs 3x as long
        nvml.own_sm, nvml.others_sm = 20, 80
        (task.worktree / "train.py").write_text(set_globals((task.worktree / "train.py").read_text(), OVER=3))
        return Proposal("the same work on a shared GPU")

    def works_more(task) -> Proposal:  # the GPU its own again, kept busy 3x the budget
        nvml.own_sm, nvml.others_sm = 100, 0
        (task.worktree / "train.py").write_text(set_globals((task.worktree / "train.py").read_text(), OVER=3.01))
        return Proposal("train 3x the budget")

    def idles(task) -> Proposal:  # nothing runs on the GPU: the job waits past its budget
        nvml.own_sm, nvml.others_sm = 0, 0
        (task.worktree / "train.py").write_text(set_globals((task.worktree / "train.py").read_text(), OVER=3.02))
        return Proposal("sleep past the budget")

    cfg = resolve(repo, "gpu", {"time_budget": BUDGET_S, "kill_after": 60, "baseline_runs": 1, "iterations": 3,
                                "policy": False, "on_unhealthy": "continue", "health_every": 0, "gate": "strict"})
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "pynvml", nvml)
        mp.setattr(launch, "has_gpu", lambda visible: True)  # a device node this machine lacks
        driver.run(cfg, researcher=ScriptedResearcher([slowed, works_more, idles]))
    yield cfg, ledger.read_rows(cfg.ledger_path), nvml


def test_the_baseline_records_its_gpu_time(night):
    cfg, rows, nvml = night
    assert rows[0]["status"] == "keep"
    gpu_s = budget.read(cfg.run_dir)["gpu_s"]
    assert len(gpu_s) == 1 and 0.6 * BUDGET_S < gpu_s[0] < 2 * BUDGET_S  # busy while it ran, by NVML
    assert nvml.opened and nvml.shutdowns == nvml.inits  # every job's NVML session closed


def test_a_job_slowed_by_another_process_on_its_gpu_is_not_held_against_it(night):
    cfg, rows, _ = night
    assert rows[1]["status"] in ("keep", "discard"), rows[1]
    log = (cfg.run_dir / rows[1]["log"]).read_text()
    assert "the GPU was shared" in log and "raise --time-budget" in log, log[-2000:]


def test_a_job_that_works_past_its_budget_on_its_own_gpu_is_invalid(night):
    cfg, rows, _ = night
    assert rows[2]["status"] == "invalid", rows[2]
    log = (cfg.run_dir / rows[2]["log"]).read_text()
    assert "GPU-s against the baseline's" in log and "more work than the baseline did" in log, log[-2000:]


def test_a_job_that_idles_past_its_budget_is_invalid(night):
    cfg, rows, _ = night
    assert rows[3]["status"] == "invalid", rows[3]
    log = (cfg.run_dir / rows[3]["log"]).read_text()
    assert "other processes' kernels held its GPU only 0.0s" in log, log[-2000:]


def test_without_the_driver_a_gpu_job_is_judged_by_the_wall_clock_and_says_why():
    """The real pynvml on a machine without NVIDIA's driver: not measured, and the verdict names it."""
    sampler = gputime.GpuTime("0", lambda: set())
    assert sampler.gpu_s is None and "NVML is not available" in sampler.why
    sampler.close()
    usage = budget.Usage(gpu=True)
    verdict = budget.judge(20.0, 3, 2.0, 3.0, usage, baseline_gpu_s=3.0)
    assert not verdict.ok and "judged by the wall clock alone: the driver (NVML) reported no GPU time" in verdict.reason
