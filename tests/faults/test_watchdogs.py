"""Trainers and researchers that misbehave: each fault injected for real, the night goes on."""
from __future__ import annotations

from pathlib import Path

from harness.driver import loop as driver
from harness.config.load import resolve

from conftest import ScriptedResearcher, git
from fakes.helpers import harness, rows as ledger_rows
from fakes.openai_server import Fail, ScriptedServer, lower_value

from .conftest import agent_arg, alive, assert_recovered


def config(repo: Path, tag: str = "w", **overrides):
    overrides.setdefault("baseline_runs", 1)
    return resolve(repo, tag, overrides)


def test_trainers_that_hang_stall_crash_nan_or_leave_a_stubborn_child(repo: Path, tmp_path: Path, monkeypatch):
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_CHILD_PID_FILE", str(pid_file))
    chatty = "import time\nwhile True:\n    print('step', flush=True)\n    time.sleep(0.3)\n"
    script = [{"MODE": "hang"}, lambda task: _write(task, chatty, "busy forever"), {"MODE": "stubborn_child"},
              {"MODE": "crash"}, {"MODE": "nan"}, {"VALUE": 0.9}]
    cfg = config(repo, kill_after=4, stall_after_min=0.02, iterations=len(script), on_unhealthy="continue")
    driver.run(cfg, researcher=ScriptedResearcher(script))
    rows = assert_recovered(repo, "w", len(script))
    assert [r["status"] for r in rows] == ["keep", "timeout", "timeout", "timeout", "crash", "crash", "keep"]
    # silent: killed as stalled, before kill_after (the reason says which watchdog fired, whatever the load)
    assert "stall" in rows[1]["description"] and "kill_after" not in rows[1]["description"]
    # busy, but too long: not a stall, killed at the deadline, not before it (the upper bound only a wide margin)
    assert "kill_after" in rows[2]["description"] and "stall" not in rows[2]["description"]
    assert 4 <= rows[2]["train_s"] < 4 + 60
    assert "stall" in rows[3]["description"]
    assert "CUDA out of memory" in rows[4]["description"] and "not a finite number" in rows[5]["description"]
    child = int(pid_file.read_text())
    assert not alive(child), "the grandchild that ignored SIGTERM survived"


def _write(task, source, description):
    from harness.agents import Proposal
    (task.worktree / "train.py").write_text(source)
    return Proposal(description)


def test_a_researcher_that_hangs_is_killed_and_one_that_prints_garbage_is_survived(repo: Path, tmp_path: Path):
    harness(["run", "--repo", repo, "--tag", "h", "--agent", agent_arg(tmp_path, "hang"), "--iterations", 1,
             "--agent-timeout", 1, "--baseline-runs", 1])
    rows = ledger_rows(repo, "h")
    assert rows[1]["status"] == "crash" and "did not finish within 1s" in rows[1]["description"]
    assert rows[1]["agent_s"] < 10
    assert not alive(int((repo / "runs/h/agent.pid").read_text()))
    harness(["run", "--repo", repo, "--tag", "g", "--agent", agent_arg(tmp_path, "garbage"), "--iterations", 2,
             "--baseline-runs", 1])
    rows = assert_recovered(repo, "g", 2)
    assert [r["status"] for r in rows] == ["keep", "keep", "keep"]  # the edit counts; the noise is a description
    assert all("\t" not in (r["description"] or "") for r in rows)


def test_an_api_429_storm_stops_the_night_with_the_cause_then_resumes(repo: Path, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    with ScriptedServer(default=Fail(429, "Rate limit reached", "rate_limit_exceeded", "requests")) as server:
        args = ["run", "--repo", repo, "--tag", "api", "--agent", "openai", "--model", "gpt-5.4",
                "--base-url", server.url, "--max-retries", 1, "--baseline-runs", 1]
        result = harness(args + ["--iterations", 8], env={"OPENAI_API_KEY": "sk-test-0123456789"})
        assert "unhealthy: 5 failures in a row" in result.output and "429" in result.output
        rows = ledger_rows(repo, "api")
        assert [r["status"] for r in rows] == ["keep"] + ["crash"] * 5
        server.default = lower_value
        harness(args + ["--iterations", 7, "--resume"], env={"OPENAI_API_KEY": "sk-test-0123456789"})
    rows = assert_recovered(repo, "api", 7)
    assert [r["status"] for r in rows[6:]] == ["keep", "keep"]


def test_a_stale_index_lock_at_start_and_one_left_by_the_researcher(repo: Path, tmp_path: Path):
    harness(["run", "--repo", repo, "--tag", "l", "--agent", agent_arg(tmp_path, "lock"), "--iterations", 1,
             "--baseline-runs", 1])
    gitdir = Path(git(repo / "runs/l/worktree", "rev-parse", "--absolute-git-dir"))
    (gitdir / "index.lock").write_text("")  # a crash while git held the lock
    harness(["run", "--repo", repo, "--tag", "l", "--agent", agent_arg(tmp_path, "lock"), "--iterations", 3,
             "--resume"])
    rows = assert_recovered(repo, "l", 3)
    assert [r["status"] for r in rows] == ["keep"] * 4


def test_a_researcher_that_edits_or_deletes_the_ledger(repo: Path, tmp_path: Path):
    result = harness(["run", "--repo", repo, "--tag", "t", "--agent", agent_arg(tmp_path, "ledger"),
                      "--iterations", 3, "--baseline-runs", 1])
    rows = assert_recovered(repo, "t", 3)
    assert [r["status"] for r in rows] == ["keep"] * 4 and rows[0]["description"] == "baseline"
    run_dir = repo / "runs/t"
    kinds = [line for line in (run_dir / "events.log").read_text().splitlines() if "ledger_restored" in line]
    assert len(kinds) == 2 and "was changed" in kinds[0] and "was deleted" in kinds[1]
    assert "edited" in (run_dir / "results.tsv.tampered").read_text()
    assert "ledger_restored" in result.output


def test_a_researcher_that_amends_or_resets_the_branch(repo: Path, tmp_path: Path):
    harness(["run", "--repo", repo, "--tag", "b", "--agent", agent_arg(tmp_path, "git"), "--iterations", 3,
             "--baseline-runs", 1])
    rows = assert_recovered(repo, "b", 3)
    assert [r["status"] for r in rows] == ["keep", "invalid", "invalid", "keep"]
    assert "switched HEAD" in rows[1]["description"]  # the amend, in the lane's detached worktree
    assert "switched HEAD" in rows[2]["description"] or "moved the run branch" in rows[2]["description"]
    assert "elsewhere" not in git(repo, "branch", "--list")  # the branch it created is gone
    assert git(repo, "rev-parse", "main") == git(repo, "rev-parse", "autoresearch/b~1")
