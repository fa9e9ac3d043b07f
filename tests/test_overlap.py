"""The evaluation overlaps the next job (issue 27): once a candidate's training process is over,
its slot trains the next candidate while a separate evaluator scores it; its row waits for that
evaluation only. Real git, the real driver, real subprocesses: a trainer and an evaluator that
leave marks on disk (their pids, "training of VALUE started", "the evaluation of VALUE saw the
next training start"), so every assertion is about states, never about how long anything took.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from harness import ledger
from harness.driver import loop as driver
from harness.config.load import resolve
from harness.executors import sandbox

from conftest import ScriptedResearcher, alive, git, make_repo

TRAIN = '''import os, pathlib, time
VALUE = 1.0  # the metric this candidate reports (lower is better)
MARKS = pathlib.Path(os.environ["OVERLAP_MARKS"])
(MARKS / f"train-pid-{VALUE}").write_text(str(os.getpid()))
(MARKS / f"train-start-{VALUE}").touch()
(MARKS / f"train-class-{VALUE}").write_text(str(os.sched_getscheduler(0)))
pathlib.Path(os.environ["HARNESS_OUTPUT_DIR"], "value").write_text(repr(VALUE))
print("---")
print(f"val_bpb: {VALUE}")
print("peak_vram_mb: 0")
'''
# The protected evaluator: for a candidate in NEXT it waits (at most WAIT_S) for the next
# candidate's training to start, and says on disk whether it saw it; `hang` in the marks folder
# keeps it running until the file goes, `fail` makes it fail.
EVALUATE = '''import json, os, pathlib, sys, time
MARKS = pathlib.Path(os.environ["OVERLAP_MARKS"])
NEXT = {2.0: 3.0}
WAIT_S = 30.0  # s; without the overlap the next training never starts meanwhile
value = float(pathlib.Path(os.environ["HARNESS_OUTPUT_DIR"], "value").read_text())
(MARKS / f"eval-pid-{value}").write_text(str(os.getpid()))
(MARKS / f"eval-class-{value}").write_text(str(os.sched_getscheduler(0)))
if value in NEXT:
    until = time.monotonic() + WAIT_S
    started = MARKS / f"train-start-{NEXT[value]}"
    while not started.exists() and time.monotonic() < until:
        time.sleep(0.05)
    (MARKS / f"eval-{value}-saw-next").write_text("yes" if started.exists() else "no")
    until = time.monotonic() + 60
    while (MARKS / "hang").exists() and time.monotonic() < until:
        time.sleep(0.05)
    if (MARKS / "fail").exists():
        sys.exit("the evaluation failed on purpose")
json.dump({"val_bpb": value}, open(os.environ["HARNESS_RESULT_FILE"], "w"))
'''


@pytest.fixture
def marks(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "marks"
    folder.mkdir()
    monkeypatch.setenv("OVERLAP_MARKS", str(folder))
    return folder


@pytest.fixture
def overlap_repo(tmp_path) -> Path:
    repo = make_repo(tmp_path / "research", TRAIN, extra=f'evaluate_command = "{sys.executable} prepare.py"\n')
    (repo / "prepare.py").write_text(EVALUATE)
    git(repo, "commit", "-qam", "the evaluator")
    return repo


def config(repo: Path, tag: str = "o", **overrides):
    overrides.setdefault("baseline_runs", 1)
    overrides.setdefault("gate", "strict")
    overrides.setdefault("pipeline", True)
    return resolve(repo, tag, overrides)


def rows_of(cfg) -> list[tuple[int, str, float | None]]:
    return [(r["iteration"], r["status"], r["metric"]) for r in ledger.read_rows(cfg.ledger_path)]


def test_the_next_candidate_trains_while_the_previous_one_is_evaluated(overlap_repo, marks):
    cfg = config(overlap_repo, iterations=2)
    order: list[int] = []
    driver.run(cfg, progress=lambda e, d: order.append(d["row"].iteration) if e == "row" else None,
               researcher=ScriptedResearcher([{"VALUE": 2.0}, {"VALUE": 3.0}]))
    # iteration 2's training started while iteration 1's evaluation was running
    assert (marks / "eval-2.0-saw-next").read_text() == "yes"
    # every evaluation in the idle scheduling class, every training in the normal one: the
    # evaluation beside a training job takes only what it leaves (scoring.idle_prefix)
    for value in (1.0, 2.0, 3.0):
        assert int((marks / f"eval-class-{value}").read_text()) == os.SCHED_IDLE
        assert int((marks / f"train-class-{value}").read_text()) == os.SCHED_OTHER
    # and each row is its own evaluation's figure, in iteration order
    assert rows_of(cfg) == [(0, "keep", 1.0), (1, "discard", 2.0), (2, "discard", 3.0)]
    assert order == [1, 2]
    assert all(r["sealed"] == "yes" for r in ledger.read_rows(cfg.ledger_path))
    assert not list((cfg.run_dir / "logs").glob("*.job"))  # every job's folders removed
    assert not list((cfg.run_dir / "procs").glob("*.json"))


def test_a_failing_evaluation_while_the_next_one_trains(overlap_repo, marks):
    (marks / "fail").touch()
    cfg = config(overlap_repo, iterations=2)
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 2.0}, {"VALUE": 3.0}]))
    assert (marks / "eval-2.0-saw-next").read_text() == "yes"
    rows = ledger.read_rows(cfg.ledger_path)
    assert [(r["iteration"], r["status"]) for r in rows] == [(0, "keep"), (1, "crash"), (2, "discard")]
    assert "failed on purpose" in rows[1]["description"] and rows[2]["metric"] == 3.0


def test_ctrl_c_during_an_overlapped_evaluation_then_resume(overlap_repo, marks):
    (marks / "hang").touch()
    cfg = config(overlap_repo, iterations=3)

    def interrupt_when_overlapped():
        until = time.monotonic() + 120
        while not (marks / "eval-2.0-saw-next").exists() and time.monotonic() < until:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=interrupt_when_overlapped, daemon=True).start()
    summary = driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 2.0}, {"VALUE": 3.0}, {"VALUE": 4.0}]))
    assert "interrupted" in summary.stopped
    assert (marks / "eval-2.0-saw-next").read_text() == "yes"
    # no process left: the hung evaluator, the trainers, nothing recorded as running
    pids = [int(p.read_text()) for p in marks.glob("*-pid-*")]
    assert pids and not [p for p in pids if alive(p)]
    assert not list((cfg.run_dir / "procs").glob("*.json"))
    # nothing was decided for 1 and 2: both wait in their journals
    assert [r[:2] for r in rows_of(cfg)] == [(0, "keep")]
    journaled = sorted(json.loads(p.read_text())["iteration"] for p in cfg.run_dir.glob("inflight*.json"))
    assert journaled == [1, 2]
    # --resume trains them first, then goes on: nothing lost, nothing doubled
    (marks / "hang").unlink()
    driver.run(cfg, resume=True, researcher=ScriptedResearcher([{"VALUE": 0.5}]))
    rows = rows_of(cfg)
    assert [r[:2] for r in rows] == [(0, "keep"), (1, "discard"), (2, "discard"), (3, "keep")]
    assert [r[2] for r in rows] == [1.0, 2.0, 3.0, 0.5]


EXPORT = '''import os, pathlib
pathlib.Path(os.environ["EXPORT_COUNT"]).open("a").write("exported\\n")
pathlib.Path(os.environ["HARNESS_OUTPUT_DIR"], "train.bin").write_bytes(b"the training split")
'''
TRAIN_ON_EXPORT = '''import os, pathlib
VALUE = 1.0
data = pathlib.Path(os.environ["HARNESS_DATA_DIR"], "train.bin").read_bytes()
assert data == b"the training split", data
pathlib.Path(os.environ["HARNESS_OUTPUT_DIR"], "value").write_text(repr(VALUE))
print("---")
print(f"val_bpb: {VALUE}")
'''
SCORE = '''import json, os, pathlib
value = float(pathlib.Path(os.environ["HARNESS_OUTPUT_DIR"], "value").read_text())
json.dump({"val_bpb": value}, open(os.environ["HARNESS_RESULT_FILE"], "w"))
'''


@pytest.mark.parametrize("gpus", [(), ("0", "1")])
def test_the_training_data_is_exported_once_per_baseline(tmp_path, monkeypatch, gpus):
    count = tmp_path / "exports.txt"
    monkeypatch.setenv("EXPORT_COUNT", str(count))
    repo = make_repo(tmp_path / "research", TRAIN_ON_EXPORT,
                     extra=f'evaluate_command = "{sys.executable} prepare.py"\n'
                           f'train_data_command = "{sys.executable} export.py"\n')
    (repo / "prepare.py").write_text(SCORE)
    (repo / "export.py").write_text(EXPORT)
    (repo / "harness.toml").write_text((repo / "harness.toml").read_text().replace(
        'protected = ["prepare.py"]', 'protected = ["prepare.py", "export.py"]'))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "an export")
    cfg = config(repo, iterations=4, gpus=gpus, baseline_runs=2)
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.9}, {"VALUE": 2.0}, {"VALUE": 0.8}, {"VALUE": 3.0}]))
    rows = ledger.read_rows(cfg.ledger_path)
    assert len([r for r in rows if r["train_s"]]) >= 4 and all(r["status"] != "crash" for r in rows), rows
    assert count.read_text() == "exported\n"  # once, for two baseline runs and the candidates
    exports = [p for p in (cfg.run_dir / "train-data").iterdir() if (p / ".done").exists()]
    assert len(exports) == 1
    assert json.loads((exports[0] / ".done").read_text())["baseline"].startswith(rows[0]["commit"])


# A protected evaluator that fails unless it runs in the idle scheduling class and cannot leave it
IDLE_SCORE = '''import json, os, pathlib, sys
if os.sched_getscheduler(0) != os.SCHED_IDLE:
    sys.exit(f"the evaluation ran in scheduling class {os.sched_getscheduler(0)}, not the idle one")
for policy in (os.SCHED_OTHER, os.SCHED_BATCH):
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except PermissionError:
        continue
    sys.exit(f"the evaluation left the idle class for {policy}")
value = float(pathlib.Path(os.environ["HARNESS_OUTPUT_DIR"], "value").read_text())
json.dump({"val_bpb": value}, open(os.environ["HARNESS_RESULT_FILE"], "w"))
'''
PLAIN_TRAIN = '''import os, pathlib
VALUE = 1.0
pathlib.Path(os.environ["HARNESS_OUTPUT_DIR"], "value").write_text(repr(VALUE))
print("---")
print(f"val_bpb: {VALUE}")
'''


@pytest.mark.skipif(not sandbox.probe(sandbox.bwrap_path()).works, reason="bubblewrap cannot run here")
def test_a_sandboxed_evaluation_runs_in_the_idle_class_and_cannot_leave_it(tmp_path):
    repo = make_repo(tmp_path / "research", PLAIN_TRAIN, sandbox="bwrap",
                     extra=f'evaluate_command = "{sys.executable} prepare.py"\n')
    (repo / "prepare.py").write_text(IDLE_SCORE)
    git(repo, "commit", "-qam", "the evaluator")
    cfg = config(repo, iterations=2)
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.5}, {"VALUE": 2.0}]))
    rows = ledger.read_rows(cfg.ledger_path)
    assert [(r["iteration"], r["status"], r["metric"]) for r in rows] == \
        [(0, "keep", 1.0), (1, "keep", 0.5), (2, "discard", 2.0)], [r["description"] for r in rows]
