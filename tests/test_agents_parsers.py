"""Pure parsers of agent output, tested on strings: edit blocks, codex JSONL, claude JSON, cmd output."""
from __future__ import annotations

import json

import pytest

from harness.agents import pricing
from harness.agents import routing_mismatch
from harness.agents import spend
from harness.agents.base import Usage
from harness.agents.claude import parse_claude_result
from harness.agents.cli import CLIOutput, merge_error
from harness.agents.gemini import parse_gemini_output
from harness.agents.codex import parse_codex_events
from harness.agents.command import parse_command_output, render_argv
from harness.agents.edits import EditError, apply_edits, parse_blocks
from harness.agents.openai_api import chat_usage, responses_text, responses_usage
from harness.agents.process import classify

TRAIN = """import math

LR = 3e-3  # learning rate
BATCH = 32


def lr_at(step):
    if step < 100:
        return LR * step / 100
    return LR
"""


def block(search: str, replace: str, path: str = "train.py") -> str:
    return f"{path}\n<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"


# ---------------------------------------------------------------------------
# SEARCH/REPLACE


def test_apply_one_block_and_the_description_is_the_last_line():
    answer = "I think a higher LR helps.\n\n```python\n" + block("LR = 3e-3  # learning rate\n",
                                                              "LR = 6e-3  # learning rate\n") + "```\n\nDouble LR to 6e-3\n"
    changed, description = apply_edits({"train.py": TRAIN}, answer)
    assert changed == {"train.py": TRAIN.replace("LR = 3e-3", "LR = 6e-3")}
    assert description == "Double LR to 6e-3"


def test_several_blocks_apply_in_order_and_a_path_is_optional_with_one_file():
    answer = ("<<<<<<< SEARCH\nBATCH = 32\n=======\nBATCH = 64\n>>>>>>> REPLACE\n" +
              block("BATCH = 64\n", "BATCH = 128\n") + "**Description:** batch 128")
    changed, description = apply_edits({"train.py": TRAIN}, answer)
    assert "BATCH = 128\n" in changed["train.py"]
    assert description == "batch 128"


def test_trailing_whitespace_and_lost_indentation_are_tolerated():
    search = "if step < 100:\n    return LR * step / 100\n"  # the model dropped 4 spaces
    replace = "if step < 200:\n    return LR * step / 200\n"
    changed, _ = apply_edits({"train.py": TRAIN}, block(search, replace) + "longer warmup")
    assert "    if step < 200:\n        return LR * step / 200\n" in changed["train.py"]
    changed, _ = apply_edits({"train.py": TRAIN}, block("BATCH = 32   \n", "BATCH = 16\n") + "smaller")
    assert "BATCH = 16\n" in changed["train.py"]


def test_empty_search_or_a_fenced_file_replaces_the_whole_file():
    changed, _ = apply_edits({"train.py": TRAIN}, block("", "print('new')\n") + "rewrite")
    assert changed == {"train.py": "print('new')\n"}
    changed, description = apply_edits({"train.py": TRAIN}, "train.py\n```python\nX = 1\n```\nsimplify")
    assert changed == {"train.py": "X = 1\n"} and description == "simplify"


def test_a_search_that_does_not_match_says_so_and_shows_the_closest_lines():
    with pytest.raises(EditError) as e:
        apply_edits({"train.py": TRAIN}, block("LR = 3e-4  # learning rate\n", "LR = 1e-3\n") + "x")
    text = str(e.value)
    assert "no file was changed" in text and "does not match train.py" in text
    assert "LR = 3e-3  # learning rate" in text  # the hint
    assert "Send all of your SEARCH/REPLACE blocks again" in text


def test_ambiguous_out_of_scope_no_block_and_no_change_are_errors():
    with pytest.raises(EditError, match="matches 2 places"):
        apply_edits({"train.py": "A = 1\nB = 2\nA = 1\n"}, block("A = 1\n", "A = 3\n") + "x")
    with pytest.raises(EditError, match="prepare.py, which you may not edit; you may edit only: train.py"):
        apply_edits({"train.py": TRAIN}, block("EVAL = 1\n", "EVAL = 2\n", "prepare.py") + "x")
    with pytest.raises(EditError, match="no SEARCH/REPLACE block"):
        apply_edits({"train.py": TRAIN}, "I would raise the learning rate.")
    with pytest.raises(EditError, match="leaves every file exactly as it was"):
        apply_edits({"train.py": TRAIN}, block("BATCH = 32\n", "BATCH = 32\n") + "x")
    with pytest.raises(EditError, match="no ======= line"):
        parse_blocks("train.py\n<<<<<<< SEARCH\nBATCH = 32\n>>>>>>> REPLACE\n")
    with pytest.raises(EditError, match="no >>>>>>> REPLACE line"):
        parse_blocks("train.py\n<<<<<<< SEARCH\nBATCH = 32\n=======\nBATCH = 1\n")


def test_one_failing_block_changes_nothing_and_two_files_need_paths():
    answer = block("BATCH = 32\n", "BATCH = 64\n") + block("NOPE\n", "YES\n") + "two edits"
    with pytest.raises(EditError) as e:
        apply_edits({"train.py": TRAIN}, answer)
    assert "block at line 8" in str(e.value) and "block at line 2" not in str(e.value)
    files = {"train.py": TRAIN, "model.py": "DEPTH = 4\n"}
    with pytest.raises(EditError, match="no file path"):
        apply_edits(files, "<<<<<<< SEARCH\nDEPTH = 4\n=======\nDEPTH = 6\n>>>>>>> REPLACE\ndeeper")
    changed, _ = apply_edits(files, block("DEPTH = 4\n", "DEPTH = 6\n", "`./model.py`") + "deeper")
    assert changed == {"model.py": "DEPTH = 6\n"}


# ---------------------------------------------------------------------------
# The wire formats


def test_usage_from_the_responses_and_chat_shapes():
    data = {"output": [{"type": "reasoning", "summary": []},
                       {"type": "message", "content": [{"type": "output_text", "text": "hello"}]}],
            "usage": {"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 600},
                      "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 250},
                      "total_tokens": 1300}}
    assert responses_text(data) == "hello"
    usage = responses_usage(data)
    assert (usage.input_tokens, usage.cached_tokens, usage.output_tokens) == (1000, 600, 300)  # reasoning not added
    chat = {"usage": {"prompt_tokens": 50, "completion_tokens": 7, "prompt_tokens_details": None}}
    assert (chat_usage(chat).input_tokens, chat_usage(chat).cached_tokens, chat_usage(chat).output_tokens) == (50, 0, 7)


CODEX = "\n".join(json.dumps(e) for e in [
    {"type": "thread.started", "thread_id": "th_1"},
    {"type": "turn.started"},
    {"type": "item.completed", "item": {"id": "item_0", "type": "reasoning", "text": "thinking"}},
    {"type": "item.completed", "item": {"id": "item_1", "type": "agent_message", "text": "first"}},
    {"type": "turn.completed", "usage": {"input_tokens": 100, "cached_input_tokens": 50, "output_tokens": 10}},
    {"type": "error", "message": "Reconnecting... 1/5"},
    {"type": "turn.started"},
    {"type": "item.completed", "item": {"id": "item_2", "type": "agent_message", "text": "Done.\n\nraise LR\n"}},
    {"type": "turn.completed", "usage": {"input_tokens": 300, "cached_input_tokens": 200, "output_tokens": 40}},
])


def test_codex_events_last_turn_usage_final_message_and_errors():
    run = parse_codex_events("warning: not json\n" + CODEX + "\n")
    assert (run.usage.input_tokens, run.usage.cached_tokens, run.usage.output_tokens) == (300, 200, 40)
    assert run.description == "raise LR" and run.error is None and run.retries == 1
    failed = parse_codex_events(CODEX + "\n" + json.dumps(
        {"type": "turn.failed", "error": {"message": "stream error: 401 Unauthorized"}}))
    assert failed.error == "stream error: 401 Unauthorized" and classify(failed.error) == "auth"
    assert parse_codex_events(json.dumps({"type": "error", "message": "boom"})).error == "boom"
    assert parse_codex_events("").usage is None  # never reported: unknown, not zero
    storm = "\n".join(json.dumps({"type": "error", "message": f"Reconnecting... {n}/5 (unexpected status 429 "
                                  "Too Many Requests)"}) for n in range(1, 4))
    run = parse_codex_events(storm)
    assert run.retries == 3 and run.usage is None and classify(run.error) == "rate_limit"
    demand = "We're currently experiencing high demand, which may cause temporary errors."
    assert classify(parse_codex_events(json.dumps({"type": "error", "message": demand})).error) == "server"


def test_claude_result_usage_cost_and_not_logged_in():
    ok = {"type": "result", "subtype": "success", "is_error": False, "result": "Edited.\nuse AdamW",
          "total_cost_usd": 0.25, "usage": {"input_tokens": 5, "cache_creation_input_tokens": 100,
                                            "cache_read_input_tokens": 1000, "output_tokens": 70}}
    run = parse_claude_result(json.dumps(ok))
    assert (run.usage.input_tokens, run.usage.cached_tokens, run.usage.output_tokens) == (1105, 1000, 70)
    assert run.usage.cost_usd == 0.25 and run.description == "use AdamW" and run.error is None
    login = dict(ok, is_error=True, result="Invalid API key · Please run /login", total_cost_usd=0,
                 usage={})
    run = parse_claude_result("some banner\n" + json.dumps(login))
    assert run.error == "Invalid API key · Please run /login" and classify(run.error) == "not_logged_in"
    assert parse_claude_result("Error: something").error == "claude printed no JSON result object"
    assert parse_claude_result(json.dumps(dict(ok, subtype="error_max_turns"))).error == "Edited.\nuse AdamW"
    retry = {"type": "system", "subtype": "api_retry", "attempt": 1, "max_retries": 10, "retry_delay_ms": 500,
             "error_status": 429, "error": "rate_limit"}
    stream = "\n".join(json.dumps(e) for e in [{"type": "system", "subtype": "init"}, retry,
                                                dict(retry, attempt=2), ok])
    run = parse_claude_result(stream)
    assert run.retries == 2 and run.usage.input_tokens == 1105 and run.description == "use AdamW"
    both = dict(ok, modelUsage={"claude-sonnet-4-6": {"inputTokens": 5, "outputTokens": 70, "cacheReadInputTokens": 1000,
                                                      "cacheCreationInputTokens": 100},
                                "claude-haiku-4-5": {"inputTokens": 11, "outputTokens": 3}})
    run = parse_claude_result(json.dumps(both))  # every model's requests, the title request included
    assert (run.usage.input_tokens, run.usage.cached_tokens, run.usage.output_tokens) == (1116, 1000, 73)
    assert run.usage.cost_usd == 0.25
    killed = parse_claude_result("\n".join(json.dumps(e) for e in [{"type": "system", "subtype": "init"}, retry]))
    assert killed.usage is None and killed.retries == 1 and classify(killed.error) == "rate_limit"
    waiting = parse_claude_result(json.dumps({"type": "system", "subtype": "init"}))  # killed while it waited
    assert waiting.usage is None and not waiting.found  # no words of its own for the row's description


def test_gemini_json_output_tokens_and_errors():
    ok = {"response": "Edited train.py.\n\nlower VALUE to 0.9", "stats": {"models": {
        "gemini-2.5-pro": {"api": {"totalRequests": 3, "totalErrors": 1},
                           "tokens": {"prompt": 900, "candidates": 40, "total": 960, "cached": 300,
                                      "thoughts": 20, "tool": 0}},
        "gemini-2.5-flash": {"api": {"totalRequests": 1, "totalErrors": 0},
                             "tokens": {"prompt": 100, "candidates": 5, "cached": 0, "thoughts": 0}}}}}
    run = parse_gemini_output("Loaded cached credentials.\n" + json.dumps(ok, indent=2))
    assert (run.usage.input_tokens, run.usage.cached_tokens, run.usage.output_tokens) == (1000, 300, 65)
    assert run.description == "lower VALUE to 0.9" and run.error is None and run.retries == 1
    failed = parse_gemini_output(json.dumps({"error": {"type": "Error", "message": "429 Too Many Requests"}}))
    assert failed.usage is None and classify(failed.error) == "rate_limit"
    assert parse_gemini_output("").error == "gemini printed no JSON result object"
    stderr = ("Attempt 1 failed with status 429. Retrying with backoff... _ApiError: quota\n  status: 429\n}\n"
              "Attempt 2 failed with status 429. Retrying with backoff... _ApiError: quota\n")
    killed = parse_gemini_output("", stderr)
    assert killed.retries == 2 and killed.usage is None and classify(killed.error) == "rate_limit"
    # A call that fails by itself prints its error object on stderr, after the stack trace.
    failed = {"session_id": "s1", "error": {"type": "Error", "message": "Incomplete JSON segment at the end",
                                            "code": 1}}
    stderr = ("Warning: 256-color support not detected.\nError: x\n    at Turn.run (file:///b.js:1:2) {\n"
              "  status: 500\n}\n" + json.dumps(failed, indent=2) + "\n")
    run = parse_gemini_output("", stderr)
    assert run.error == "Incomplete JSON segment at the end" and run.found
    assert classify(run.error) == "bad_response"


def _result(**kw):
    from harness.agents.process import ProcessResult
    return ProcessResult(**{"stdout": "", "stderr": "", "returncode": 0, "timed_out": False, "agent_s": 1.0, **kw})


def test_merge_error_of_process_and_output():
    quiet = CLIOutput(None, "", None, False)
    said = CLIOutput(None, "", "429 Too Many Requests", True)
    assert merge_error(_result(), quiet, "x", 5) == (None, None)
    assert merge_error(_result(returncode=2, stderr="boom"), quiet, "x", 5) == ("x exited with code 2: boom", "agent")
    assert merge_error(_result(returncode=1), said, "x", 5) == ("429 Too Many Requests", "rate_limit")
    error, kind = merge_error(_result(returncode=None, timed_out=True), said, "x", 5)
    assert kind == "rate_limit" and "did not finish within 5s" in error and "429" in error  # a storm, not a hang
    assert merge_error(_result(returncode=None, timed_out=True), quiet, "x", 5)[1] == "timeout"
    nothing = CLIOutput(None, "", "x printed no JSON result object", False)
    error, kind = merge_error(_result(returncode=None, timed_out=True), nothing, "x", 5)
    assert kind == "timeout" and "printed no JSON" not in error  # no output is no error text of its own
    assert merge_error(_result(returncode=None, cancelled=True), said, "x", 5)[1] == "cancelled"


def test_price_table_wins_over_the_researchers_figure(tmp_path):
    usage = Usage(1_000_000, 0, 0, cost_usd=9.99)
    assert pricing.call_cost("gpt-5.4", usage) == (pytest.approx(2.50), "table")
    assert pricing.call_cost("no-such-model", usage) == (9.99, "researcher")
    assert pricing.call_cost("no-such-model", Usage(10, 0, 1)) == (None, "unknown")
    assert pricing.call_cost("gpt-5.4", Usage.unknown()) == (None, "unknown")
    free = tmp_path / "free.toml"
    free.write_text('[models."local-coder"]\ninput = 0.0\noutput = 0.0\n')
    try:
        pricing.set_prices_file(free)
        assert pricing.call_cost("local-coder", Usage(5000, 0, 300, cost_usd=0.0214)) == (0.0, "table")
    finally:
        pricing.set_prices_file(None)


def test_unknown_calls_count_at_the_largest_known_one():
    rows = [{"iteration": 0, "agent_s": None, "input_tokens": 0, "output_tokens": 0},
            {"iteration": 1, "agent_s": 3.0, "input_tokens": 1000, "output_tokens": 100, "cost_usd": 0.01},
            {"iteration": 2, "agent_s": 9.0, "input_tokens": None, "output_tokens": None, "cost_usd": None},
            {"iteration": 3, "agent_s": 2.0, "input_tokens": 500, "output_tokens": 50, "cost_usd": 0.005}]
    assert spend.call_tokens(rows) == [1100, 1100, 550]
    assert spend.call_costs(rows) == [0.01, 0.01, 0.005]
    assert spend.unknown_calls(rows) == 1
    assert spend.call_tokens(rows[:1] + rows[2:3]) == [0]  # no estimate yet


def test_command_output_and_argv_substitution(tmp_path):
    out = parse_command_output('working\n{"input_tokens": 10, "cached_tokens": 4, "output_tokens": 3, "cost_usd": 0.5}\n')
    assert (out.usage.input_tokens, out.usage.cached_tokens, out.usage.output_tokens, out.usage.cost_usd) == (10, 4, 3, 0.5)
    assert out.description == "working"
    plain = parse_command_output("step 1\nset dropout 0.1\n\n")
    assert plain.description == "set dropout 0.1" and plain.usage is None  # the base makes it free
    argv = render_argv("agent --dir={workdir} 'a b' {prompt_file} -m {model}", tmp_path / "w", tmp_path / "p.md", "m1")
    assert argv == ["agent", f"--dir={tmp_path / 'w'}", "a b", str(tmp_path / "p.md"), "-m", "m1"]


def test_classify_error_texts():
    assert classify("HTTP 429 rate_limit_exceeded") == "rate_limit"
    assert classify("Not logged in. Please run /login") == "not_logged_in"
    assert classify("model gpt-9 does not exist") == "not_found"
    assert classify("segfault") == "agent"
    # A 200 whose body is no answer of the API's, in each CLI's words (tests/test_agents_real_*.py):
    for text in ("API Error: API returned an empty or malformed response (HTTP 200) — check for a proxy",
                 "stream disconnected before completion: stream closed before response.completed",
                 "Incomplete JSON segment at the end"):
        assert classify(text) == "bad_response", text
    assert classify("stream disconnected before completion: error sending request for url") == "connection"


# ---------------------------------------------------------------------------
# Prices and routing


def test_prices_aliases_unknown_models_and_override(tmp_path, monkeypatch):
    monkeypatch.delenv("HARNESS_PRICES", raising=False)
    assert pricing.resolve_model("spark") == "gpt-5.3-codex-spark"
    assert pricing.cost_usd("gpt-5.4", 1_000_000, 0, 0) == pytest.approx(2.50)
    assert pricing.cost_usd("gpt-5.4", 1_000_000, 1_000_000, 1_000_000) == pytest.approx(0.25 + 15.0)
    assert pricing.cost_usd("no-such-model", 1000, 0, 10) is None
    for model in ("gpt-5.3-codex", "gpt-5.2", "gpt-5-mini", "claude-opus-4-6", "claude-sonnet-4-6",
                  "claude-haiku-4-5"):
        assert pricing.price(model) is not None, model
    prices = tmp_path / "p.toml"
    prices.write_text('[models."gpt-5.3-codex-spark"]\ninput = 1.0\noutput = 4.0\n')
    try:
        pricing.set_prices_file(prices)
        assert pricing.cost_usd("spark", 1_000_000, 500_000, 0) == pytest.approx(1.0)  # cached at input price
    finally:
        pricing.set_prices_file(None)
    assert pricing.cost_usd("spark", 1, 0, 0) is None
    bad = tmp_path / "bad.toml"
    bad.write_text('[models."x"]\ninput = "cheap"\n')
    with pytest.raises(Exception, match="numeric input and output"):
        pricing.set_prices_file(bad)


def test_routing_mismatch():
    manifest = {"agent": "openai", "model": "gpt-5.4",
                "researcher": {"base_url": "http://a/v1", "key_fingerprint": "abcd1234"}}
    same = {"base_url": "http://a/v1", "key_fingerprint": "abcd1234"}
    assert routing_mismatch(manifest, "openai", "gpt-5.4", same) == []
    assert routing_mismatch({}, "openai", "gpt-5.4", same) == []
    changed = routing_mismatch(manifest, "codex", "gpt-5.2", {"base_url": "http://b/v1", "key_fingerprint": None})
    assert [c.split()[0] for c in changed] == ["backend", "model", "base", "key"]
    # A manifest that records the provider, host and key variable: a change of any is named, both values.
    old = {"agent": "codex", "model": "m", "researcher": {"provider": "harness", "base_url": "http://127.0.0.1:1/v1",
                                                         "base_url_host": "127.0.0.1:1", "key_var": "OPENAI_API_KEY",
                                                         "key_fingerprint": None}}
    now = dict(old["researcher"], provider="openai", base_url=None, base_url_host=None)
    changed = routing_mismatch(old, "codex", "m", now)
    assert changed[0] == "provider 'harness' -> 'openai'" and len(changed) == 3


def test_a_researcher_report_that_is_not_a_count_is_unknown_never_a_number():
    negative = parse_command_output('{"input_tokens": 10, "output_tokens": 3, "cost_usd": -5, "description": "x"}')
    assert negative.usage.known and negative.usage.input_tokens == 10 and negative.usage.cost_usd is None
    assert negative.problems == ("cost_usd '-5' is not a non-negative number",)
    for bad in ('"lots"', "-1", "1.5", "true", "NaN"):
        out = parse_command_output(f'{{"input_tokens": {bad}, "output_tokens": 3, "cost_usd": 0.25}}')
        assert not out.usage.known and out.usage.cells() == (None, None, None), bad  # unknown, not 0
        assert out.usage.cost_usd == 0.25 and out.problems and "input_tokens" in out.problems[0], bad
    clean = parse_command_output('{"input_tokens": 10, "output_tokens": 3, "cost_usd": 0}')
    assert clean.problems == () and clean.usage.known and clean.usage.cost_usd == 0.0


def test_a_description_is_printable_text_cut_to_a_line():
    from harness.agents.base import DESCRIPTION_CHARS, printable
    garbage = "tuned lr\x00\x1b[31m\x07 \ufffe" + "\x8f" * 5 + "\tand\nwarmup"
    assert printable(garbage) == "tuned lr??[31m? ?????? and warmup"
    assert len(printable("x" * 5000)) == DESCRIPTION_CHARS and printable("x" * 5000).endswith("...")


# ---------------------------------------------------------------------------
# Cache writes, retries with a named delay, edits that failed (shapes the real CLIs print)

def test_cache_writes_are_priced_by_their_lifetime():
    # claude-sonnet-4-5: $3 input, $0.30 a cache read, $3.75 a 5-minute write, $6 a 1-hour write, $15 output.
    usd = pricing.cost_usd("claude-sonnet-4-5", 3000, 1000, 70, cache_write_tokens=1500, cache_write_1h_tokens=500)
    assert usd == pytest.approx((500 * 3 + 1000 * 0.30 + 1000 * 3.75 + 500 * 6 + 70 * 15) / 1e6)
    # OpenAI has no write price: writes cost input.
    assert pricing.cost_usd("gpt-5.4", 3000, 1000, 70, cache_write_tokens=1500) == pricing.cost_usd(
        "gpt-5.4", 3000, 1000, 70)


def test_claude_result_splits_its_cache_writes_by_lifetime():
    result = {"type": "result", "subtype": "success", "is_error": False, "result": "done\nlower LR",
              "total_cost_usd": 0.028878,
              "usage": {"input_tokens": 1500, "cache_creation_input_tokens": 4500, "cache_read_input_tokens": 3000,
                        "output_tokens": 210, "cache_creation": {"ephemeral_1h_input_tokens": 1500,
                                                                 "ephemeral_5m_input_tokens": 3000}},
              "modelUsage": {"claude-sonnet-4-5": {"inputTokens": 1511, "outputTokens": 213,
                                                   "cacheReadInputTokens": 3000, "cacheCreationInputTokens": 4500}}}
    out = parse_claude_result(json.dumps(result))
    u = out.usage
    assert (u.input_tokens, u.cached_tokens, u.output_tokens) == (1511 + 3000 + 4500, 3000, 213)
    assert (u.cache_write_tokens, u.cache_write_1h_tokens) == (4500, 1500)
    table, source = pricing.call_cost("claude-sonnet-4-5", u)
    assert source == "table" and table == pytest.approx(0.028878)  # what claude itself computed
    assert pricing.cost_difference("claude-sonnet-4-5", u) is None
    assert pricing.cost_difference("claude-haiku-4-5", u) is not None  # another price: both kept


def test_gemini_counts_its_retries_after_a_named_delay_as_a_rate_limit():
    stderr = ("Attempt 1 failed: Resource has been exhausted. Please retry in 1s.. Retrying after 1043ms...\n"
              "Attempt 2 failed: Resource has been exhausted. Please retry in 1s.. Retrying after 2210ms...\n")
    out = parse_gemini_output("", stderr)
    assert out.retries == 2 and classify(out.error) == "rate_limit", out


def test_a_failed_edit_is_read_from_each_cli():
    codex = "\n".join(json.dumps(e) for e in [
        {"type": "item.completed", "item": {"type": "file_change", "changes": [{"path": "/w/train.py"}],
                                            "status": "failed"}},
        {"type": "item.completed", "item": {"type": "agent_message", "text": "lower VALUE to 0.9"}},
        {"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 2}}])
    out = parse_codex_events(codex, "2026-12-02T04:28:52Z ERROR codex_core::tools::router: error=apply_patch "
                                    "verification failed: Failed to find expected lines in /w/train.py:\nVALUE = 1\n")
    assert out.edit_failures[0] == "its change of train.py failed"
    assert out.edit_failures[1].startswith("apply_patch verification failed")
    assert out.error is None and out.description == "lower VALUE to 0.9"
    gemini = json.dumps({"response": "lower VALUE to 0.9", "stats": {"tools": {"byName": {"replace": {"fail": 1}}}}})
    out = parse_gemini_output(gemini, "Error executing tool replace: Error: Could not find an exact match\n")
    assert out.edit_failures == ("its replace failed 1x (Error: Could not find an exact match)",)
