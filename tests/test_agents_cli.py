"""CLI researchers end to end: stand-in `codex` and `claude` on PATH, and `cmd:TEMPLATE`."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from harness.agents import pricing
from harness.agents import make_researcher
from harness.errors import AgentError
from conftest import make_repo
from fakes.helpers import harness, install_stand_ins, rows


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A research repo whose researchers run in their own sandbox (where bwrap works: auto)."""
    return make_repo(tmp_path / "research", agent_sandbox="auto")


@pytest.fixture(autouse=True)
def agents_env(monkeypatch, tmp_path):
    """Stand-ins first on PATH, a throwaway HOME, and files that script and record their calls.

    The files live in the stand-ins' config folder (CODEX_HOME, CLAUDE_CONFIG_DIR), the one folder
    outside its worktree that a sandboxed CLI may write."""
    bin_dir = install_stand_ins(tmp_path / "bin")
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CODEX_HOME", str(state))
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(state))
    monkeypatch.setenv("FAKE_AGENT_SCRIPT", str(state / "script.txt"))
    monkeypatch.setenv("FAKE_AGENT_CALLS", str(state / "calls.jsonl"))
    monkeypatch.setenv("FAKE_AGENT_PID_FILE", str(state / "grandchild.pid"))
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "CODEX_API_KEY", "HARNESS_PRICES"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path
    pricing.set_prices_file(None)


def script(tmp_path: Path, *modes: str) -> None:
    (tmp_path / "state" / "script.txt").write_text("".join(m + "\n" for m in modes))


def calls(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "state" / "calls.jsonl").read_text().splitlines()]


def stand_in_processes(tmp_path: Path) -> list[int]:
    """Live processes that carry this test's stand-in mark: a pid a sandboxed stand-in writes is
    its PID namespace's, so what is left is found by its environment."""
    mark = f"FAKE_AGENT_SCRIPT={tmp_path / 'state' / 'script.txt'}".encode()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if mark in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0") and alive(int(entry)):
                found.append(int(entry))
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_codex_usage_from_the_last_turn_timeout_kills_the_group(repo: Path, agents_env: Path):
    script(agents_env, "edit", "hang", "fail", "edit")
    started = time.monotonic()
    result = harness(["run", "--repo", repo, "--tag", "cx", "--agent", "codex", "--model", "spark",
                      "--iterations", 4, "--agent-timeout", 2])
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 25
    ledger = rows(repo, "cx")
    assert [r["status"] for r in ledger] == ["keep", "keep", "crash", "crash", "keep"]
    by = {r["iteration"]: r for r in ledger}
    # Usage is the last turn.completed (cumulative), not a sum of both.
    assert (by[1]["input_tokens"], by[1]["cached_tokens"], by[1]["output_tokens"]) == (24763, 24448, 422)
    assert by[1]["model"] == "gpt-5.3-codex-spark" and by[1]["cost_usd"] is None  # no published price
    assert by[1]["description"] == "lower VALUE to 0.9"
    assert "did not finish within 2s" in by[2]["description"] and by[2]["agent_s"] < 10
    assert "429 Too Many Requests" in by[3]["description"]
    assert by[4]["metric"] == pytest.approx(0.8)
    assert (agents_env / "state" / "grandchild.pid").exists()  # the hanging call's grandchild ran
    assert stand_in_processes(agents_env) == []  # it ignored SIGTERM: it went with the PID namespace
    first = calls(agents_env)[0]
    argv = first["argv"][1:]
    worktree = str(repo / "runs" / "cx" / "lanes" / "0a")  # codex is pipelined by default: a lane's worktree
    assert argv[:2] == ["exec", "--json"] and argv[-1] == "-"
    assert argv[argv.index("-m") + 1] == "gpt-5.3-codex-spark"
    # Inside the harness's sandbox codex's own nested one cannot start: the harness's confines it.
    assert argv[argv.index("--sandbox") + 1] == "danger-full-access" and "--ephemeral" in argv
    assert argv[argv.index("-C") + 1] == worktree and first["prompt_chars"] > 100
    log = (repo / "runs" / "cx" / "logs" / "iter-0001-agent.log").read_text()
    assert '"type": "turn.completed"' in log and "exit code 0" in log


def test_claude_not_logged_in_is_a_crash_then_edits_with_reported_cost(repo: Path, agents_env: Path):
    script(agents_env, "not_logged_in", "edit")
    result = harness(["run", "--repo", repo, "--tag", "cl", "--agent", "claude", "--model", "sonnet",
                      "--iterations", 2])
    assert result.exit_code == 0, result.output
    ledger = rows(repo, "cl")
    assert [r["status"] for r in ledger] == ["keep", "crash", "keep"]
    assert "Invalid API key · Please run /login" in ledger[1]["description"]
    row = ledger[2]
    assert (row["input_tokens"], row["cached_tokens"], row["output_tokens"]) == (12 + 3000 + 15000, 15000, 450)
    # The price table has the model: its price wins over the $0.0421 claude reported.
    # Its 3000 cache writes at the 5-minute price (1.25x input): what Anthropic bills.
    assert row["cost_usd"] == pytest.approx(pricing.cost_usd("claude-sonnet-4-6", 18012, 15000, 450,
                                                             cache_write_tokens=3000), abs=1e-6)
    assert row["cost_usd"] > pricing.cost_usd("claude-sonnet-4-6", 18012, 15000, 450)
    assert row["description"] == "lower VALUE to 0.95" and row["model"] == "claude-sonnet-4-6"
    first = calls(agents_env)[0]
    assert first["argv"][1:] == ["-p", "--output-format", "stream-json", "--verbose", "--permission-mode",
                                 "acceptEdits", "--model", "claude-sonnet-4-6"]
    assert first["cwd"] == str(repo / "runs" / "cl" / "lanes" / "0a")  # pipelined by default


def test_claude_hang_is_killed_at_the_timeout(repo: Path, agents_env: Path):
    script(agents_env, "hang")
    result = harness(["run", "--repo", repo, "--tag", "ch", "--agent", "claude", "--iterations", 1,
                      "--agent-timeout", 1])
    assert result.exit_code == 0, result.output
    row = rows(repo, "ch")[1]
    assert row["status"] == "crash" and "did not finish within 1s" in row["description"]
    assert row["agent_s"] < 8


def test_cmd_template_with_a_json_usage_line(repo: Path, tmp_path: Path):
    agent = tmp_path / "my_agent.py"
    agent.write_text(
        "import json, re, sys\n"
        "workdir, prompt_file, model = sys.argv[1:4]\n"
        "assert 'val_bpb' in open(prompt_file).read()\n"
        "path = workdir + '/train.py'\n"
        "src = open(path).read()\n"
        "open(path, 'w').write(re.sub(r'^VALUE = .*$', 'VALUE = 0.5', src, count=1, flags=re.M))\n"
        "print('thinking...')\n"
        "print(json.dumps({'input_tokens': 321, 'cached_tokens': 21, 'output_tokens': 43,\n"
        "                  'cost_usd': 0.0123, 'description': 'VALUE to 0.5 with ' + model}))\n")
    template = f"cmd:{sys.executable} {agent} {{workdir}} {{prompt_file}} {{model}}"
    result = harness(["run", "--repo", repo, "--tag", "cmd", "--agent", template, "--model", "m1",
                      "--iterations", 1])
    assert result.exit_code == 0, result.output
    row = rows(repo, "cmd")[1]
    assert row["status"] == "keep" and row["agent"] == "cmd"
    assert (row["input_tokens"], row["cached_tokens"], row["output_tokens"]) == (321, 21, 43)
    assert row["cost_usd"] == pytest.approx(0.0123) and row["description"] == "VALUE to 0.5 with m1"
    assert (repo / "runs" / "cmd" / "logs" / "iter-0001-prompt.md").exists()


def test_bad_researcher_reports_are_unknown_with_an_event_and_garbage_is_not_printed(repo: Path, tmp_path: Path):
    """A cost of -5 would lower the run's spend under --max-cost; "lots" of tokens is no count."""
    from harness.ledger import events
    agent = tmp_path / "liar.py"
    agent.write_text(
        "import json, re\n"
        "src = open('train.py').read()\n"
        "n = 0 if 'VALUE = 1.0' in src else 1  # the first call, or the second (on the kept 0.9)\n"
        "open('train.py', 'w').write(re.sub(r'^VALUE = .*$', f'VALUE = {0.9 - n / 10:.1f}', src, count=1, flags=re.M))\n"
        "report = [{'input_tokens': 10, 'output_tokens': 5, 'cost_usd': -5, 'description': 'cheaper than free'},\n"
        "          {'input_tokens': 'lots', 'output_tokens': 5, 'description': 'bin\\x00\\x1b[2J\\x07ary ' + 'z' * 900}][n]\n"
        "print(json.dumps(report))\n")
    template = f"cmd:{sys.executable} {agent}"
    result = harness(["run", "--repo", repo, "--tag", "liar", "--agent", template, "--iterations", 2])
    assert result.exit_code == 0, result.output
    first, second = rows(repo, "liar")[1:]
    assert first["status"] == "keep" and first["cost_usd"] is None and first["input_tokens"] == 10
    assert second["input_tokens"] is None and second["output_tokens"] is None  # unknown, never 0
    assert "\x00" not in second["description"] and "\x1b" not in second["description"]
    assert second["description"].startswith("bin??[2J?ary zzz") and len(second["description"]) < 300
    assert "\x1b" not in result.output and "$-" not in result.output
    kinds = [(e["kind"], e["message"]) for e in events.read(repo / "runs" / "liar")[0]]
    assert ("researcher_report", "iteration 1: cost_usd '-5' is not a non-negative number; taken as unknown") in kinds
    assert any(k == "researcher_report" and "input_tokens 'lots'" in m for k, m in kinds)


def test_cmd_template_plain_output_and_failure(repo: Path, tmp_path: Path):
    agent = tmp_path / "plain.py"
    agent.write_text(
        "src = open('train.py').read()\n"
        "open('train.py', 'w').write(src.replace('VALUE = 1.0', 'VALUE = 2.0', 1))\n"
        "print('raised VALUE\\n')\n")
    result = harness(["run", "--repo", repo, "--tag", "plain", "--agent", f"cmd:{sys.executable} {agent}",
                      "--iterations", 1])
    assert result.exit_code == 0, result.output
    row = rows(repo, "plain")[1]
    assert row["status"] == "discard" and row["description"] == "raised VALUE"
    assert row["input_tokens"] == 0 and row["cost_usd"] is None
    failing = f"cmd:{sys.executable} -c \"import sys; print('no quota left', file=sys.stderr); sys.exit(3)\""
    result = harness(["run", "--repo", repo, "--tag", "fail", "--agent", failing, "--iterations", 2])
    assert result.exit_code == 0, result.output
    assert [r["status"] for r in rows(repo, "fail")] == ["keep", "crash", "crash"]
    assert "exited with code 3: no quota left" in rows(repo, "fail")[1]["description"]


def test_check_says_the_cli_is_not_logged_in(repo: Path, agents_env: Path):
    script(agents_env, "not_logged_in")
    result = harness(["check", "--repo", repo, "--agent", "claude"])
    assert result.exit_code == 1
    assert "the claude CLI is not logged in" in result.output
    script(agents_env, "edit")
    result = harness(["check", "--repo", repo, "--agent", "claude", "--hours", 1])
    assert result.exit_code == 0, result.output
    # No model given: no price, so claude's own figure is used, and the check says so.
    assert "$0.0421 per call, as claude reported it" in result.stdout and "iterations" in result.stdout


def test_registry_errors_say_what_to_do(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(AgentError, match="npm install -g @openai/codex"):
        make_researcher("codex", "gpt-5.3-codex")
    with pytest.raises(AgentError, match="claude-code"):
        make_researcher("claude", None)
    with pytest.raises(AgentError, match="unknown agent 'gemma'.*openai, codex, claude, gemini"):
        make_researcher("gemma", None)
    with pytest.raises(AgentError, match="google/gemini-cli"):
        make_researcher("gemini", None)
    with pytest.raises(AgentError, match="/no/such/codex` command does not exist"):
        make_researcher("codex", None, {"executable": "/no/such/codex"})
    with pytest.raises(AgentError, match="--agent openai needs --model"):
        make_researcher("openai", None, {"base_url": "http://127.0.0.1:9/v1"})
    with pytest.raises(AgentError, match="--temperature does not apply to --agent mutate"):
        make_researcher("mutate", None, {"temperature": 0.5})
    with pytest.raises(AgentError, match="not on PATH"):
        make_researcher("cmd:no-such-agent-command {prompt_file}", None)


def test_a_killed_calls_tokens_are_unknown_and_count_at_an_estimate(repo: Path, agents_env: Path):
    script(agents_env, "edit", "hang", "edit", "edit")
    result = harness(["run", "--repo", repo, "--tag", "est", "--agent", "codex", "--no-pipeline",
                      "--iterations", 4, "--agent-timeout", 2, "--max-tokens", 60000])
    assert result.exit_code == 0, result.output
    ledger = rows(repo, "est")
    assert [r["status"] for r in ledger] == ["keep", "keep", "crash", "budget"]
    assert ledger[2]["input_tokens"] is None and ledger[2]["output_tokens"] is None  # unknown, not 0
    # The hung call counts as the largest call so far (25185 tokens): 2 x 25185 + the next one's
    # 25185 would pass 60000. Counted as zero it would not have stopped the run.
    assert "spent 50370" in ledger[3]["description"]
    status = harness(["status", "est", "--repo", repo])
    assert "1 call with unknown usage" in status.output


def test_executable_args_and_base_url_from_the_repo_file_and_the_command_line(repo: Path, agents_env: Path,
                                                                               monkeypatch):
    monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])  # no stand-in on PATH
    codex = agents_env / "bin" / "codex"
    with open(repo / "harness.toml", "a") as f:
        f.write(f'agent_executable = "{codex}"\nagent_args = ["-c", "from_file=1"]\n'
                f'base_url = "http://127.0.0.1:9/v1"\n')
    monkeypatch.setenv("CODEX_API_KEY", "sk-codex-test")
    result = harness(["run", "--repo", repo, "--tag", "args", "--agent", "codex", "--iterations", 1])
    assert result.exit_code == 0, result.output
    argv = calls(agents_env)[0]["argv"][1:]
    assert argv[-3:] == ["-c", "from_file=1", "-"]  # the user's arguments, then the prompt's "-"
    assert 'model_providers.harness.base_url="http://127.0.0.1:9/v1"' in argv
    assert 'model_providers.harness.env_key="CODEX_API_KEY"' in argv  # the variable's name, never the key
    assert "sk-codex-test" not in json.dumps(argv)
    manifest = json.loads((repo / "runs" / "args" / "run.json").read_text())["researcher"]
    assert manifest["executable"] == str(codex) and manifest["agent_args"] == ["-c", "from_file=1"]
    assert (manifest["provider"], manifest["base_url_host"], manifest["key_var"]) == (
        "harness", "127.0.0.1:9", "CODEX_API_KEY")
    assert "sk-codex-test" not in (repo / "runs" / "args" / "run.json").read_text()
    # The command line wins over the file; a setting that does not apply to mutate is left out.
    result = harness(["run", "--repo", repo, "--tag", "args2", "--agent", "codex", "--iterations", 1,
                      "--agent-arg", "--flag-from-cli"])
    assert result.exit_code == 0, result.output
    assert calls(agents_env)[-1]["argv"][-2:] == ["--flag-from-cli", "-"]
    result = harness(["run", "--repo", repo, "--tag", "mut", "--agent", "mutate", "--iterations", 1])
    assert result.exit_code == 0, result.output
    result = harness(["run", "--repo", repo, "--tag", "mut2", "--agent", "mutate", "--iterations", 1,
                      "--agent-arg", "x"])
    assert result.exit_code == 1 and "--agent-arg does not apply to --agent mutate" in result.output


def test_a_cli_researcher_at_a_local_base_url_is_not_pipelined_by_default(repo: Path):
    from harness.config.load import resolve
    from harness.driver.pipeline import pipeline_default
    for agent in ("codex", "claude", "gemini"):
        local = resolve(repo, "t", {"agent": agent, "agent_options": {"base_url": "http://127.0.0.1:8000/v1"}})
        assert pipeline_default(local)[0] is False, agent  # the model may share the training GPU
        remote = resolve(repo, "t", {"agent": agent, "agent_options": {"base_url": "https://api.example/v1"}})
        assert pipeline_default(remote)[0] is True, agent
