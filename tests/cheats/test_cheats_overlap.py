"""A candidate that trains while the previous one is evaluated (issue 27) cannot reach it: not the
previous job's output folder (its saved model), not the evaluator's copy of the baseline's files
or its result folder, and the exported training split only read-only. The real bundled workload,
sandboxed, pipelined; the job reports every attempt in its log, and each must have failed.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness import ledger
from harness.driver import loop as driver
from harness.config.load import resolve
from harness.executors import sandbox

from conftest import ScriptedResearcher

from .conftest import MAX_STEPS, TIME_BUDGET_S, after_imports, code_cheat, edit_train, research_repo

pytestmark = pytest.mark.skipif(not sandbox.probe(sandbox.bwrap_path()).works,
                                reason="bubblewrap does not work on this machine (apt install bubblewrap)")
MARK = "OVERLAP-REPORT"
REACH = '''import glob, json, os
_run = RUN
_job = os.path.join(_run, "logs", "iter-0001.job")
_r = {}
for _name, _path in {"previous model": os.path.join(_job, "out", "model", "weights.safetensors"),
                     "previous output": os.path.join(_job, "out"),
                     "previous evaluator": os.path.join(_job, "evaluator", "prepare.py"),
                     "previous result": os.path.join(_job, "eval-out", "result.json"),
                     "previous eval tmp": os.path.join(_job, "eval-tmp")}.items():
    try:
        _r["read " + _name] = sorted(os.listdir(_path)) if os.path.isdir(_path) else len(open(_path, "rb").read())
    except OSError as e:
        _r["read " + _name] = e.errno
    try:
        with open(os.path.join(_path, "planted") if os.path.isdir(_path) else _path, "ab") as _f:
            _f.write(b"x")
        _r["write " + _name] = 0
    except OSError as e:
        _r["write " + _name] = e.errno
_data = os.environ["HARNESS_DATA_DIR"]
for _name in ("train.bin", "meta.json", "planted.bin"):
    try:
        with open(os.path.join(_data, _name), "ab") as _f:
            _f.write(b"x")
        _r["write export " + _name] = 0
    except OSError as e:
        _r["write export " + _name] = e.errno
_r["export readable"] = os.path.getsize(os.path.join(_data, "train.bin"))
_r["visible"] = sorted(glob.glob(os.path.join(_run, "**"), recursive=True))
print("MARK", json.dumps(_r), flush=True)
'''


def test_the_next_job_cannot_reach_the_previous_candidate_or_the_export(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    repo = research_repo(tmp_path_factory.mktemp("overlap"))
    tag = "overlap"
    cfg = resolve(repo, tag, {"time_budget": TIME_BUDGET_S, "max_steps": MAX_STEPS, "kill_after": 60,
                              "baseline_runs": 1, "iterations": 2, "policy": False, "pipeline": True,
                              "on_unhealthy": "continue", "gate": "strict", "health_every": 0,
                              "sandbox": "bwrap"})
    code = f"RUN = {str(cfg.run_dir)!r}\n" + REACH.replace("MARK", MARK)
    honest = lambda task: edit_train(task, "log less often", lambda s: s.replace("LOG_EVERY = 25", "LOG_EVERY = 26"))
    driver.run(cfg, researcher=ScriptedResearcher([honest, code_cheat("reach the previous candidate",
                                                                      after_imports, code)]))
    rows = ledger.read_rows(cfg.ledger_path)
    assert [r["iteration"] for r in rows] == [0, 1, 2], rows
    assert rows[1]["status"] in ("keep", "discard") and rows[1]["sealed"] == "yes", rows[1]  # scored untouched
    assert rows[2]["status"] != "keep", rows[2]
    log = Path(rows[2]["log"]) if os.path.isabs(rows[2]["log"]) else cfg.run_dir / rows[2]["log"]
    line = next(ln for ln in log.read_text().splitlines() if ln.startswith(MARK))
    report = json.loads(line[len(MARK):])
    for key, value in report.items():
        if key.startswith(("read ", "write ")):
            assert value in (2, 13, 30), (key, value, report)  # ENOENT, EACCES, EROFS: never done
    assert report["export readable"] > 0  # the training split is the job's to read
    assert not [p for p in report["visible"] if "iter-0001" in p or "eval" in Path(p).name], report["visible"]
    export = next(p for p in (cfg.run_dir / "train-data").iterdir() if (p / ".done").exists())
    assert not (export / "planted.bin").exists()
    assert json.loads((export / "meta.json").read_text())["train_sha256"]
