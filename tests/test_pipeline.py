"""Pipelining with the fake trainer, scripted researchers and real git: the next candidate is
proposed while the current one trains, and is rebased (or thrown away, on a record) when the
current one is kept. HEAD of the run branch is always the best; nothing is lost or doubled."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from harness import ledger
from harness.driver import loop as driver, pipeline
from harness.agents import Proposal
from harness.config.load import resolve

from conftest import ScriptedResearcher, git, make_repo, set_globals

KNOBS_TRAIN = (Path(__file__).parent / "knobs_train.py").read_text()


def config(repo: Path, tag: str = "p", **overrides):
    overrides.setdefault("baseline_runs", 1)
    overrides.setdefault("gate", "strict")
    overrides.setdefault("pipeline", True)
    return resolve(repo, tag, overrides)


def head_watch(cfg):
    """A progress callback asserting, at every row, that the run branch's HEAD is the best."""
    seen = []

    def progress(event, data):
        if event == "row":
            best = ledger.best_row(ledger.read_rows(cfg.ledger_path))
            head = git(cfg.repo, "rev-parse", cfg.branch)
            assert head.startswith(best["commit"]), (head, best)
            seen.append(data["row"].iteration)
    return progress, seen


def check_run(repo: Path, cfg, waiting: int = 0) -> list[dict]:
    """Invariants every run must keep; returns the ledger rows. waiting: journals of committed
    candidates an interruption left for the next --resume to train."""
    rows = ledger.read_rows(cfg.ledger_path)
    primary = [r for r in rows if r["status"] != "repeat"]
    iterations = [r["iteration"] for r in primary]
    assert len(iterations) == len(set(iterations)), iterations  # nothing doubled
    kept = [r for r in rows if r["status"] == "keep"]
    base = kept[0]["commit"]
    branch = git(repo, "rev-list", "--reverse", f"{base}..{cfg.branch}").split()
    assert [c[:12] for c in branch] == [r["commit"] for r in kept[1:]]  # the branch = the kept commits
    for before, after in zip(kept, kept[1:]):  # each keep was evaluated on the best before it
        assert after["parent"] == before["commit"]
        assert after["best_before"] == pytest.approx(ledger.decided_value(before))
    assert git(repo, "rev-parse", cfg.branch).startswith(kept[-1]["commit"])
    assert git(cfg.worktree, "rev-parse", "HEAD").startswith(kept[-1]["commit"])
    assert git(cfg.worktree, "status", "--porcelain") == ""
    assert len(list(cfg.run_dir.glob("inflight*.json"))) == waiting
    return rows


def watching(step, seen: list):
    """Wrap a scripted step: record how many ledger rows existed when it was proposed."""
    def run(task):
        seen.append(len(ledger.read_rows(task.log_path.parent.parent / "results.tsv")))
        train = task.worktree / "train.py"
        if callable(step):
            return step(task)
        train.write_text(set_globals(train.read_text(), **step))
        return Proposal(", ".join(f"{k}={v}" for k, v in step.items()))
    return run


def test_discarded_then_next(repo: Path):
    cfg = config(repo, iterations=2)
    rows_at_call: list[int] = []
    researcher = ScriptedResearcher([watching({"VALUE": 1.2, "SLEEP_S": 0.8}, rows_at_call),
                                     watching({"VALUE": 0.9}, rows_at_call)])
    progress, seen = head_watch(cfg)
    summary = driver.run(cfg, progress=progress, researcher=researcher)
    rows = check_run(repo, cfg)
    assert [(r["iteration"], r["status"]) for r in rows] == [(0, "keep"), (1, "discard"), (2, "keep")]
    assert rows_at_call[1:] == [1]  # 2 was proposed while 1 was still training (1: while the baseline did)
    assert "iteration 1 (VALUE=1.2, SLEEP_S=0.8) is still training" in researcher.calls[1].prompt
    assert rows[2]["parent"] == rows[0]["commit"] == rows[1]["parent"]  # the right parent: 1 was discarded
    assert "rebased" not in rows[2]["description"]
    assert [r["lane"] for r in rows] == [None, 0, 0]
    assert seen == [1, 2] and summary.best_value == pytest.approx(0.9)
    assert researcher.calls[1].worktree != researcher.calls[0].worktree  # the second worktree


def test_kept_then_rebase_applies(tmp_path: Path):
    repo = make_repo(tmp_path / "r", KNOBS_TRAIN)
    cfg = config(repo, iterations=2)
    researcher = ScriptedResearcher([{"A": 0.1, "SLEEP_S": 0.8}, {"B": 0.2}])
    progress, _ = head_watch(cfg)
    driver.run(cfg, progress=progress, researcher=researcher)
    rows = check_run(repo, cfg)
    assert [(r["iteration"], r["status"]) for r in rows] == [(0, "keep"), (1, "keep"), (2, "keep")]
    assert [r["metric"] for r in rows] == pytest.approx([1.0, 0.9, 0.7])
    c1 = rows[1]["commit"]
    assert rows[2]["parent"] == c1 and f"rebased onto {c1}" in rows[2]["description"]
    assert rows[2]["best_before"] == pytest.approx(0.9)  # compared with the best at decision time
    head = git(repo, "show", f"{cfg.branch}:train.py")
    assert "A = 0.1" in head and "B = 0.2" in head
    assert git(repo, "rev-parse", f"{cfg.branch}~1").startswith(c1)


def test_kept_then_conflict_is_recorded_and_a_fresh_proposal_made(repo: Path):
    cfg = config(repo, iterations=3)
    researcher = ScriptedResearcher([{"VALUE": 0.9, "SLEEP_S": 0.8}, {"VALUE": 0.8}, {"VALUE": 0.85}])
    progress, _ = head_watch(cfg)
    driver.run(cfg, progress=progress, researcher=researcher)
    rows = check_run(repo, cfg)
    assert [(r["iteration"], r["status"]) for r in rows] == [(0, "keep"), (1, "keep"), (2, "invalid"), (3, "keep")]
    base, c1 = rows[0]["commit"], rows[1]["commit"]
    assert rows[2]["parent"] == base and rows[2]["train_s"] is None
    assert f"conflicts with the new best {c1} after rebase: train.py" in rows[2]["description"]
    assert rows[3]["parent"] == c1 and rows[3]["metric"] == pytest.approx(0.85)
    assert len(researcher.calls) == 3 and "still training" not in researcher.calls[2].prompt


def _edit(task, value):
    train = task.worktree / "train.py"
    train.write_text(set_globals(train.read_text(), VALUE=value))


def interrupt_then_propose(task):
    """Ctrl-C arrives while this proposal is still being written: it must not be committed."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(1.0)
    _edit(task, 0.7)
    return Proposal("late proposal")


def propose_then_interrupt(task):
    """The proposal is done (and committed, waiting for the GPU) when Ctrl-C arrives."""
    _edit(task, 0.7)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    return Proposal("waiting proposal")


def held_candidate(flag: Path):
    """VALUE 0.9, whose job trains while flag exists (120 s at most): still training at the Ctrl-C."""
    def step(task):
        train = task.worktree / "train.py"
        source = set_globals(train.read_text(), VALUE=0.9).replace("time.sleep(SLEEP_S)\n", (
            f"_held = time.monotonic()\nwhile os.path.exists({str(flag)!r}) and time.monotonic() - _held < 120:\n"
            "    time.sleep(0.05)\nprint('released', flush=True)\n"))
        train.write_text(source)
        return Proposal("VALUE=0.9, held")
    return step


@pytest.mark.parametrize("second, waiting", [(interrupt_then_propose, [1]), (propose_then_interrupt, [1, 2])])
def test_ctrl_c_with_a_proposal_in_flight_then_resume(repo: Path, tmp_path: Path, second, waiting):
    cfg = config(repo, iterations=4, time_budget=200)  # the held job is within its budget
    hold = tmp_path / "hold"
    hold.touch()
    t0 = time.monotonic()
    summary = driver.run(cfg, researcher=ScriptedResearcher([held_candidate(hold), second]))
    assert time.monotonic() - t0 < 60  # the held training job (120 s) was killed, not waited for
    assert "interrupted" in summary.stopped
    # Nothing was decided: the committed candidates wait in their journals for --resume to train
    # them. The late proposal was never committed; what it spent is on a `stopped` row of its own.
    late = second is interrupt_then_propose
    rows = check_run(repo, cfg, waiting=len(waiting))
    assert [(r["iteration"], r["status"]) for r in rows] == [(0, "keep")] + ([(2, "stopped")] if late else [])
    if late:
        assert rows[1]["agent_s"] >= 1.0 and rows[1]["train_s"] is None and rows[1]["kind"] == "stopped"
        assert "late proposal" in rows[1]["description"] and "never trained" in rows[1]["description"]
    journaled = sorted(json.loads(p.read_text())["iteration"] for p in cfg.run_dir.glob("inflight*.json"))
    assert journaled == waiting
    for path in (cfg.run_dir / "lanes").iterdir():
        assert "late proposal" not in git(path, "log", "-1", "--format=%s")
    # --resume trains them first, then goes on: the numbering continues, nothing is recorded twice.
    hold.unlink()
    summary = driver.run(cfg, resume=True, researcher=ScriptedResearcher([{"VALUE": 0.8}, {"VALUE": 0.95}, {"VALUE": 0.6}]))
    rows = check_run(repo, cfg)
    by_iter = {r["iteration"]: r for r in rows}
    assert sorted(by_iter) == list(range(5 + late))  # --iterations 4 experiments, and the stopped call
    assert by_iter[1]["status"] == "keep" and by_iter[1]["metric"] == pytest.approx(0.9)
    assert "released" in (cfg.run_dir / by_iter[1]["log"]).read_text()  # the held job, trained to its end
    if len(waiting) == 2:  # the waiting 0.7 was proposed on the baseline and edits the line 0.9 edited
        assert by_iter[2]["status"] == "invalid" and "after rebase" in by_iter[2]["description"]
    # 0.8 is kept; 0.95, proposed on the old best meanwhile, edits the same line: a recorded conflict.
    fresh = [by_iter[i]["status"] for i in range(len(waiting) + 1 + late, 5 + late)]
    assert fresh == ["keep", "invalid", "keep"][: len(fresh)]
    assert summary.best_value < 0.9


def test_pipeline_default_is_on_for_remote_researchers_only(repo: Path):
    on = {agent: pipeline.pipeline_default(resolve(repo, "d", {"agent": agent}))[0]
          for agent in ("mutate", "openai", "codex", "claude", "cmd:echo {prompt_file}")}
    assert on == {"mutate": False, "openai": True, "codex": True, "claude": True, "cmd:echo {prompt_file}": False}
    local = resolve(repo, "d", {"agent": "openai", "agent_options": {"base_url": "http://127.0.0.1:8000/v1"}})
    assert pipeline.pipeline_default(local)[0] is False
    assert pipeline.pipelined(resolve(repo, "d", {"agent": "mutate", "pipeline": True}))


def test_slot_worktrees_coming_back_to_a_newer_parent_are_not_mistaken_for_cheats(repo: Path):
    """Each slot's detached worktree is still at its previous candidate when its next proposal
    starts: going back to the parent is the harness's move, never the researcher's."""
    cfg = config(repo, iterations=6)
    script = [{"VALUE": round(1.0 + i / 100, 2), "SLEEP_S": 0.2} for i in range(1, 7)]
    driver.run(cfg, researcher=ScriptedResearcher(script))
    rows = check_run(repo, cfg)
    assert [r["status"] for r in rows] == ["keep"] + ["discard"] * 6, [r["description"] for r in rows]


def test_the_first_proposal_is_made_while_the_baseline_trains(repo: Path):
    """Pipelined, iteration 1 is proposed on the baseline commit while the baseline trains."""
    cfg = config(repo, iterations=1)
    seen: list[tuple[bool, int]] = []

    def first(task):
        procs = cfg.run_dir / "procs"
        until = time.monotonic() + 60
        training = False
        while time.monotonic() < until and not training:  # the baseline's job is on disk, running
            training = any("iter-0000" in p.read_text() for p in procs.glob("*.json") if p.stat().st_size)
            time.sleep(0.02)
        seen.append((training, len(ledger.read_rows(cfg.ledger_path))))
        train = task.worktree / "train.py"
        train.write_text(set_globals(train.read_text(), VALUE=0.9))
        return Proposal("VALUE=0.9")

    (repo / "train.py").write_text(set_globals((repo / "train.py").read_text(), SLEEP_S=1.0))
    git(repo, "commit", "-qam", "a baseline that takes a while")
    driver.run(cfg, researcher=ScriptedResearcher([first]))
    assert seen == [(True, 0)]  # proposed during the baseline's training, before its row
    rows = check_run(repo, cfg)
    assert [(r["iteration"], r["status"]) for r in rows] == [(0, "keep"), (1, "keep")]
    assert rows[1]["parent"] == rows[0]["commit"] and rows[1]["best_before"] == pytest.approx(1.0)
