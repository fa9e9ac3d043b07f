"""The openai researcher end to end: `harness run` through the CLI against a scripted server on 127.0.0.1."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from harness.agents import pricing
from conftest import git
from fakes.helpers import TEST_KEY, harness, rows
from fakes.openai_server import Fail, Hang, ScriptedServer, bad_search, lower_value

# What the scripted server reports for a good edit (reasoning tokens are inside output).
USAGE = dict(input_tokens=1500, cached_tokens=500, output_tokens=200, reasoning_tokens=120)
GPT54 = pricing.price("gpt-5.4")


def good(request):
    return lower_value(request, **USAGE)


def expected_cost(input_tokens: int, cached: int, output: int) -> float:
    return ((input_tokens - cached) * GPT54["input"] + cached * GPT54["cached_input"]
            + output * GPT54["output"]) / 1e6


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "HARNESS_PRICES"):
        monkeypatch.delenv(name, raising=False)
    yield
    pricing.set_prices_file(None)


@pytest.fixture
def server():
    with ScriptedServer(default=good) as s:
        yield s


def run_args(repo: Path, server: ScriptedServer, tag: str = "t1", *extra) -> list:
    return ["run", "--repo", repo, "--tag", tag, "--agent", "openai", "--model", "gpt-5.4",
            "--base-url", server.url, *extra]


def test_run_end_to_end_tokens_retries_crashes_and_timeouts(repo: Path, server: ScriptedServer):
    server.push(
        good,                                     # 1: keep
        Fail(429, "Rate limit reached", "rate_limit_exceeded", "requests",
             headers={"retry-after-ms": "10"}), good,  # 2: one retry, one row, tokens once
        bad_search, good,                         # 3: a repair turn; usage summed
        *[Fail(500, "The server had an error")] * 3,   # 4: a 500 storm: crash, the loop goes on
        Hang(), Hang(), Hang(),                   # 5: no answer: timeouts, then crash
        good,                                     # 6: keep again
    )
    result = harness(run_args(repo, server, "t1", "--iterations", 6, "--max-retries", 2,
                              "--request-timeout", 1, "--agent-timeout", 10),
                     env={"OPENAI_API_KEY": TEST_KEY})
    assert result.exit_code == 0, result.output
    ledger = rows(repo, "t1")
    assert [r["status"] for r in ledger] == ["keep", "keep", "keep", "keep", "crash", "crash", "keep"]
    by = {r["iteration"]: r for r in ledger}
    for i in (1, 2, 6):
        assert (by[i]["input_tokens"], by[i]["cached_tokens"], by[i]["output_tokens"]) == (1500, 500, 200)
        assert by[i]["cost_usd"] == pytest.approx(expected_cost(1500, 500, 200), abs=1e-6)
    assert [by[i]["retries"] for i in range(1, 7)] == [0, 1, 0, 2, 2, 0]
    # The repair turn: both answers' usage, once each.
    assert (by[3]["input_tokens"], by[3]["cached_tokens"], by[3]["output_tokens"]) == (2500, 500, 240)
    assert by[3]["cost_usd"] == pytest.approx(expected_cost(2500, 500, 240), abs=1e-6)
    assert "HTTP 500" in by[4]["description"] and by[4]["input_tokens"] == 0
    # three attempts of --request-timeout 1 each (at least 3 s on any machine), ended by the retries running
    # out, not by --agent-timeout's deadline (10 s): its own message would say so
    assert "timeout" in by[5]["description"] and by[5]["agent_s"] >= 3, by[5]["description"]
    assert "agent-timeout" not in by[5]["description"] and "no time left" not in by[5]["description"], by[5]["description"]
    assert by[6]["metric"] == pytest.approx(0.96)  # four kept edits of -0.01
    # What the server saw: 12 requests, all Responses API with the key; the repair sent the failure.
    assert len(server.requests) == 1 + 2 + 2 + 3 + 3 + 1
    assert {r.path for r in server.requests} == {"/v1/responses"}
    assert all(r.has_bearer and r.body["model"] == "gpt-5.4" for r in server.requests)
    repair = server.requests[4]
    assert "does not match train.py" in repair.last_user_text()
    assert [m["role"] for m in repair.body["input"]] == ["user", "assistant", "user"]
    # The manifest records the routing and a fingerprint, never the key; no log holds the key.
    run_dir = repo / "runs" / "t1"
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["researcher"]["base_url"] == server.url
    assert manifest["researcher"]["wire_api"] == "responses"
    assert manifest["researcher"]["request_timeout_s"] == 1 and manifest["researcher"]["max_retries"] == 2
    assert manifest["researcher"]["key_fingerprint"] == hashlib.sha256(TEST_KEY.encode()).hexdigest()[:8]
    for path in run_dir.rglob("*"):
        if path.is_file() and "worktree" not in path.parts:
            assert TEST_KEY not in path.read_text(errors="replace"), path
    # The whole exchange is in the iteration's log.
    log = (run_dir / "logs" / "iter-0003-agent.log").read_text()
    assert "edit did not apply" in log and "applied edits to train.py" in log


def test_the_agent_timeout_caps_requests_and_retries(tmp_path: Path):
    """A server that never answers: the invocation ends at task.timeout_s, not request_timeout * retries."""
    from harness.agents import Task, make_researcher
    (tmp_path / "train.py").write_text("VALUE = 1.0\n")
    with ScriptedServer(default=Hang()) as s:
        researcher = make_researcher("openai", "gpt-5.4", {"base_url": s.url, "api_key": TEST_KEY,
                                                           "request_timeout": 30, "max_retries": 5})
        task = Task(tmp_path, "improve it", ("train.py",), 1.5, tmp_path / "agent.log", 1, 0)
        started = time.monotonic()
        proposal = researcher.propose(task)
    assert time.monotonic() - started < 15  # a 1.5 s timeout, not one 30 s request, nor five
    assert proposal.error_kind == "timeout" and proposal.usage.input_tokens == 0
    assert (tmp_path / "train.py").read_text() == "VALUE = 1.0\n"


RATE_LIMIT = ("Rate limit reached", "rate_limit_exceeded", "requests")


def test_a_429_storm_is_retried_by_the_client_and_every_retry_is_on_the_ledger(repo: Path, server: ScriptedServer):
    """The client waits the server's Retry-After; the ledger's retries are the retries the server saw."""
    storm = [Fail(429, *RATE_LIMIT, headers={"retry-after-ms": "20"})]
    server.push(*storm * 5, good,   # 1: five retries, then an answer: keep
                *storm * 9)         # 2: more than --max-retries 6: seven requests, then a crash
    result = harness(run_args(repo, server, "storm", "--iterations", 2, "--max-retries", 6),
                     env={"OPENAI_API_KEY": TEST_KEY})
    assert result.exit_code == 0, result.output
    ledger = rows(repo, "storm")
    assert [r["status"] for r in ledger] == ["keep", "keep", "crash"]
    assert [r["retries"] for r in ledger[1:]] == [5, 6]
    assert (ledger[1]["input_tokens"], ledger[1]["output_tokens"]) == (1500, 200)  # the answer's usage, once
    assert "HTTP 429 rate_limit_exceeded" in ledger[2]["description"] and ledger[2]["input_tokens"] == 0
    assert [r.retry_count for r in server.requests] == [*range(6), *range(7)]
    log = (repo / "runs/storm/logs/iter-0001-agent.log").read_text()
    assert [line for line in log.splitlines() if line.startswith("retry ")] == [f"retry {n}/6" for n in range(1, 6)]
    assert log.count("request failed after") == 5 and "request ok in" in log


def a_task(tmp_path: Path, timeout_s: float, cancel=None):
    from harness.agents import Task
    (tmp_path / "train.py").write_text("VALUE = 1.0\n")
    return Task(tmp_path, "improve it", ("train.py",), timeout_s, tmp_path / "agent.log", 1, 0, cancel=cancel)


def test_no_retry_starts_past_the_deadline(tmp_path: Path):
    """A Retry-After that ends past the deadline is not waited for; a backoff that would cross it is
    abandoned at the deadline, and the retry it was waiting for is never sent."""
    from harness.agents import make_researcher
    # (behaviour, deadline, kind, at least, at most): the first returns at once, well before its
    # deadline; the second at its deadline, before the client's first backoff (0.375-0.5 s) would
    # end. A retry sent is one request more; the upper bounds allow a busy machine a second.
    cases = [(Fail(429, *RATE_LIMIT, headers={"retry-after": "30"}), 6.0, "rate_limit", 0.0, 2.0),
             (Fail(500), 0.3, "timeout", 0.3, 1.3)]
    for behaviour, timeout_s, kind, low_s, high_s in cases:
        with ScriptedServer(default=behaviour) as s:
            researcher = make_researcher("openai", "gpt-5.4", {"base_url": s.url, "api_key": TEST_KEY,
                                                               "max_retries": 5})
            started = time.monotonic()
            proposal = researcher.propose(a_task(tmp_path, timeout_s))
            took = time.monotonic() - started
            time.sleep(0.8)  # the abandoned client wakes up meanwhile: its retry must not go out
            assert len(s.requests) == 1, behaviour
        assert proposal.error_kind == kind and proposal.retries == 0, proposal.error
        assert low_s <= took < high_s, (behaviour, took)
    assert "not retried: the server's Retry-After (30.00s) ends past the deadline" in (tmp_path / "agent.log").read_text()


def test_a_cancel_during_the_clients_wait_sends_no_further_retry(tmp_path: Path):
    import threading

    from harness.agents import make_researcher
    with ScriptedServer(default=Fail(429, *RATE_LIMIT, headers={"retry-after": "4"})) as s:
        researcher = make_researcher("openai", "gpt-5.4", {"base_url": s.url, "api_key": TEST_KEY})
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()  # while the client waits its 4 s
        started = time.monotonic()
        proposal = researcher.propose(a_task(tmp_path, 30, cancel))
        assert time.monotonic() - started < 3  # the cancel ended the wait
        time.sleep(max(0.0, started + 4.5 - time.monotonic()))  # past the Retry-After: the abandoned client's retry is refused
        assert len(s.requests) == 1
    assert proposal.error_kind == "cancelled" and proposal.retries == 0
    assert proposal.usage.known  # nothing was in flight: the failed request has no usage


def test_insufficient_quota_is_not_retried(tmp_path: Path):
    from harness.agents import make_researcher
    with ScriptedServer(default=Fail(429, "You exceeded your current quota", "insufficient_quota")) as s:
        researcher = make_researcher("openai", "gpt-5.4", {"base_url": s.url, "api_key": TEST_KEY})
        proposal = researcher.propose(a_task(tmp_path, 30))
        assert len(s.requests) == 1
    assert proposal.error_kind == "rate_limit" and "insufficient_quota" in proposal.error and proposal.retries == 0


def test_chat_wire_api(repo: Path, server: ScriptedServer):
    server.push(lambda r: lower_value(r, input_tokens=900, cached_tokens=800, output_tokens=50))
    result = harness(run_args(repo, server, "chat", "--iterations", 1, "--wire-api", "chat",
                              "--temperature", 0.3, "--reasoning-effort", "low"),
                     env={"OPENAI_API_KEY": TEST_KEY})
    assert result.exit_code == 0, result.output
    row = rows(repo, "chat")[1]
    assert row["status"] == "keep"
    assert (row["input_tokens"], row["cached_tokens"], row["output_tokens"]) == (900, 800, 50)
    request = server.requests[0]
    assert request.path == "/v1/chat/completions"
    assert request.body["messages"][0]["role"] == "system" and "SEARCH" in request.body["messages"][0]["content"]
    assert request.body["temperature"] == 0.3 and request.body["reasoning_effort"] == "low"


def test_max_cost_stops_the_run_at_the_cap(repo: Path, server: ScriptedServer):
    big = dict(input_tokens=100_000, cached_tokens=0, output_tokens=10_000)  # $0.40 per call
    server.default = lambda r: lower_value(r, **big)
    result = harness(run_args(repo, server, "cap", "--iterations", 10, "--max-cost", 1.0),
                     env={"OPENAI_API_KEY": TEST_KEY})
    assert result.exit_code == 0, result.output
    ledger = rows(repo, "cap")
    assert [r["status"] for r in ledger] == ["keep", "keep", "keep", "budget"]
    spent = sum(r["cost_usd"] or 0 for r in ledger)
    assert spent == pytest.approx(0.80) and spent <= 1.0
    assert "max-cost" in ledger[-1]["description"] and "max-cost" in result.output
    assert len(server.requests) == 2


def test_unknown_model_has_no_cost_until_a_price_file_gives_one(repo: Path, server: ScriptedServer, tmp_path):
    env = {"OPENAI_API_KEY": TEST_KEY}
    args = ["run", "--repo", repo, "--agent", "openai", "--model", "my-local-model", "--base-url", server.url,
            "--iterations", 1]
    result = harness([*args, "--tag", "noprice"], env=env)
    assert result.exit_code == 0, result.output
    row = rows(repo, "noprice")[1]
    assert row["input_tokens"] == 1500 and row["cost_usd"] is None
    assert "unknown" in result.output
    prices = tmp_path / "prices.toml"
    prices.write_text('[aliases]\nlocal = "my-local-model"\n\n[models."my-local-model"]\n'
                      'input = 1.0\ncached_input = 0.5\noutput = 2.0\n')
    result = harness(["run", "--repo", repo, "--agent", "openai", "--model", "local", "--base-url", server.url,
                      "--iterations", 1, "--tag", "priced", "--prices", prices], env=env)
    assert result.exit_code == 0, result.output
    row = rows(repo, "priced")[1]
    assert row["model"] == "my-local-model"
    assert row["cost_usd"] == pytest.approx((1000 * 1.0 + 500 * 0.5 + 200 * 2.0) / 1e6)


def test_max_cost_without_a_price_stops_instead_of_counting_zero(repo: Path, server: ScriptedServer):
    result = harness(["run", "--repo", repo, "--tag", "nocap", "--agent", "openai", "--model", "my-local-model",
                      "--base-url", server.url, "--iterations", 5, "--max-cost", 1.0],
                     env={"OPENAI_API_KEY": TEST_KEY})
    assert result.exit_code == 0, result.output
    ledger = rows(repo, "nocap")
    assert [r["status"] for r in ledger] == ["keep", "keep", "budget"]
    assert "no price" in ledger[-1]["description"]


def test_resume_refuses_other_routing_unless_forced(repo: Path, server: ScriptedServer):
    env = {"OPENAI_API_KEY": TEST_KEY}
    assert harness(run_args(repo, server, "r1", "--iterations", 1), env=env).exit_code == 0
    with ScriptedServer(default=good) as other:
        refusals = {
            "model": (["run", "--repo", repo, "--tag", "r1", "--agent", "openai", "--model", "gpt-5.2",
                       "--base-url", server.url], env),
            "base url": (run_args(repo, other, "r1"), env),
            "key fingerprint": (run_args(repo, server, "r1"), {"OPENAI_API_KEY": "sk-another-key"}),
            "backend": (["run", "--repo", repo, "--tag", "r1", "--agent", "mutate"], env),
        }
        for what, (args, run_env) in refusals.items():
            result = harness([*args, "--resume", "--iterations", 2], env=run_env)
            assert result.exit_code == 1, what
            assert what in result.output and "--force" in result.output, result.output
        assert len(rows(repo, "r1")) == 2
        result = harness([*run_args(repo, other, "r1"), "--resume", "--iterations", 2, "--force"], env=env)
        assert result.exit_code == 0, result.output
        assert len(other.requests) == 1
    result = harness([*run_args(repo, server, "r1"), "--resume", "--iterations", 3], env=env)
    assert result.exit_code == 0, result.output
    assert [r["iteration"] for r in rows(repo, "r1")] == [0, 1, 2, 3]


# ---------------------------------------------------------------------------
# harness check


def check_args(repo: Path, url: str, model: str = "gpt-5.4") -> list:
    return ["check", "--repo", repo, "--agent", "openai", "--model", model, "--base-url", url, "--hours", 8]


def test_check_prints_the_projection_and_commits_nothing(repo: Path, server: ScriptedServer):
    head = git(repo, "rev-parse", "HEAD")
    result = harness(check_args(repo, server.url), env={"OPENAI_API_KEY": TEST_KEY})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "input 1500 (cached 500), output 200 per call" in out
    assert f"${expected_cost(1500, 500, 200):.4f} per call" in out
    assert "train.py: lower VALUE to 0.99" in out
    assert "iterations" in out and "val_bpb 1.000000" in out
    assert git(repo, "rev-parse", "HEAD") == head and git(repo, "status", "--porcelain") == ""
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert not (repo / "runs").exists()


def test_check_tells_failures_apart(repo: Path, tmp_path: Path):
    messages = {}
    with ScriptedServer(default=good, keys={TEST_KEY}, models={"gpt-5.4"}) as s:
        messages["401"] = harness(check_args(repo, s.url), env={"OPENAI_API_KEY": "sk-wrong"})
        messages["404 model"] = harness(check_args(repo, s.url, "gpt-5.2"), env={"OPENAI_API_KEY": TEST_KEY})
        messages["404 url"] = harness(check_args(repo, s.url.removesuffix("/v1")), env={"OPENAI_API_KEY": TEST_KEY})
        s.push(Fail(429, "Rate limit reached for gpt-5.4", "rate_limit_exceeded", "requests"))
        messages["429"] = harness(check_args(repo, s.url), env={"OPENAI_API_KEY": TEST_KEY})
    messages["missing"] = harness(["check", "--repo", repo, "--agent", "openai", "--model", "gpt-5.4"])
    for result in messages.values():
        assert result.exit_code == 1
    assert "key was rejected (401" in messages["401"].output
    assert "not found (404)" in messages["404 model"].output and "gpt-5.2" in messages["404 model"].output
    assert "not found (404)" in messages["404 url"].output
    assert "rate limited (429)" in messages["429"].output
    assert "missing key" in messages["missing"].output and "OPENAI_API_KEY" in messages["missing"].output
    firsts = {name: r.output.strip().splitlines()[-2] for name, r in messages.items() if name != "missing"}
    assert len({firsts["401"], firsts["404 model"], firsts["429"]}) == 3
    assert git(repo, "status", "--porcelain") == ""
