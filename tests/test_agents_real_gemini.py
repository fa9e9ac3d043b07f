"""The real `gemini` CLI, offline: a scripted streamGenerateContent server in a loopback-only namespace."""
from __future__ import annotations

import json
import re
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
    """gemini with no settings file of the user's: --base-url and GEMINI_API_KEY are all it gets."""
    rig = Rig("gemini", netns, tmp_path)
    yield rig
    rig.close()


def run_args(rig: Rig, repo: Path, tag: str, *extra) -> list:
    return ["run", "--repo", repo, "--tag", tag, "--agent", "gemini", "--model", "test-model",
            "--base-url", rig.server.url(), "--agent-executable", rig.executable, "--no-pipeline", *extra]


def test_gemini_edits_are_committed_with_the_servers_tokens(repo: Path, rig: Rig):
    rig.server.script({"do": "edit", "input_tokens": 3000, "cached_tokens": 1000, "output_tokens": 70},
                      {"do": "edit", "input_tokens": 2000, "cached_tokens": 0, "output_tokens": 20})
    done = rig.harness(*run_args(rig, repo, "rg", "--iterations", 2, "--agent-timeout", 60))
    assert done.returncode == 0, done.stderr[-3000:]
    ledger = rows(repo, "rg")
    assert [r["status"] for r in ledger] == ["keep", "keep", "keep"]
    assert [r["description"] for r in ledger[1:]] == ["lower VALUE to 0.9", "lower VALUE to 0.8"]
    assert "VALUE = 0.8" in git(repo, "show", "autoresearch/rg:train.py")
    # The server's usage of both requests of a call (the replace call, then the answer); nothing on the side.
    assert [(r["input_tokens"], r["cached_tokens"], r["output_tokens"]) for r in ledger[1:]] == [
        (6000, 2000, 140), (4000, 0, 40)]
    assert sum(r["input_tokens"] for r in ledger[1:]) == rig.server.reported()["input_tokens"]
    manifest = json.loads((repo / "runs" / "rg" / "run.json").read_text())["researcher"]
    assert (manifest["provider"], manifest["key_var"]) == ("gemini", "GEMINI_API_KEY")
    # No price for test-model, and gemini reports no cost of its own: unknown, not "researcher".
    assert manifest["cost_source"] == "unknown" and ledger[1]["cost_usd"] is None
    assert manifest["base_url_host"] == f"127.0.0.1:{rig.server.port}"
    assert rig.key not in (repo / "runs" / "rg" / "run.json").read_text()
    assert rig.leftovers() == []
    # gemini looks up its usage statistics' host although its base URL is ours: recorded, answered
    # NXDOMAIN and never connected to; nothing else was tried.
    assert rig.lookups() == {"play.googleapis.com"}


@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_check_with_a_base_url_needs_no_settings_of_the_users(repo: Path, rig: Rig, sandbox: str):
    # gemini 0.61 alone refuses a base URL without an auth type in its settings ("Invalid auth method
    # selected"); a user signed in with Google has another one there. The harness names the API key's.
    (rig.home / ".gemini").mkdir()
    (rig.home / ".gemini" / "settings.json").write_text(json.dumps(
        {"security": {"auth": {"selectedType": "oauth-personal"}}, "ui": {"theme": "Default"}}))
    rig.server.script({"do": "edit", "input_tokens": 3000, "cached_tokens": 1000, "output_tokens": 70})
    done = rig.harness("check", "--repo", repo, "--agent", "gemini", "--model", "test-model", "--agent-sandbox",
                       sandbox, "--base-url", rig.server.url(), "--agent-executable", rig.executable,
                       "--agent-timeout", 30)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "input 6000 (cached 2000), output 140 per call" in done.stdout, done.stdout
    assert "edit      train.py: lower VALUE to 0.9" in done.stdout
    assert json.loads((rig.home / ".gemini" / "settings.json").read_text())["security"]["auth"] == {
        "selectedType": "oauth-personal"}  # the user's file is left as it was
    assert rig.leftovers() == []
    rig.lookups()


def test_a_gemini_model_needs_no_agent_and_is_priced(repo: Path, rig: Rig):
    # gemini-2.5-flash is in models.toml's [backends] and price table: --model alone picks gemini.
    rig.server.script({"do": "edit", "input_tokens": 3000, "cached_tokens": 1000, "output_tokens": 70})
    done = rig.harness("run", "--repo", repo, "--tag", "rp", "--model", "gemini-2.5-flash", "--base-url",
                       rig.server.url(), "--agent-executable", rig.executable, "--no-pipeline", "--iterations", 1,
                       "--agent-timeout", 60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "researcher gemini" in done.stderr
    row = rows(repo, "rp")[-1]
    assert (row["status"], row["agent"], row["model"]) == ("keep", "gemini", "gemini-2.5-flash")
    # 4000 uncached at $0.30, 2000 cached at $0.03, 140 output at $2.50 per 1M tokens.
    assert row["cost_usd"] == pytest.approx((4000 * 0.30 + 2000 * 0.03 + 140 * 2.50) / 1e6)
    manifest = json.loads((repo / "runs" / "rp" / "run.json").read_text())["researcher"]
    assert manifest["cost_source"] == "table"
    rig.lookups()


def test_gemini_faults_cost_one_row_each_with_unknown_tokens(repo: Path, rig: Rig):
    storm, internal, hang, garbage, half, good = run_through(
        rig, repo, "rh", run_args(rig, repo, "rh", "--agent-timeout", 8),
        fault_matrix("Resource exhausted", 500, "Internal error"))
    # gemini retries a 429 and a 500 itself, backing off, until it is killed: its retries are counted.
    assert storm["retries"] >= 1 and "status 429" in storm["description"]
    assert internal["retries"] >= 1 and "status 500" in internal["description"]
    # A 200 with garbage: gemini asks again and again without a word (about 10 s for its 4 attempts,
    # see the check below), so within 8 s it is killed like a hang, with no retries it reported.
    assert sum(1 for r in rig.server.requests() if r["behaviour"] == "garbage") >= 2
    assert_killed([storm, internal, hang, garbage, half], 8)
    assert (good["input_tokens"], good["output_tokens"]) == (2000, 20)
    assert "VALUE = 0.9" in git(repo, "show", "autoresearch/rh:train.py")  # the half edit was not kept
    log = (repo / "runs" / "rh" / "logs" / "iter-0001-agent.log").read_text()
    assert log.count("failed with status 429") == storm["retries"]  # the whole output is in the agent log
    assert rig.leftovers() == []
    rig.lookups()


# gemini gives up on garbage by itself after its 4 attempts ("Incomplete JSON segment at the end",
# its error object on stderr): the garbage case gets the time for that.
@pytest.mark.parametrize("fault, timeout_s, says", [
    ({"do": "status", "status": 429, "message": "Resource exhausted", "call": True}, 8, "rate limited (429)"),
    # The API's own 429 names its delay ("Please retry in 1s"): gemini retries it after that delay,
    # with another line on stderr; still a rate limit with its retries, not "no answer".
    ({"do": "status", "status": 429, "message": "Resource has been exhausted. Please retry in 1s.",
      "call": True}, 8, "rate limited (429)"),
    ({"do": "status", "status": 500, "message": "Internal error", "call": True}, 8, "the server failed (5xx"),
    ("hang", 8, "no answer within the time limit"),
    ({"do": "garbage", "call": True}, 40, "was not the API's format"),
    ("edit_then_hang", 8, "no answer within the time limit"),
], ids=["429", "429-delay", "500", "hang", "garbage", "edit_then_hang"])
def test_check_names_the_class_of_each_gemini_fault(repo: Path, rig: Rig, fault, timeout_s: int, says: str):
    rig.server.script(fault)
    done = rig.harness("check", "--repo", repo, "--agent", "gemini", "--model", "test-model",
                       "--base-url", rig.server.url(), "--agent-executable", rig.executable,
                       "--agent-timeout", timeout_s)
    assert done.returncode == 1
    assert says in done.stderr, done.stderr[-2000:]
    if "429" in says or "5xx" in says:  # its own retries, counted
        assert re.search(r"after [1-9]\d* retr", done.stderr), done.stderr[-2000:]
    assert rig.leftovers() == []
    rig.lookups()


def test_gemini_that_says_it_edited_but_changed_nothing_is_its_failure(repo: Path, rig: Rig):
    # Its replace's old text is not in train.py (the tool fails), yet its answer says it lowered the
    # constant: a crash with gemini's own words, not the researcher's choice of nothing.
    rig.server.script({"do": "edit", "stale": True, "input_tokens": 1000, "cached_tokens": 0, "output_tokens": 10})
    done = rig.harness(*run_args(rig, repo, "rs", "--iterations", 1, "--agent-timeout", 60))
    assert done.returncode == 0, done.stderr[-3000:]
    row = rows(repo, "rs")[-1]
    assert row["status"] == "crash", row
    assert "gemini changed nothing: its replace" in row["description"], row
    assert "its last message: lower VALUE to 0.9" in row["description"], row
    assert rig.leftovers() == []
    rig.lookups()
