"""The real `codex` CLI, offline: a scripted Responses API server in a loopback-only namespace."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from conftest import git, make_repo
from fakes.helpers import rows
from fakes.real_cli import Rig, assert_killed, fault_matrix, netns, run_through  # noqa: F401,F811  (the fixture)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A research repo whose researcher runs in its own sandbox (agents/sandboxed.py, where bwrap works)."""
    return make_repo(tmp_path / "research", agent_sandbox="auto")


HIGH_DEMAND = "We're currently experiencing high demand, which may cause temporary errors."
FEW_RETRIES = ["--agent-arg", "-c", "--agent-arg", "model_providers.harness.request_max_retries=1",
               "--agent-arg", "-c", "--agent-arg", "model_providers.harness.stream_max_retries=1"]


@pytest.fixture
def rig(netns, tmp_path: Path):  # noqa: F811
    rig = Rig("codex", netns, tmp_path)
    yield rig
    rig.close()


def run_args(rig: Rig, repo: Path, tag: str, *extra) -> list:
    return ["run", "--repo", repo, "--tag", tag, "--agent", "codex", "--model", "test-model",
            "--base-url", rig.server.url("/v1"), "--agent-executable", rig.executable, "--no-pipeline", *extra]


def test_codex_edits_are_committed_trained_and_its_tokens_are_the_servers(repo: Path, rig: Rig):
    rig.server.script({"do": "edit", "input_tokens": 1500, "cached_tokens": 500, "output_tokens": 60},
                      {"do": "edit", "input_tokens": 2500, "cached_tokens": 0, "output_tokens": 90})
    done = rig.harness(*run_args(rig, repo, "rc", "--iterations", 2, "--agent-timeout", 60))
    assert done.returncode == 0, done.stderr[-3000:]
    ledger = rows(repo, "rc")
    assert [r["status"] for r in ledger] == ["keep", "keep", "keep"]
    assert [r["description"] for r in ledger[1:]] == ["lower VALUE to 0.9", "lower VALUE to 0.8"]
    # Two requests per call (the tool call, then the answer after the tool ran); codex sums them.
    assert [(r["input_tokens"], r["cached_tokens"], r["output_tokens"]) for r in ledger[1:]] == [
        (3000, 1000, 120), (5000, 0, 180)]
    reported = rig.server.reported()
    assert sum(r["input_tokens"] for r in ledger[1:]) == reported["input_tokens"]
    assert sum(r["output_tokens"] for r in ledger[1:]) == reported["output_tokens"]
    assert all(r["retries"] == 0 for r in ledger[1:])
    assert all(request["key"] for request in rig.server.requests())  # the key went to our server
    # The edits are commits on the run's branch, made by the harness through codex's own patch tool.
    assert "VALUE = 0.8" in git(repo, "show", "autoresearch/rc:train.py")
    assert len(git(repo, "log", "--format=%H", "main..autoresearch/rc").split()) == 2
    # Where the researcher went is in run.json; the key is nowhere in the run.
    assert json.loads((repo / "runs" / "rc" / "run.json").read_text())["agent_sandbox"] in ("bwrap", "off")
    manifest = json.loads((repo / "runs" / "rc" / "run.json").read_text())["researcher"]
    assert manifest["provider"] == "harness" and manifest["key_var"] == "OPENAI_API_KEY"
    assert manifest["base_url_host"] == f"127.0.0.1:{rig.server.port}"
    for path in (repo / "runs" / "rc").rglob("*"):
        if path.is_file():
            assert rig.key not in path.read_text(errors="replace"), path
    assert rig.leftovers() == []
    # Codex looks up its update check's and ChatGPT's hosts even with a provider of ours: each one
    # recorded, answered NXDOMAIN and never connected to; nothing else was tried.
    assert rig.lookups()
    # A resume that points codex elsewhere is refused, naming both.
    other = run_args(rig, repo, "rc", "--iterations", 3, "--resume")
    other[other.index("--base-url") + 1] = "http://127.0.0.1:9/v1"
    refused = rig.harness(*other)
    assert refused.returncode != 0
    assert f"127.0.0.1:{rig.server.port}" in refused.stderr and "127.0.0.1:9" in refused.stderr


def test_codex_faults_cost_one_row_each_and_leave_nothing_running(repo: Path, rig: Rig):
    # With one request retry and one stream retry, codex asks twice after a 429 and four times after a 500,
    # twice after garbage; then it gives up by itself.
    storm, demand, hang, garbage, half, good = run_through(
        rig, repo, "rf", run_args(rig, repo, "rf", "--agent-timeout", 8, *FEW_RETRIES),
        fault_matrix("Rate limit reached", 500, HIGH_DEMAND))
    assert [r["behaviour"] for r in rig.server.requests() if r["behaviour"] in ("status", "garbage")] == (
        ["status"] * 6 + ["garbage"] * 2)
    assert "stream disconnected" in garbage["description"] and garbage["retries"] >= 1
    assert "429" in storm["description"] and storm["retries"] >= 1
    assert "high demand" in demand["description"] and demand["retries"] >= 1
    assert_killed([hang, half], 8)
    for row in (storm, demand, garbage):  # codex gave up by itself, but reports no usage of a failed turn
        assert row["input_tokens"] is None and row["output_tokens"] is None, row
    assert (good["input_tokens"], good["output_tokens"]) == (2000, 20)
    assert "VALUE = 0.9" in git(repo, "show", "autoresearch/rf:train.py")  # the half edit was not kept
    log = (repo / "runs" / "rf" / "logs" / "iter-0001-agent.log").read_text()
    assert log.count("Reconnecting...") >= 1  # the whole output of the CLI is in the agent log
    assert rig.leftovers() == []
    rig.lookups()  # nothing but the scripted server, and the known names, blocked
    assert rig.harness("report", repo / "runs" / "rf").returncode == 0
    markdown = (repo / "runs" / "rf" / "report.md").read_text()
    assert "| calls with unknown usage (killed before reporting) | 5 |" in markdown


# Codex's own words come with the class: "high demand" is no agent error. A 200 with garbage ends
# codex's stream "before response.completed": a malformed answer, not an unreachable server.
@pytest.mark.parametrize("fault, says, words", [
    ({"do": "status", "status": 429, "message": "Rate limit reached", "call": True}, "rate limited (429)", "429"),
    ({"do": "status", "status": 500, "message": HIGH_DEMAND, "call": True}, "the server failed (5xx", "high demand"),
    ("hang", "no answer within the time limit", "did not finish within 4s"),
    ({"do": "garbage", "call": True}, "was not the API's format", "closed before response.completed"),
    ("edit_then_hang", "no answer within the time limit", "did not finish within 4s"),
], ids=["429", "500", "hang", "garbage", "edit_then_hang"])
def test_check_names_the_class_of_each_codex_fault(repo: Path, rig: Rig, fault, says: str, words: str):
    rig.server.script(fault)
    done = rig.harness("check", "--repo", repo, "--agent", "codex", "--model", "test-model", "--agent-timeout", 4,
                       "--base-url", rig.server.url("/v1"), "--agent-executable", rig.executable, *FEW_RETRIES)
    assert done.returncode == 1
    assert says in done.stderr and words in done.stderr, done.stderr[-2000:]
    assert "--request-timeout" not in done.stderr  # an openai flag: codex does not read it
    assert rig.leftovers() == []
    rig.lookups()


@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_codex_with_its_home_under_tmp_still_makes_its_edit(repo: Path, rig: Rig, tmp_path: Path, sandbox: str):
    # A user whose HOME lies under /tmp (a CI runner, a container): codex refuses to put its helper
    # binaries there, and would claim an edit it never made. The harness gives it a home elsewhere.
    home = tmp_path / "home"
    home.mkdir()
    rig.home = home
    rig.server.script({"do": "edit", "input_tokens": 1500, "cached_tokens": 500, "output_tokens": 60})
    done = rig.harness(*run_args(rig, repo, "rt", "--iterations", 1, "--agent-timeout", 60, "--agent-sandbox", sandbox))
    assert done.returncode == 0, done.stderr[-3000:]
    ledger = rows(repo, "rt")
    assert [r["status"] for r in ledger] == ["keep", "keep"], ledger
    assert "VALUE = 0.9" in git(repo, "show", "autoresearch/rt:train.py")
    assert rig.leftovers() == []
    rig.lookups()


def test_codex_that_says_it_edited_but_changed_nothing_is_its_failure(repo: Path, rig: Rig):
    # Its patch does not apply (codex's file_change item ends "failed"), yet its last message says
    # it lowered the constant: a crash with codex's own words, not the researcher's choice of nothing.
    rig.server.script({"do": "edit", "stale": True, "input_tokens": 1500, "cached_tokens": 0, "output_tokens": 60})
    done = rig.harness(*run_args(rig, repo, "rs", "--iterations", 1, "--agent-timeout", 60))
    assert done.returncode == 0, done.stderr[-3000:]
    row = rows(repo, "rs")[-1]
    assert row["status"] == "crash", row
    assert "codex changed nothing: apply_patch verification failed" in row["description"], row
    assert "its last message: lower VALUE to 0.9" in row["description"], row
    assert (row["input_tokens"], row["output_tokens"]) == (3000, 120)  # billed all the same
    assert rig.leftovers() == []
    rig.lookups()


def test_a_killed_call_never_hides_the_known_cost(repo: Path, rig: Rig):
    # gpt-5.4 is priced; one call is killed at the timeout before codex reported its usage. The run's
    # cost is the other call's, at least: the summary, `harness status` and the report all say so.
    rig.server.script({"do": "edit", "input_tokens": 1500, "cached_tokens": 500, "output_tokens": 60},
                      {"do": "hang", "call": True})
    args = run_args(rig, repo, "rk", "--iterations", 2, "--agent-timeout", 8, "--on-unhealthy", "continue")
    args[args.index("--model") + 1] = "gpt-5.4"
    done = rig.harness(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    ledger = rows(repo, "rk")
    assert [r["status"] for r in ledger] == ["keep", "keep", "crash"]
    # 2000 uncached input at $2.50, 1000 cached at $0.25, 120 output at $15 per 1M tokens.
    known = (2000 * 2.50 + 1000 * 0.25 + 120 * 15.00) / 1e6
    assert ledger[1]["cost_usd"] == pytest.approx(known) and ledger[2]["cost_usd"] is None
    says = f"at least ${known:.4f}; 1 call with unknown usage"
    assert f"cost {says}" in done.stderr, done.stderr[-1500:]
    assert "no price" not in done.stderr
    status = rig.harness("status", "rk", "--repo", repo, "--width", "200")
    assert says in status.stdout, status.stdout
    assert rig.harness("report", repo / "runs" / "rk").returncode == 0
    assert f"| cost | {says} |" in (repo / "runs" / "rk" / "report.md").read_text()
    assert rig.leftovers() == []
    rig.lookups()


def test_step_takes_the_runs_options(repo: Path, rig: Rig):
    # `harness step` is one iteration of the same run: the options the run was started with work here.
    rig.server.script({"do": "edit", "input_tokens": 1500, "cached_tokens": 500, "output_tokens": 60},
                      {"do": "edit", "input_tokens": 1500, "cached_tokens": 500, "output_tokens": 60})
    for _ in range(2):
        args = run_args(rig, repo, "st", "--agent-timeout", 60, "--on-unhealthy", "continue")
        done = rig.harness("step", *args[1:])
        assert done.returncode == 0, done.stderr[-3000:]
    assert [r["status"] for r in rows(repo, "st")] == ["keep", "keep", "keep"]
    assert "VALUE = 0.8" in git(repo, "show", "autoresearch/st:train.py")
    assert rig.leftovers() == []
    rig.lookups()


def test_a_cli_upgraded_between_run_and_resume_is_noticed(repo: Path, rig: Rig, tmp_path: Path):
    # The real codex behind a launcher whose --version answers from a file: an upgrade in between.
    version = tmp_path / "version"
    version.write_text("codex-cli 0.171.0\n")
    launcher = tmp_path / "bin" / "codex"
    launcher.parent.mkdir()
    launcher.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then cat {version}; exit 0; fi\n'
                        f'exec {rig.executable} "$@"\n')
    launcher.chmod(0o755)
    rig.executable = launcher
    rig.server.script(*[{"do": "edit", "input_tokens": 1500, "cached_tokens": 500, "output_tokens": 60}] * 2)
    args = run_args(rig, repo, "rv", "--agent-timeout", 60, "--agent-sandbox", "off")
    assert rig.harness(*args, "--iterations", 1).returncode == 0
    manifest = json.loads((repo / "runs" / "rv" / "run.json").read_text())["researcher"]
    assert manifest["cli_version"] == "codex-cli 0.171.0"
    version.write_text("codex-cli 0.172.0\n")
    refused = rig.harness(*args, "--iterations", 2, "--resume")
    assert refused.returncode != 0
    assert "cli version 'codex-cli 0.171.0' -> 'codex-cli 0.172.0'" in refused.stderr, refused.stderr[-1500:]
    assert "--force" in refused.stderr
    forced = rig.harness(*args, "--iterations", 2, "--resume", "--force")
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert [r["status"] for r in rows(repo, "rv")] == ["keep", "keep", "keep"]
    assert "codex-cli 0.172.0" in (repo / "runs" / "rv" / "events.log").read_text()
    assert rig.leftovers() == []
    rig.lookups()


def check_args(rig: Rig, repo: Path, *extra) -> list:
    return ["check", "--repo", repo, "--agent", "codex", "--model", "test-model", "--base-url", rig.server.url("/v1"),
            "--agent-executable", rig.executable, *extra]


def test_two_checks_at_once_in_one_repo(repo: Path, rig: Rig):
    # Each check has a temporary folder of its own: neither removes the other's worktree or home.
    first, second = (rig.start_harness(*check_args(rig, repo, "--agent-timeout", 60)) for _ in range(2))
    outs = [proc.communicate(timeout=180) for proc in (first, second)]
    for proc, (out, err) in zip((first, second), outs):
        assert proc.returncode == 0, err[-3000:]
        assert "edit      train.py: lower VALUE to 0.9" in out and "training " in out, out
    assert git(repo, "worktree", "list").count("\n") == 0  # only the repo's own
    assert not (repo / "runs").exists()
    assert git(repo, "status", "--porcelain") == ""
    assert rig.leftovers() == []
    rig.lookups()


def test_sigterm_to_check_during_a_call_leaves_nothing(repo: Path, rig: Rig):
    rig.server.script({"do": "hang", "call": True})
    proc = rig.start_harness(*check_args(rig, repo, "--agent-timeout", 120))
    deadline = time.monotonic() + 60
    while not any(r["behaviour"] == "hang" for r in rig.server.requests()):  # codex is waiting on us
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    assert rig.leftovers(), "codex should be running now"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "check stopped by SIGTERM" in err
    assert rig.leftovers() == []  # codex, its group and anything it started: gone
    assert git(repo, "worktree", "list").count("\n") == 0 and not (repo / "runs").exists()
    rig.lookups()


def test_check_prints_the_researchers_result_when_training_fails(tmp_path: Path, rig: Rig):
    repo = make_repo(tmp_path / "broken", train_source="VALUE = 1.0\nraise SystemExit('the baseline is broken')\n",
                     agent_sandbox="auto")
    rig.server.script({"do": "edit", "input_tokens": 1500, "cached_tokens": 500, "output_tokens": 60})
    done = rig.harness(*check_args(rig, repo, "--agent-timeout", 60))
    assert done.returncode == 1
    assert "the baseline training run failed" in done.stderr, done.stderr[-2000:]
    # The researcher's stage passed, and says so although the training failed after it.
    assert "researcher  codex test-model" in done.stdout and "(codex-cli 0.171.0)" in done.stdout, done.stdout
    assert "tokens    input 3000 (cached 1000), output 120 per call" in done.stdout
    assert "edit      train.py: lower VALUE to 0.9" in done.stdout
    assert not (repo / "runs").exists()
    rig.lookups()
