"""A candidate's way from the driver to its row (benchmarks/walk.py, every call of a real night
recorded): the driver is entered once, at the top, and nothing below it calls back up; the way
passes the architecture's parts, not more."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import walk  # noqa: E402

# The parts a candidate passes: the driver, its researcher (agents), the executor, the checks
# (integrity), the ledger, the run's lifecycle (stops, supervision), the workload's contract, the
# tracker's job variables, the settings, and git (the gitgate package).
PARTS = {"driver", "agents", "executors", "integrity", "ledger", "lifecycle", "workload", "track",
         "config", "gitgate"}
ABOVE = {"driver", "agents"}  # what decides and what proposes: nothing below them calls them
GIT = {"gitgate", "gitgate/plain", "errors"}


def test_a_candidate_enters_the_driver_once_and_nothing_below_calls_back_up(tmp_path: Path):
    w = walk.walk(tmp_path)
    # the whole way was seen: proposed, checked, committed, trained, judged and written
    for module in ("driver/step", "integrity/policy", "gitgate", "executors/evaluation", "workload/runner",
                   "driver/judge", "ledger"):
        assert module in w.modules, sorted(w.modules)
    assert w.driver_entries == 0, [m for m in w.moves if m[1].startswith("driver/")
                                   and not m[0].startswith("driver/")]
    climbs = [m for m in w.moves
              if m[1].split("/")[0] in ABOVE and m[0].split("/")[0] not in {"driver", m[1].split("/")[0]}]
    assert climbs == [], climbs
    git_out = [m for m in w.moves if m[0] in GIT and m[1] not in GIT]
    assert git_out == [], git_out
    assert set(w.packages) <= PARTS, sorted(set(w.packages) - PARTS)
