"""The built-in researcher over the `openai` package: Responses API, or Chat Completions.

One request per iteration, plus at most `repair_turns` follow-ups when the edit does not
apply (the failure text goes back to the model). Retries are the openai client's own
(`max_retries`; it retries 408, 409, 429, 5xx, timeouts and lost connections, waits
`Retry-After`/`retry-after-ms` up to 120 s, else 0.5 s doubling to 8 s with jitter). The
harness watches them through event hooks on the client's http client (`Attempts`): the
`X-Stainless-Retry-Count` header the client sends on every attempt makes the ledger's
`retries` exact; a retry is logged; none is sent after the task's cancel event or past the
invocation's deadline (the hook raises an OpenAIError, which the client passes on as it is,
without retrying or sleeping again), and every attempt's timeout ends at the deadline. What the client cannot
know is said in its response headers: `x-should-retry: false` on a 429 for
`insufficient_quota` (waiting brings no credit) and on a `Retry-After` that ends past the
deadline. The call runs in a thread the caller abandons at once on a cancel or at the
deadline (the client's wait before a retry is a plain sleep). A failed request has no usage,
so a retry never counts tokens twice; usage is summed over the turns that answered.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

import openai

from ..errors import AgentError
from .base import Proposal, Task, Usage, key_fingerprint
from .cli import cost_source, url_host
from .edits import FORMAT_HELP, EditError, apply_edits

DEFAULT_BASE_URL = "https://api.openai.com/v1"
WIRE_APIS = ("responses", "chat")
REQUEST_TIMEOUT_S = 600.0  # s per request (reasoning models can think for minutes)
MAX_RETRIES = 4  # the client's retries of one request after a 429, 5xx, timeout or lost connection
REPAIR_TURNS = 2  # follow-up requests when an edit does not apply
RETRY_COUNT_HEADER = "x-stainless-retry-count"  # the openai client's attempt number, on every request
MAX_FILE_CHARS = 200_000  # chars of one editable file sent to the model
CANCEL_POLL_S = 0.05  # s between looks at the cancel event while a request is in flight

SYSTEM = ("You are an ML researcher in an automated research loop. You read the research program, "
          "the recent results and the current code, and propose ONE change to the editable files "
          "that you expect to improve the metric. You cannot run anything; the harness trains and "
          "judges your change.\n\n" + FORMAT_HELP)


# ---------------------------------------------------------------------------
# The wire formats (pure: dicts in, values out)


def responses_text(data: dict[str, Any]) -> str:
    parts = []
    for item in data.get("output") or []:
        if item.get("type") == "message":
            for content in item.get("content") or []:
                if content.get("type") == "output_text":
                    parts.append(content.get("text") or "")
    return "".join(parts)


def responses_usage(data: dict[str, Any]) -> Usage:
    """Responses usage: input_tokens includes the cached ones; output_tokens includes reasoning."""
    u = data.get("usage") or {}
    cached = (u.get("input_tokens_details") or {}).get("cached_tokens") or 0
    return Usage(u.get("input_tokens") or 0, cached, u.get("output_tokens") or 0)


def chat_text(data: dict[str, Any]) -> str:
    choices = data.get("choices") or []
    return ((choices[0].get("message") or {}).get("content") or "") if choices else ""


def chat_usage(data: dict[str, Any]) -> Usage:
    """Chat usage: prompt_tokens includes the cached ones; completion_tokens includes reasoning."""
    u = data.get("usage") or {}
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Usage(u.get("prompt_tokens") or 0, cached, u.get("completion_tokens") or 0)


def user_message(task: Task, files: dict[str, str]) -> str:
    parts = [task.prompt.rstrip(), "", "## The current editable files"]
    for path, text in files.items():
        if len(text) > MAX_FILE_CHARS:
            text = text[:MAX_FILE_CHARS] + "\n... (cut)\n"
        parts += ["", path, "```", text.rstrip("\n"), "```"]
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------------
# Errors: what is retried, and what each failure means


def _status(e: Exception) -> int | None:
    return getattr(e, "status_code", None)


def error_kind(e: Exception) -> str:
    if isinstance(e, openai.APITimeoutError):
        return "timeout"
    if isinstance(e, openai.APIConnectionError):
        return "connection"
    status = _status(e)
    return {401: "auth", 403: "auth", 404: "not_found", 429: "rate_limit"}.get(
        status, "server" if status and status >= 500 else "bad_request" if status else "agent")


def describe_error(e: Exception) -> str:
    status = _status(e)
    body = getattr(e, "body", None)
    message = getattr(e, "message", None) or str(e) or type(e).__name__
    code = None
    if isinstance(body, dict):
        body = body.get("error", body) if isinstance(body.get("error"), dict) else body
        message, code = body.get("message") or message, body.get("code")
    if not status:
        return f"{type(e).__name__}: {message}"
    return f"HTTP {status}" + (f" {code}" if code else "") + f": {message}"


def retry_after_s(headers) -> float | None:
    """The server's wait before a retry, in seconds (retry-after-ms, then retry-after in seconds)."""
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return float(value) * scale
            except ValueError:
                return None
    return None


def body_error(response) -> tuple[str, str | None]:
    """(message, code) of an error response's JSON body, as the API sends it."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300], None
    error = body.get("error", body) if isinstance(body, dict) else {}
    error = error if isinstance(error, dict) else {"message": str(error)}
    return str(error.get("message") or "")[:300], error.get("code")


# ---------------------------------------------------------------------------
# The researcher


class Cancelled(openai.OpenAIError):
    """The task's cancel event was set: no further request or retry. An OpenAIError, because the
    client passes those on from an event hook as they are, without retrying or waiting."""

    def __init__(self, in_flight: bool = False):
        super().__init__("cancelled")
        self.in_flight = in_flight  # a request was abandoned mid-way


class OutOfTime(openai.OpenAIError):
    """The invocation's deadline has passed: no further request or retry (an OpenAIError, as above)."""

    def __init__(self):
        super().__init__("no time left for the request within --agent-timeout")


class Attempts:
    """One invocation's requests, as the http client's event hooks see them (see the module docstring)."""

    def __init__(self, deadline: float, cancel: threading.Event | None, log, max_retries: int):
        self.deadline, self.cancel, self.log, self.max_retries = deadline, cancel, log, max_retries
        self.retries = 0  # retries sent, over every request of the invocation
        self.attempt = 0  # of the current request (a client without the retry-count header: counted here)
        self._sent: tuple[float, float] | None = None  # (when, timeout s) of the attempt awaiting its answer

    def hooks(self) -> dict[str, list]:
        return {"request": [self.on_request], "response": [self.on_response]}

    def in_flight(self) -> bool:
        return self._sent is not None and time.monotonic() < self._sent[0] + self._sent[1]

    def on_request(self, request) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled()
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise OutOfTime()
        timeouts = request.extensions.get("timeout") or {}  # this attempt's timeouts end at the deadline
        request.extensions["timeout"] = {k: remaining if v is None else min(v, remaining) for k, v in timeouts.items()}
        attempt = int(request.headers.get(RETRY_COUNT_HEADER) or self.attempt)
        self.attempt += 1
        if attempt:
            unanswered = " (the last attempt got no answer)" if self._sent is not None else ""
            self.retries += 1
            self.log(f"retry {attempt}/{self.max_retries}{unanswered}")
        self._sent = (time.monotonic(), max(request.extensions["timeout"].values(), default=remaining))

    def on_response(self, response) -> None:
        started, self._sent = self._sent, None
        if response.status_code < 400:
            return
        response.read()
        message, code = body_error(response)
        took = time.monotonic() - started[0] if started else 0.0
        self.log(f"request failed after {took:.1f}s: HTTP {response.status_code}"
                 + (f" {code}" if code else "") + f": {message}")
        wait = retry_after_s(response.headers)
        if code == "insufficient_quota":
            response.headers["x-should-retry"] = "false"  # no credit: waiting does not help
        elif wait is not None and time.monotonic() + wait >= self.deadline:
            response.headers["x-should-retry"] = "false"
            self.log(f"not retried: the server's Retry-After ({wait:.2f}s) ends past the deadline")


class OpenAIResearcher:
    name = "openai"

    def __init__(self, model: str | None, wire_api: str = "responses", base_url: str | None = None,
                 api_key: str | None = None, temperature: float | None = None,
                 reasoning_effort: str | None = None, request_timeout: float | None = None,
                 max_retries: int | None = None, repair_turns: int | None = None):
        if not model:
            raise AgentError("--agent openai needs --model (for example --model gpt-5.4).")
        if wire_api not in WIRE_APIS:
            raise AgentError(f"--wire-api must be one of {', '.join(WIRE_APIS)}, got {wire_api!r}.")
        self.model = model
        self.wire_api = wire_api
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key and self.base_url == DEFAULT_BASE_URL:
            raise AgentError("missing key: set OPENAI_API_KEY in the environment (or point --base-url "
                             "at an OpenAI-compatible server that needs no key).")
        self.key_fingerprint = key_fingerprint(key)
        self.temperature = temperature
        self.reasoning_effort = reasoning_effort
        self.request_timeout = float(request_timeout or REQUEST_TIMEOUT_S)
        self.max_retries = MAX_RETRIES if max_retries is None else int(max_retries)
        self.repair_turns = REPAIR_TURNS if repair_turns is None else int(repair_turns)
        # A local server (vLLM, Ollama) needs no key, but the client wants a string.
        self._key = key or "none"

    def _new_client(self, attempts: Attempts) -> openai.OpenAI:
        """A client for one invocation: its retries watched by attempts' hooks."""
        http = openai.DefaultHttpxClient(event_hooks=attempts.hooks())
        return openai.OpenAI(api_key=self._key, base_url=self.base_url, max_retries=self.max_retries,
                             timeout=self.request_timeout, http_client=http)

    def _call(self, client: openai.OpenAI, messages: list[dict[str, str]], attempts: Attempts) -> tuple[str, Usage]:
        """One request with the client's retries, in a thread that is abandoned at once when the
        cancel event is set or the deadline passes (its client is closed; the hooks stop it)."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["value"] = self._request(client, messages, max(0.001, attempts.deadline - time.monotonic()))
            except BaseException as e:  # handed to the caller's thread
                box["error"] = e
            done.set()
        threading.Thread(target=work, daemon=True).start()
        while not done.wait(CANCEL_POLL_S):
            if attempts.cancel is not None and attempts.cancel.is_set():
                in_flight = attempts.in_flight()
                client.close()
                raise Cancelled(in_flight=in_flight)
            if time.monotonic() >= attempts.deadline:
                client.close()
                raise OutOfTime()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def describe(self) -> dict[str, Any]:
        return {"backend": "openai", "model": self.model, "wire_api": self.wire_api,
                "base_url": self.base_url, "temperature": self.temperature,
                "reasoning_effort": self.reasoning_effort, "request_timeout_s": self.request_timeout,
                "max_retries": self.max_retries, "retries_by": "openai client",
                "repair_turns": self.repair_turns, "key_fingerprint": self.key_fingerprint,
                "provider": "openai", "base_url_host": url_host(self.base_url), "key_var": "OPENAI_API_KEY"
                if os.environ.get("OPENAI_API_KEY") else None, "cost_source": cost_source(self.model, reports_cost=False)}

    # --- one request ----------------------------------------------------------------------

    def _request(self, client: openai.OpenAI, messages: list[dict[str, str]], timeout_s: float) -> tuple[str, Usage]:
        if self.wire_api == "responses":
            kwargs: dict[str, Any] = {"model": self.model, "instructions": SYSTEM, "input": messages,
                                      "store": False, "timeout": min(self.request_timeout, timeout_s)}
            if self.temperature is not None:
                kwargs["temperature"] = self.temperature
            if self.reasoning_effort:
                kwargs["reasoning"] = {"effort": self.reasoning_effort}
            data = client.responses.create(**kwargs).model_dump()
            return responses_text(data), responses_usage(data)
        kwargs = {"model": self.model, "messages": [{"role": "system", "content": SYSTEM}, *messages],
                  "timeout": min(self.request_timeout, timeout_s)}
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.reasoning_effort:
            kwargs["reasoning_effort"] = self.reasoning_effort
        data = client.chat.completions.create(**kwargs).model_dump()
        return chat_text(data), chat_usage(data)

    def _turn(self, client: openai.OpenAI, messages, attempts: Attempts, log) -> tuple[str, Usage]:
        """(text, usage) of one turn, or raises the last error, Cancelled or OutOfTime."""
        if attempts.cancel is not None and attempts.cancel.is_set():
            raise Cancelled()
        if time.monotonic() >= attempts.deadline:
            raise OutOfTime()
        start, attempts.attempt = time.monotonic(), 0
        try:
            text, usage = self._call(client, messages, attempts)
        except openai.APIError as e:
            if attempts.cancel is not None and attempts.cancel.is_set():
                raise Cancelled() from None
            log(f"request gave up after {time.monotonic() - start:.1f}s: {describe_error(e)}")
            raise
        log(f"request ok in {time.monotonic() - start:.1f}s: input {usage.input_tokens} "
            f"(cached {usage.cached_tokens}), output {usage.output_tokens} tokens")
        return text, usage

    # --- the invocation --------------------------------------------------------------------

    def propose(self, task: Task) -> Proposal:
        start = time.monotonic()
        deadline = start + task.timeout_s
        task.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(task.log_path, "a", encoding="utf-8")

        def log(text: str) -> None:
            logf.write(text.rstrip("\n") + "\n")
            logf.flush()

        files = {p: (task.worktree / p).read_text() for p in task.editable if (task.worktree / p).is_file()}
        messages = [{"role": "user", "content": user_message(task, files)}]
        usage, attempts = Usage(), Attempts(deadline, task.cancel, log, self.max_retries)
        log(f"openai {self.wire_api} {self.base_url} model {self.model}; prompt {len(messages[0]['content'])} chars")
        turn = 0
        client = self._new_client(attempts)
        try:
            while True:
                try:
                    text, turn_usage = self._turn(client, messages, attempts, log)
                except Cancelled as e:
                    log("cancelled" + (" with a request in flight" if e.in_flight else ""))
                    # A request in flight may be billed but will never say how much: unknown.
                    spent = Usage.unknown() if e.in_flight else usage
                    return Proposal("", spent, time.monotonic() - start, attempts.retries,
                                    error="openai call cancelled", error_kind="cancelled")
                except (openai.APIError, OutOfTime) as e:
                    kind = "timeout" if isinstance(e, OutOfTime) else error_kind(e)
                    detail = str(e) if isinstance(e, OutOfTime) else describe_error(e)
                    return Proposal("", usage, time.monotonic() - start, attempts.retries,
                                    error=f"openai request failed ({kind}): {detail}", error_kind=kind)
                usage = usage + turn_usage
                log(f"--- answer (turn {turn}) ---\n{text}\n--- end of answer ---")
                try:
                    changed, description = apply_edits(files, text)
                except EditError as e:
                    log(f"edit did not apply: {e}")
                    if turn >= self.repair_turns:
                        lines = str(e).splitlines()
                        first = next((x[2:] for x in lines if x.startswith("- ")), lines[0])
                        return Proposal(f"unusable edit after {turn} repair turns: {first}", usage,
                                        time.monotonic() - start, attempts.retries)
                    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": str(e)}]
                    turn += 1
                    continue
                for path, new_text in changed.items():
                    (task.worktree / path).write_text(new_text)
                log(f"applied edits to {', '.join(changed)}: {description}")
                return Proposal(description, usage, time.monotonic() - start, attempts.retries)
        finally:
            client.close()
            logf.close()
