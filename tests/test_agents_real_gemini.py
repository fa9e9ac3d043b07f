"""The real `gemini` CLI, offline: a scripted streamGenerateContent server in a loopback-only namespace."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import git
from fakes.helpers import rows
from fakes.real_cli import Rig, netns  # noqa: F401,F811  (the fixture)

# With GOOGLE_GEMINI_BASE_URL, gemini 0.61 wants the key's auth type named in its settings.
SETTINGS = {"security": {"auth": {"selectedType": "gemini-api-key"}}}


@pytest.fixture
def rig(netns, tmp_path: Path):  # noqa: F811
    rig = Rig("gemini", netns, tmp_path)
    (rig.home / ".gemini").mkdir()
    (rig.home / ".gemini" / "settings.json").write_text(json.dumps(SETTINGS))
    yield rig
    rig.close()


def run_args(rig: Rig, repo: Path, tag: str, *extra) -> list:
    return ["run", "--repo", repo, "--tag", tag, "--agent", "gemini", "--model", "test-model",
            "--base-url", rig.server.url(), "--agent-executable", rig.executable, "--no-pipeline", *extra]


def test_gemini_edit_is_committed_with_the_servers_tokens_then_a_hang_is_unknown(repo: Path, rig: Rig):
    rig.server.script({"do": "edit", "input_tokens": 3000, "cached_tokens": 1000, "output_tokens": 70}, "hang")
    done = rig.harness(*run_args(rig, repo, "rg", "--iterations", 2, "--agent-timeout", 20))
    assert done.returncode == 0, done.stderr[-3000:]
    ledger = rows(repo, "rg")
    assert [r["status"] for r in ledger] == ["keep", "keep", "crash"]
    edit, hang = ledger[1:]
    assert edit["description"] == "lower VALUE to 0.9"
    assert "VALUE = 0.9" in git(repo, "show", "autoresearch/rg:train.py")
    # The server's usage of both requests (the replace call, then the answer); nothing on the side.
    assert (edit["input_tokens"], edit["cached_tokens"], edit["output_tokens"]) == (6000, 2000, 140)
    assert "did not finish within 20s" in hang["description"]
    assert hang["input_tokens"] is None and hang["output_tokens"] is None
    manifest = json.loads((repo / "runs" / "rg" / "run.json").read_text())["researcher"]
    assert (manifest["provider"], manifest["key_var"]) == ("gemini", "GEMINI_API_KEY")
    assert manifest["base_url_host"] == f"127.0.0.1:{rig.server.port}"
    assert rig.key not in (repo / "runs" / "rg" / "run.json").read_text()
    assert rig.leftovers() == []


def test_check_says_gemini_needs_its_auth_type_for_a_base_url(repo: Path, rig: Rig):
    (rig.home / ".gemini" / "settings.json").unlink()
    done = rig.harness("check", "--repo", repo, "--agent", "gemini", "--model", "test-model",
                       "--base-url", rig.server.url(), "--agent-executable", rig.executable, "--agent-timeout", 30)
    assert done.returncode == 1
    assert "not logged in" in done.stderr and "Invalid auth method" in done.stderr
    assert "selectedType" in done.stderr  # and what to write where


def test_gemini_faults_cost_one_row_each_with_unknown_tokens(repo: Path, rig: Rig):
    rig.server.script({"do": "status", "status": 500, "message": "Internal error", "times": 100})
    first = rig.harness(*run_args(rig, repo, "rh", "--iterations", 1, "--agent-timeout", 8))
    assert first.returncode == 0, first.stderr[-3000:]
    rig.server.script({"do": "garbage", "times": 100})
    second = rig.harness(*run_args(rig, repo, "rh", "--iterations", 2, "--agent-timeout", 8, "--resume"))
    assert second.returncode == 0, second.stderr[-3000:]
    rig.server.script("edit_then_hang")
    third = rig.harness(*run_args(rig, repo, "rh", "--iterations", 3, "--agent-timeout", 8, "--resume"))
    assert third.returncode == 0, third.stderr[-3000:]
    ledger = rows(repo, "rh")
    assert [r["status"] for r in ledger] == ["keep", "crash", "crash", "crash"]
    for row in ledger[1:]:
        assert row["input_tokens"] is None and row["output_tokens"] is None, row
    storm = ledger[1]
    assert storm["retries"] >= 1 and "status 500" in storm["description"]  # its own retries, counted
    assert "VALUE = 1.0" in git(repo, "show", "autoresearch/rh:train.py")  # the half edit was not kept
    assert rig.leftovers() == []


def test_check_calls_geminis_500_a_server_error(repo: Path, rig: Rig):
    rig.server.script({"do": "status", "status": 500, "message": "Internal error", "times": 100})
    done = rig.harness("check", "--repo", repo, "--agent", "gemini", "--model", "test-model",
                       "--base-url", rig.server.url(), "--agent-executable", rig.executable, "--agent-timeout", 8)
    assert done.returncode == 1
    assert "the server failed (5xx" in done.stderr, done.stderr[-2000:]
