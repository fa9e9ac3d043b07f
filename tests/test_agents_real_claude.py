"""The real `claude` CLI, offline: a scripted Anthropic Messages server in a loopback-only namespace."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import git
from fakes.helpers import rows
from fakes.real_cli import Rig, netns  # noqa: F401,F811  (the fixture)


@pytest.fixture
def rig(netns, tmp_path: Path):  # noqa: F811
    rig = Rig("claude", netns, tmp_path)
    yield rig
    rig.close()


def run_args(rig: Rig, repo: Path, tag: str, *extra) -> list:
    return ["run", "--repo", repo, "--tag", tag, "--agent", "claude", "--model", "test-model",
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
    manifest = json.loads((repo / "runs" / "rl" / "run.json").read_text())["researcher"]
    assert (manifest["provider"], manifest["key_var"]) == ("anthropic", "ANTHROPIC_API_KEY")
    assert manifest["base_url_host"] == f"127.0.0.1:{rig.server.port}"
    assert rig.key not in (repo / "runs" / "rl" / "run.json").read_text()
    assert rig.leftovers() == []
    report = rig.harness("report", repo / "runs" / "rl")
    assert report.returncode == 0, report.stderr[-2000:]
    markdown = (repo / "runs" / "rl" / "report.md").read_text()
    assert "| cost from | table |" in markdown  # the report says where the cost came from


def test_claude_storm_and_hang_are_crashes_with_retries_and_unknown_tokens(repo: Path, rig: Rig):
    rig.server.script({"do": "status", "status": 429, "message": "rate limited", "times": 100})
    done = rig.harness(*run_args(rig, repo, "rs", "--iterations", 1, "--agent-timeout", 6))
    assert done.returncode == 0, done.stderr[-3000:]
    rig.server.script("edit_then_hang")
    done = rig.harness(*run_args(rig, repo, "rs", "--iterations", 2, "--agent-timeout", 6, "--resume"))
    assert done.returncode == 0, done.stderr[-3000:]
    ledger = rows(repo, "rs")
    assert [r["status"] for r in ledger] == ["keep", "crash", "crash"]
    storm, half = ledger[1:]
    assert storm["retries"] >= 1 and "429" in storm["description"]  # a storm, not a silent hang
    assert "did not finish within 6s" in half["description"]
    for row in (storm, half):
        assert row["input_tokens"] is None and row["output_tokens"] is None
    log = (repo / "runs" / "rs" / "logs" / "iter-0001-agent.log").read_text()
    assert '"api_retry"' in log
    assert "VALUE = 1.0" in git(repo, "show", "autoresearch/rs:train.py")
    assert rig.leftovers() == []


@pytest.mark.parametrize("status, says", [(529, "the server failed (5xx"), (429, "rate limited (429)")])
def test_check_names_the_class_of_claudes_529_and_429(repo: Path, rig: Rig, status: int, says: str):
    rig.server.script({"do": "status", "status": status, "message": "Overloaded", "times": 100})
    done = rig.harness("check", "--repo", repo, "--agent", "claude", "--model", "test-model",
                       "--base-url", rig.server.url(), "--agent-executable", rig.executable, "--agent-timeout", 6)
    assert done.returncode == 1
    assert says in done.stderr, done.stderr[-2000:]
