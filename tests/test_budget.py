"""The budget measured by the harness (integrity/budget.py): calibration and the two messages."""
from __future__ import annotations

from harness.integrity import budget


def test_calibration_takes_the_slowest_baseline_start_up(tmp_path):
    assert budget.allowance(tmp_path, "abc") is None  # nothing measured yet
    budget.calibrate(tmp_path, "abc", wall_s=14.0, reported_train_s=10.0, time_budget_s=10)
    allowance = budget.calibrate(tmp_path, "abc", wall_s=16.0, reported_train_s=10.0, time_budget_s=10)
    assert allowance == 6.0 * budget.ALLOWANCE_FACTOR + budget.ALLOWANCE_EXTRA_S
    assert budget.allowance(tmp_path, "abc") == allowance
    # a new baseline commit starts over
    assert budget.calibrate(tmp_path, "def", 11.0, 10.0, 10) == 1.0 * budget.ALLOWANCE_FACTOR + budget.ALLOWANCE_EXTRA_S
    # a workload that reports no training time: what ran past the budget is start-up
    assert budget.startup_s(13.0, None, 10) == 3.0 and budget.startup_s(4.0, None, 10) == 0.0


def test_within_the_budget_plus_slack_plus_allowance_is_fine():
    verdict = budget.judge(wall_s=314.0, time_budget_s=300, allowance_s=5.0, reported_train_s=300.0)
    assert verdict.ok and verdict.limit_s == 300 + 15 + 5


def test_a_slow_step_is_told_apart_from_code_that_ignores_the_budget():
    slow = budget.judge(wall_s=340.0, time_budget_s=300, allowance_s=5.0, reported_train_s=335.0)
    assert not slow.ok and "raise --time-budget" in slow.reason and "does not stop" not in slow.reason
    ignores = budget.judge(wall_s=905.0, time_budget_s=300, allowance_s=5.0, reported_train_s=290.0)
    assert not ignores.ok and "does not stop when HARNESS_TIME_BUDGET is spent" in ignores.reason
    assert "reported training_seconds 290.0, which the harness does not believe" in ignores.reason


def test_baseline_runs_on_several_slots_at_once_calibrate_one_file(tmp_path):
    import threading
    barrier = threading.Barrier(8)

    def one(i: int) -> None:
        barrier.wait()
        budget.calibrate(tmp_path, "abc", wall_s=10.0 + i, reported_train_s=10.0, time_budget_s=10)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = budget.read(tmp_path)
    assert sorted(data["startup_s"]) == [float(i) for i in range(8)]  # none lost, none failed
    assert not list(tmp_path.glob("*.tmp"))


# A job past the wall limit on a busy machine (issue 23, item 3): judged by what it consumed.
BUSY = dict(cpus=2, idle_cpus=0.05)


def test_an_honest_job_slowed_by_other_work_is_not_held_against_it():
    usage = budget.Usage(cpu_s=18.0, stall_s=40.0, **BUSY)  # less work than the baseline, long waits for a CPU
    verdict = budget.judge(60.0, 20, 5.0, 20.0, usage, baseline_cpu_s=40.0)
    assert verdict.ok and "the machine was busy" in verdict.reason and "raise --time-budget" in verdict.reason
    assert "3.0x slower" in verdict.reason  # 60 s of wall, its busiest thread waited 40 of them


def test_a_job_past_the_limit_is_still_invalid_when_the_load_does_not_explain_it():
    over = dict(wall_s=60.0, time_budget_s=20, allowance_s=5.0, reported_train_s=20.0, baseline_cpu_s=40.0)
    more_work = budget.judge(**over, usage=budget.Usage(cpu_s=80.0, stall_s=40.0, **BUSY))  # trained on
    assert not more_work.ok and "does not stop" in more_work.reason and "more work than the baseline" in more_work.reason
    idle = budget.judge(**over, usage=budget.Usage(cpu_s=18.0, stall_s=40.0, cpus=2, idle_cpus=1.0))  # pinned itself
    assert not idle.ok and "CPUs idle while it ran (1.00 of 2" in idle.reason
    slept = budget.judge(**over, usage=budget.Usage(cpu_s=18.0, stall_s=2.0, **BUSY))  # waited on purpose
    assert not slept.ok and "waited for a CPU less than the 34.0s it ran past the limit" in slept.reason
    gpu = budget.judge(**over, usage=budget.Usage(cpu_s=18.0, stall_s=40.0, gpu=True, **BUSY))
    assert not gpu.ok and "wall clock alone: the driver (NVML) reported no GPU time" in gpu.reason
    assert "By its GPU time" in gpu.reason  # a GPU job is never judged by its CPU time
    unaccounted = budget.judge(**over, usage=budget.Usage(stall_s=40.0, **BUSY))
    assert not unaccounted.ok and "no cgroup accounted its CPU time" in unaccounted.reason


def test_the_baseline_records_its_cpu_time_and_whether_the_machine_was_loaded(tmp_path):
    assert budget.baseline_cpu_s(tmp_path, "abc") is None
    budget.calibrate(tmp_path, "abc", 12.0, 10.0, 10, budget.Usage(cpu_s=11.0, cpus=2, idle_cpus=1.0))
    assert budget.baseline_cpu_s(tmp_path, "abc") == 11.0 and budget.read(tmp_path)["loaded"] is False
    budget.calibrate(tmp_path, "abc", 24.0, 10.0, 10, budget.Usage(cpu_s=13.0, cpus=2, idle_cpus=0.0))
    data = budget.read(tmp_path)
    assert budget.baseline_cpu_s(tmp_path, "abc") == 13.0 and data["loaded"] is True  # others used ~1.5 of 2 CPUs
    assert budget.baseline_cpu_s(tmp_path, "other") is None
