"""The real `claude` CLI, offline: a scripted Anthropic Messages server in a loopback-only namespace."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import git, make_repo
from fakes.helpers import rows
from fakes.real_cli import Rig, assert_killed, fault_matrix, netns, run_through  # noqa: F401,F811  (the fixture)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A research repo whose researcher runs in its own sandbox (agents/sandboxed.py, where bwrap works)."""
    return make_repo(tmp_path / "research", agent_sandbox="auto")



@pytest.fixture
def rig(netns, tmp_path: Path):  # noqa: F811
    rig = Rig("claude", netns, tmp_path)
    yield rig
    rig.close()


def run_args(rig: Rig, repo: Path, tag: str, *extra, model: str = "test-model") -> list:
    return ["run", "--repo", repo, "--tag", tag, "--agent", "claude", "--model", model,
            "--base-url", rig.server.url(), "--agent-executable", rig.executable, "--no-pipeline", *extra]


def test_claude_edits_are_committed_and_the_price_table_wins_over_its_cost(repo: Path, rig: Rig, tmp_path: Path):
    prices = tmp_path / "prices.toml"  # a local model: free, whatever claude computes for itself
    prices.write_text('[models."test-model"]\ninput = 0.0\ncached_input = 0.0\noutput = 0.0\n')
    rig.server.script({"do": "edit", "input_tokens": 3000, "cached_tokens": 1000, "output_tokens": 70},
                      {"do": "edit", "input_tokens": 4000, "cached_tokens": 0, "output_tokens": 20})
    done = rig.harness(*run_args(rig, repo, "rl", "--iterations", 2, "--agent-timeout", 60, "--prices", prices))
    assert done.returncode == 0, done.stderr[-3000:]
    ledger = rows(repo, "rl")
    assert [r["status"] for r in ledger] == ["keep", "keep", "keep"]
    assert [r["description"] for r in ledger[1:]] == ["lower VALUE to 0.9", "lower VALUE to 0.8"]
    assert "VALUE = 0.8" in git(repo, "show", "autoresearch/rl:train.py")
    # Read, Edit, the answer, and the side request that names the session: all on the ledger.
    assert [(r["input_tokens"], r["cached_tokens"], r["output_tokens"]) for r in ledger[1:]] == [
        (3 * 3000 + 11, 3 * 1000, 3 * 70 + 3), (3 * 4000 + 11, 0, 3 * 20 + 3)]
    reported = rig.server.reported()
    assert sum(r["input_tokens"] for r in ledger[1:]) == reported["input_tokens"]
    assert sum(r["output_tokens"] for r in ledger[1:]) == reported["output_tokens"]
    row = ledger[1]
    log = (repo / "runs" / "rl" / "logs" / "iter-0001-agent.log").read_text()
    assert row["cost_usd"] == 0.0  # claude's own total_cost_usd is in its log, not on the ledger
    assert '"total_cost_usd"' in log
    differs = [json.loads(line) for line in (repo / "runs" / "rl" / "events.log").read_text().splitlines()
               if '"cost_differs"' in line]  # and both figures are in the run's events
    assert [(e["iteration"], e["table_usd"]) for e in differs] == [(1, 0.0), (2, 0.0)]
    assert all(e["researcher_usd"] > 0 for e in differs)
    manifest = json.loads((repo / "runs" / "rl" / "run.json").read_text())["researcher"]
    assert (manifest["provider"], manifest["key_var"]) == ("anthropic", "ANTHROPIC_API_KEY")
    assert manifest["base_url_host"] == f"127.0.0.1:{rig.server.port}"
    assert rig.key not in (repo / "runs" / "rl" / "run.json").read_text()
    assert rig.leftovers() == []
    # claude looks up api.anthropic.com although ANTHROPIC_BASE_URL points at our server: recorded,
    # answered NXDOMAIN and never connected to; nothing else was tried.
    assert rig.lookups() == {"api.anthropic.com"}
    report = rig.harness("report", repo / "runs" / "rl")
    assert report.returncode == 0, report.stderr[-2000:]
    markdown = (repo / "runs" / "rl" / "report.md").read_text()
    assert "| cost from | table |" in markdown  # the report says where the cost came from


def test_claude_faults_cost_one_row_each_and_leave_nothing_running(repo: Path, rig: Rig):
    storm, overloaded, hang, garbage, half, good = run_through(
        rig, repo, "rf", run_args(rig, repo, "rf", "--agent-timeout", 6),
        fault_matrix("rate limited", 529, "Overloaded"))
    # claude retries a 429 and a 529 itself (10 times, backing off) until it is killed: a storm, not a hang.
    assert storm["retries"] >= 1 and "still retrying: 429" in storm["description"]
    assert overloaded["retries"] >= 1 and "still retrying: 529" in overloaded["description"]
    assert_killed([storm, overloaded, hang, half], 6)
    assert "no JSON result" not in hang["description"]  # killed while waiting: no error of claude's own
    # A 200 with garbage: claude asks once more (no api_retry event for it, so 0 retries), then gives up
    # by itself; it reports the one request that did answer, the side request naming the session.
    assert "malformed response (HTTP 200)" in garbage["description"] and garbage["retries"] == 0
    assert (garbage["input_tokens"], garbage["output_tokens"]) == (11, 3)
    assert sum(1 for r in rig.server.requests() if r["behaviour"] == "garbage") == 2
    assert (good["input_tokens"], good["output_tokens"]) == (3 * 1000 + 11, 3 * 10 + 3)
    assert "VALUE = 0.9" in git(repo, "show", "autoresearch/rf:train.py")  # the half edit was not kept
    log = (repo / "runs" / "rf" / "logs" / "iter-0001-agent.log").read_text()
    assert log.count('"api_retry"') == storm["retries"]  # the whole stream is in the agent log
    assert rig.leftovers() == []
    rig.lookups()


@pytest.mark.parametrize("fault, says", [
    ({"do": "status", "status": 429, "message": "rate limited", "call": True}, "rate limited (429)"),
    ({"do": "status", "status": 529, "message": "Overloaded", "call": True}, "the server failed (5xx"),
    ("hang", "no answer within the time limit"),
    ({"do": "garbage", "call": True}, "was not the API's format"),
    ("edit_then_hang", "no answer within the time limit"),
], ids=["429", "529", "hang", "garbage", "edit_then_hang"])
def test_check_names_the_class_of_each_claude_fault(repo: Path, rig: Rig, fault, says: str):
    rig.server.script(fault)
    done = rig.harness("check", "--repo", repo, "--agent", "claude", "--model", "test-model",
                       "--base-url", rig.server.url(), "--agent-executable", rig.executable, "--agent-timeout", 5)
    assert done.returncode == 1
    assert says in done.stderr, done.stderr[-2000:]
    assert rig.leftovers() == []
    rig.lookups()


def test_claude_cache_writes_are_priced_as_billed(repo: Path, rig: Rig):
    # Each of claude's three requests (Read, Edit, the answer) sends 3000 input tokens: 1000 read from
    # the cache, 1500 written to it (500 of them for an hour), 500 plain; and gets 70 out.
    rig.server.script({"do": "edit", "input_tokens": 3000, "cached_tokens": 1000, "cache_write_tokens": 1500,
                       "cache_write_1h_tokens": 500, "output_tokens": 70})
    done = rig.harness(*run_args(rig, repo, "rw", "--iterations", 1, "--agent-timeout", 60, model="claude-sonnet-4-5"))
    assert done.returncode == 0, done.stderr[-3000:]
    row = rows(repo, "rw")[-1]
    assert (row["status"], row["input_tokens"], row["cached_tokens"], row["output_tokens"]) == (
        "keep", 3 * 3000 + 11, 3 * 1000, 3 * 70 + 3)
    # Sonnet 4.5 per 1M tokens: $3 plain input, $0.30 a cache read, $3.75 a 5-minute write, $6 a 1-hour
    # write, $15 output; the side request's 11 + 3 tokens are plain.
    billed = (3 * (500 * 3 + 1000 * 0.30 + 1000 * 3.75 + 500 * 6 + 70 * 15) + 11 * 3 + 3 * 15) / 1e6
    assert row["cost_usd"] == pytest.approx(billed, rel=1e-9)
    log = (repo / "runs" / "rw" / "logs" / "iter-0001-agent.log").read_text()
    own = json.loads(log[log.index('{"type":"result"'):].splitlines()[0])["total_cost_usd"]
    assert own == pytest.approx(billed, rel=1e-9)  # the table's figure is claude's own bill
    events = repo / "runs" / "rw" / "events.log"
    assert "cost_differs" not in (events.read_text() if events.exists() else "")  # nothing to tell apart
    rig.lookups()


def test_claude_that_says_it_edited_but_changed_nothing_is_its_failure(repo: Path, rig: Rig):
    # Its Edit's old text is not in train.py (the tool answers with an error), yet its answer says it
    # lowered the constant: a crash with claude's own words, not the researcher's choice of nothing.
    rig.server.script({"do": "edit", "stale": True, "input_tokens": 1000, "cached_tokens": 0, "output_tokens": 10})
    done = rig.harness(*run_args(rig, repo, "rs", "--iterations", 1, "--agent-timeout", 60))
    assert done.returncode == 0, done.stderr[-3000:]
    row = rows(repo, "rs")[-1]
    assert row["status"] == "crash", row
    assert "claude changed nothing: its Edit of train.py failed" in row["description"], row
    assert "its last message: lower VALUE to 0.9" in row["description"], row
    assert rig.leftovers() == []
    rig.lookups()
