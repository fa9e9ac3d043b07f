"""End to end on real temporary git repos with the fake trainer: every status, git invariants, resume."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from harness import ledger
from harness.driver import loop as driver
from harness.agents import Proposal
from harness.config.load import resolve
from harness.errors import RepoError
from harness.gitgate import GitGate
from harness.driver.step import Context

from conftest import ScriptedResearcher, git


def config(repo: Path, tag: str = "t1", **overrides):
    overrides.setdefault("baseline_runs", 1)  # the fake trainer is deterministic: no noise to measure
    return resolve(repo, tag, overrides)


def branch_commits(repo: Path, cfg) -> list[str]:
    base = json.loads((cfg.run_dir / "run.json").read_text())["baseline_commit"]
    return git(repo, "rev-list", "--reverse", f"{base}..{cfg.branch}").split()


def write_file(name: str, text: str):
    def step(task):
        (task.worktree / name).write_text(text)
        return Proposal(f"write {name}")
    return step


def test_every_status_and_git_invariants(repo: Path):
    script = [
        {"VALUE": 0.9},                      # keep
        {"VALUE": 1.2},                      # discard
        {"MODE": "crash"},                   # crash: exception, exit 1
        {"MODE": "nan"},                     # crash: NaN metric
        {"MODE": "hang"},                    # timeout: killed at kill_after
        write_file("notes.txt", "hi"),       # invalid: out of scope
        {},                                  # invalid: no change
        write_file("train.py", "def broken(:\n"),  # crash in preflight, no training
        {"VALUE": 1.2},                      # skip: already evaluated
        {"VALUE": 0.8},                      # keep
        write_file("prepare.py", "EVAL_BYTES = 1\n"),  # invalid: protected file
        RuntimeError("researcher bug"),      # crash: the researcher itself failed
    ]
    # six failures in a row (iterations 3-8) would stop the run at a health check
    cfg = config(repo, kill_after=3, iterations=len(script), on_unhealthy="continue")
    researcher = ScriptedResearcher(script)
    heads = []

    def progress(event, data):
        if event == "row":
            heads.append((git(cfg.worktree, "rev-parse", "HEAD"), data["row"]))

    summary = driver.run(cfg, progress=progress, researcher=researcher)
    rows = ledger.read_rows(cfg.ledger_path)
    statuses = [r["status"] for r in rows]
    assert statuses == ["keep", "keep", "discard", "crash", "crash", "timeout", "invalid", "invalid",
                        "crash", "skip", "keep", "invalid", "crash"]
    assert len(rows) == len(script) + 1
    assert rows[0]["description"] == "baseline" and rows[0]["iteration"] == 0
    assert [r["iteration"] for r in rows] == list(range(len(script) + 1))
    # After every iteration the worktree's HEAD is the best commit so far.
    best = rows[0]["commit"]
    for head, row in heads:
        if row.status == "keep":
            best = row.commit
        assert head.startswith(best[:12])
    # The branch holds exactly the kept commits, in order.
    kept = [r["commit"] for r in rows[1:] if r["status"] == "keep"]
    assert [c[:12] for c in branch_commits(repo, cfg)] == kept
    assert summary.best_value == pytest.approx(0.8)
    assert summary.counts["keep"] == 2
    # The user's checkout is untouched.
    assert git(repo, "status", "--porcelain") == ""
    assert "VALUE = 1.0" in (repo / "train.py").read_text()
    # Reasons are on the ledger, and the timeout was killed at kill_after.
    by_iter = {r["iteration"]: r for r in rows}
    assert "outside the editable set: notes.txt" in by_iter[6]["description"]
    assert "no change" in by_iter[7]["description"]
    assert "syntax error" in by_iter[8]["description"] and by_iter[8]["train_s"] is None
    assert "protected file" in by_iter[11]["description"] or "prepare.py" in by_iter[11]["description"]
    assert "researcher bug" in by_iter[12]["description"]
    # the hang was killed by the deadline (its reason), not before it; the upper bound is only a wide margin
    assert "kill_after" in by_iter[5]["description"], by_iter[5]["description"]
    assert 3 <= by_iter[5]["train_s"] < 3 + 60
    assert by_iter[1]["delta"] == pytest.approx(-0.1) and by_iter[1]["memory_gb"] == pytest.approx(2.0)
    assert (cfg.run_dir / by_iter[3]["log"]).read_text().count("CUDA out of memory") >= 1
    # The last failing log reaches the next prompt.
    assert "CUDA out of memory" in researcher.calls[3].prompt
    assert (repo / "results.tsv").resolve() == cfg.ledger_path.resolve()


def test_commit_trailers_and_manifest(repo: Path):
    cfg = config(repo, iterations=1)
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.5}]))
    message = git(cfg.worktree, "log", "-1", "--format=%B")
    assert message.startswith("VALUE=0.5")
    assert "Harness-Run: t1" in message and "Harness-Iteration: 1" in message
    manifest = json.loads((cfg.run_dir / "run.json").read_text())
    assert manifest["baseline_commit"] == git(repo, "rev-parse", "HEAD")
    assert manifest["config"]["time_budget"] == 5 and manifest["agent"] == "scripted"
    assert len(manifest["program_sha256"]) == 64 and manifest["python"]


def test_keep_ties(repo: Path):
    strict = config(repo, "strict", iterations=1)
    driver.run(strict, researcher=ScriptedResearcher([{"VALUE": 1.0, "SLEEP_S": 0.01}]))
    assert ledger.read_rows(strict.ledger_path)[1]["status"] == "discard"
    ties = config(repo, "ties", iterations=1, keep_ties=True)
    driver.run(ties, researcher=ScriptedResearcher([{"VALUE": 1.0, "SLEEP_S": 0.01}]))
    assert ledger.read_rows(ties.ledger_path)[1]["status"] == "keep"


def test_ctrl_c_in_researcher_then_resume(repo: Path):
    cfg = config(repo, iterations=4)
    summary = driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.9}, KeyboardInterrupt()]))
    assert "interrupted" in summary.stopped
    rows = ledger.read_rows(cfg.ledger_path)
    assert [r["status"] for r in rows] == ["keep", "keep"]
    assert git(cfg.worktree, "rev-parse", "HEAD").startswith(rows[1]["commit"])
    assert git(cfg.worktree, "status", "--porcelain") == ""
    # Resume continues the numbering and the best.
    driver.run(cfg, resume=True, researcher=ScriptedResearcher([{"VALUE": 0.95}, {"VALUE": 0.7}, {"VALUE": 0.6}]))
    rows = ledger.read_rows(cfg.ledger_path)
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["status"] for r in rows] == ["keep", "keep", "discard", "keep", "keep"]
    assert rows[2]["best_before"] == pytest.approx(0.9)


def interrupted_candidate(cfg, value: str, sleep_s: float = 0.0, **journal) -> str:
    """What a supervisor killed while training leaves behind: a committed candidate and its journal."""
    wt = cfg.worktree
    text = re.sub(r"^VALUE = \S+", f"VALUE = {value}", (wt / "train.py").read_text(), flags=re.M)
    (wt / "train.py").write_text(re.sub(r"^SLEEP_S = \S+", f"SLEEP_S = {sleep_s}", text, flags=re.M))
    git(wt, "add", "train.py")
    git(wt, "commit", "-q", "-m", "candidate in flight")
    inflight = git(wt, "rev-parse", "HEAD")
    (cfg.run_dir / "inflight.json").write_text(json.dumps({
        "iteration": 2, "parent": git(wt, "rev-parse", "HEAD~1"), "started_at": "2026-01-01T00:00:00Z",
        "phase": "train", "commit": inflight, "description": f"VALUE={value}", "agent_s": 12.5,
        "input_tokens": 1000, "cached_tokens": 0, "output_tokens": 200, "cost_usd": 0.0123, **journal}))
    return inflight


def test_interrupted_candidate_is_trained_on_resume(repo: Path):
    """A supervisor killed during training leaves a journal; resume trains the candidate once."""
    cfg = config(repo, iterations=3)
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.9}]), steps=1)
    inflight = interrupted_candidate(cfg, "0.1")
    driver.run(cfg, resume=True, researcher=ScriptedResearcher([{"VALUE": 0.85}]))
    rows = ledger.read_rows(cfg.ledger_path)
    assert [(r["iteration"], r["status"]) for r in rows] == [(0, "keep"), (1, "keep"), (2, "keep"), (3, "discard")]
    resumed = rows[2]
    assert resumed["commit"] == inflight[:12] and resumed["metric"] == pytest.approx(0.1)
    # The proposal's spend, from the journal, is on its row: nothing it cost is lost.
    assert (resumed["input_tokens"], resumed["output_tokens"], resumed["cost_usd"]) == (1000, 200, 0.0123)
    assert resumed["agent_s"] == 12.5 and resumed["train_s"] > 0
    assert rows[3]["best_before"] == pytest.approx(0.1)
    assert inflight[:12] in [c[:12] for c in branch_commits(repo, cfg)]
    assert not list(cfg.run_dir.glob("inflight*.json"))


@pytest.mark.parametrize("case", ["interrupted twice", "commit gone", "conflicts with the new best"])
def test_an_interrupted_candidate_that_cannot_be_trained_is_recorded_once(repo: Path, case: str):
    cfg = config(repo, iterations=3)
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.9}]), steps=1)
    base = json.loads((cfg.run_dir / "run.json").read_text())["baseline_commit"]
    extra = {"interrupted twice": {"attempts": 1}, "commit gone": {"commit": "f" * 40},
             "conflicts with the new best": {"parent": base}}[case]  # both changed the VALUE line
    inflight = interrupted_candidate(cfg, "0.1", **extra)
    driver.run(cfg, resume=True, researcher=ScriptedResearcher([{"VALUE": 0.85}]))
    rows = ledger.read_rows(cfg.ledger_path)
    status = "invalid" if case.startswith("conflicts") else "crash"
    assert [(r["iteration"], r["status"]) for r in rows] == [(0, "keep"), (1, "keep"), (2, status), (3, "keep")]
    assert ("after rebase" if status == "invalid" else "interrupted") in rows[2]["description"]
    assert rows[2]["cost_usd"] == 0.0123 and rows[2]["input_tokens"] == 1000 and rows[2]["train_s"] is None
    assert inflight[:12] not in [c[:12] for c in branch_commits(repo, cfg)]
    assert rows[3]["parent"] == rows[1]["commit"]
    assert git(cfg.worktree, "status", "--porcelain") == ""


def test_killed_while_training_a_resumed_candidate_records_it_once(repo: Path):
    """Killed during the resume's own training of a lane's candidate: both journals are left
    (the loop's counts the attempt); the next resume records that candidate once, as a crash."""
    cfg = config(repo, iterations=3)
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.9}]), steps=1)
    interrupted_candidate(cfg, "0.1", attempts=1)
    lane_journal = json.loads((cfg.run_dir / "inflight.json").read_text())
    (cfg.run_dir / "inflight-0a.json").write_text(json.dumps({**lane_journal, "attempts": 0, "lane": 0}))
    driver.run(cfg, resume=True, researcher=ScriptedResearcher([{"VALUE": 0.85}]))
    rows = ledger.read_rows(cfg.ledger_path)
    assert [(r["iteration"], r["status"]) for r in rows] == [(0, "keep"), (1, "keep"), (2, "crash"), (3, "keep")]
    assert "interrupted again" in rows[2]["description"]
    assert not list(cfg.run_dir.glob("inflight*.json"))


def test_ctrl_c_while_the_resume_trains_a_waiting_candidate_keeps_it_waiting(repo: Path):
    """The user's Ctrl-C is no crash: the candidate waits for the next --resume again."""
    cfg = config(repo, iterations=2, time_budget=60, kill_after=120)  # the 15 s job is within its budget
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.9}]), steps=1)
    inflight = interrupted_candidate(cfg, "0.1", sleep_s=15.0)
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    summary = driver.run(cfg, resume=True, researcher=ScriptedResearcher([]))
    assert time.monotonic() - t0 < 11  # its 15 s training was killed, not waited for (10 s for the stop)
    assert "1 committed candidate will be trained first" in summary.stopped
    assert len(ledger.read_rows(cfg.ledger_path)) == 2
    assert json.loads((cfg.run_dir / "inflight.json").read_text()).get("attempts", 0) == 0
    assert git(cfg.worktree, "status", "--porcelain") == ""
    driver.run(cfg, resume=True, researcher=ScriptedResearcher([]))
    rows = ledger.read_rows(cfg.ledger_path)
    assert [(r["iteration"], r["status"]) for r in rows] == [(0, "keep"), (1, "keep"), (2, "keep")]
    assert rows[2]["commit"] == inflight[:12]


def test_an_interrupted_candidate_on_an_older_best_is_moved_onto_the_best(repo: Path):
    """Two were in flight: the first was kept on resume, so the second is merged onto it, then trained."""
    cfg = config(repo, iterations=2)
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.9}]), steps=1)
    base = json.loads((cfg.run_dir / "run.json").read_text())["baseline_commit"]
    wt = cfg.worktree
    git(wt, "checkout", "-q", "--detach", base)  # the second proposal, made on the baseline
    (wt / "train.py").write_text((wt / "train.py").read_text() + "# a change on another line\n")
    git(wt, "commit", "-q", "-am", "second proposal")
    second = git(wt, "rev-parse", "HEAD")
    git(wt, "checkout", "-q", cfg.branch)
    (cfg.run_dir / "inflight-0b.json").write_text(json.dumps({
        "iteration": 2, "parent": base, "started_at": "2026-01-01T00:00:00Z", "phase": "train",
        "commit": second, "description": "a comment", "lane": 0, "input_tokens": 10, "output_tokens": 5}))
    driver.run(cfg, resume=True, researcher=ScriptedResearcher([]))
    rows = ledger.read_rows(cfg.ledger_path)
    assert [(r["iteration"], r["status"]) for r in rows] == [(0, "keep"), (1, "keep"), (2, "discard")]
    moved = rows[2]
    assert moved["parent"] == rows[1]["commit"] and "rebased onto" in moved["description"]
    assert moved["metric"] == pytest.approx(0.9) and moved["input_tokens"] == 10  # the best's VALUE, merged
    assert f"Harness-Rebased-From: {second}" in git(repo, "log", "-1", "--format=%B", moved["commit"])
    assert not list(cfg.run_dir.glob("inflight*.json"))


def test_hours_deadline_never_starts_an_iteration_that_cannot_finish(repo: Path):
    source = (repo / "train.py").read_text().replace("SLEEP_S = 0.0", "SLEEP_S = 1.5")
    (repo / "train.py").write_text(source)
    git(repo, "commit", "-qam", "slower")
    cfg = config(repo, hours=4.0 / 3600)  # four seconds
    summary = driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.9}] * 10))
    rows = ledger.read_rows(cfg.ledger_path)
    assert "hours" in summary.stopped
    assert 1 <= len(rows) <= 3
    total = sum(r["wall_s"] for r in rows)
    assert total < 4.0 + 1.0


def test_budget_stops_with_a_budget_row(repo: Path):
    def expensive(task):
        train = task.worktree / "train.py"
        text = train.read_text()
        value = float(text.split("VALUE = ")[1].split()[0]) - 0.01
        train.write_text(text.replace(text.split("VALUE = ")[1].split()[0], repr(value), 1))
        from harness.agents import Usage
        return Proposal(f"VALUE {value}", Usage(1000, 0, 100, cost_usd=0.4))

    cfg = config(repo, iterations=10, max_cost=1.0)
    summary = driver.run(cfg, researcher=ScriptedResearcher([expensive] * 10))
    rows = ledger.read_rows(cfg.ledger_path)
    assert [r["status"] for r in rows] == ["keep", "keep", "keep", "budget"]
    assert sum(r["cost_usd"] or 0 for r in rows) <= 1.0
    assert "max-cost" in rows[-1]["description"] and "max-cost" in summary.stopped


def test_a_torn_manifest_is_a_clear_error_and_nothing_is_touched(repo: Path):
    cfg = config(repo, iterations=1)
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.9}]))
    rows = ledger.read_rows(cfg.ledger_path)
    (cfg.run_dir / "run.json").write_text('{"harness_version": "0.1.0", "tag": ')  # a write cut short
    with pytest.raises(RepoError, match="run.json is unreadable"):
        driver.run(dataclasses.replace(cfg, iterations=2), resume=True, researcher=ScriptedResearcher([{}]))
    assert ledger.read_rows(cfg.ledger_path) == rows


def test_a_journal_commit_that_is_gone_is_told_from_a_transient_git_error(repo: Path, monkeypatch):
    """The candidate whose commit git no longer has is recorded; a passing git failure (a lock,
    too many open files) is raised, so the candidate waits for the next --resume instead."""
    import git as gitpython

    from harness.lifecycle import runs
    cfg = config(repo, iterations=1)
    driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.9}]))
    ctx = Context(cfg, GitGate(repo).worktree(cfg.worktree), ScriptedResearcher([]), "")
    assert runs.existing_commit(ctx, "0" * 40) == ""
    assert runs.existing_commit(ctx, "HEAD") == git(cfg.worktree, "rev-parse", "HEAD")

    def busy(rev):
        raise gitpython.GitCommandError(["git", "rev-parse"], 128, b"fatal: Unable to create '.git/index.lock': File exists.")
    monkeypatch.setattr(ctx.wt, "resolve", busy)
    with pytest.raises(gitpython.GitCommandError):
        runs.existing_commit(ctx, "HEAD")


def git_children() -> list[str]:
    """This process's live git children (GitPython's persistent cat-file processes), with their directory."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            cwd = os.readlink(f"/proc/{entry}/cwd")
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and cmd.startswith("git"):
            found.append(f"{cmd} in {cwd}")
    return found


@pytest.mark.parametrize("overrides", [{}, {"pipeline": True}, {"gpus": ("0", "1")}],
                         ids=["one lane", "pipelined", "two lanes"])
def test_a_finished_run_leaves_no_git_process(repo: Path, overrides: dict):
    """Each worktree's GitPython processes are closed with the run, not at some garbage collection
    after it: a supervisor that exits straight after must not leave them to the checker."""
    import gc
    cfg = config(repo, iterations=3, **overrides)
    gc.disable()  # what a process that exits at once sees: nothing collected in between
    try:
        driver.run(cfg, researcher=ScriptedResearcher([{"VALUE": 0.9}, {"VALUE": 0.8}, {"VALUE": 0.7}]))
        assert git_children() == []
    finally:
        gc.enable()
