"""The budget measured by the harness (executors/budget.py): calibration and the two messages."""
from __future__ import annotations

from harness.executors import budget


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
