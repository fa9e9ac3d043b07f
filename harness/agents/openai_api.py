"""The built-in researcher over the `openai` package: Responses API, or Chat Completions.

One request per iteration, plus at most `repair_turns` follow-ups when the edit does not
apply (the failure text goes back to the model). 429s, 5xx and timeouts are retried here
(the client's own retries are off, so every retry is counted), with exponential backoff,
until `max_retries` or the invocation's hard timeout. A failed request has no usage, so a
retry never counts tokens twice; usage is summed over the turns that answered.
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
MAX_RETRIES = 4  # retries of one request after a 429, 5xx, timeout or lost connection
REPAIR_TURNS = 2  # follow-up requests when an edit does not apply
BACKOFF_S = 2.0  # s before the first retry, doubling after each; $HARNESS_BACKOFF_S overrides
BACKOFF_MAX_S = 60.0  # s, the longest wait between retries (a server's Retry-After included)
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


def retryable(e: Exception) -> bool:
    if isinstance(e, openai.APIConnectionError):  # includes APITimeoutError
        return True
    status = _status(e)
    if status == 429:
        return getattr(e, "code", None) != "insufficient_quota"  # no credit: waiting does not help
    return status is not None and (status >= 500 or status == 408)


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


def retry_after_s(e: Exception) -> float | None:
    response = getattr(e, "response", None)
    headers = getattr(response, "headers", None) or {}
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return float(value) * scale
            except ValueError:
                return None
    return None


# ---------------------------------------------------------------------------
# The researcher


class Cancelled(Exception):
    """The task's cancel event was set: no further request or retry."""

    def __init__(self, in_flight: bool = False):
        super().__init__("cancelled")
        self.in_flight = in_flight  # a request was abandoned mid-way



class OpenAIResearcher:
    name = "openai"

    def __init__(self, model: str | None, wire_api: str = "responses", base_url: str | None = None,
                 api_key: str | None = None, temperature: float | None = None,
                 reasoning_effort: str | None = None, request_timeout: float | None = None,
                 max_retries: int | None = None, repair_turns: int | None = None,
                 backoff_s: float | None = None):
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
        if backoff_s is None:
            backoff_s = float(os.environ.get("HARNESS_BACKOFF_S") or BACKOFF_S)
        self.backoff_s = float(backoff_s)
        # A local server (vLLM, Ollama) needs no key, but the client wants a string.
        self._key = key or "none"
        self.client = self._new_client()

    def _new_client(self) -> openai.OpenAI:
        return openai.OpenAI(api_key=self._key, base_url=self.base_url, max_retries=0, timeout=self.request_timeout)

    def _cancellable(self, messages: list[dict[str, str]], timeout_s: float,
                     cancel: threading.Event | None) -> tuple[str, Usage]:
        """_request, abandoned at once when cancel is set (its thread ends at the request's timeout,
        its connection is closed with the client)."""
        if cancel is None:
            return self._request(messages, timeout_s)
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["value"] = self._request(messages, timeout_s)
            except BaseException as e:  # handed to the caller's thread
                box["error"] = e
            done.set()
        threading.Thread(target=work, daemon=True).start()
        while not done.wait(CANCEL_POLL_S):
            if cancel.is_set():
                self.client.close()
                raise Cancelled(in_flight=True)
        if "error" in box:
            raise box["error"]
        return box["value"]

    def describe(self) -> dict[str, Any]:
        return {"backend": "openai", "model": self.model, "wire_api": self.wire_api,
                "base_url": self.base_url, "temperature": self.temperature,
                "reasoning_effort": self.reasoning_effort, "request_timeout_s": self.request_timeout,
                "max_retries": self.max_retries, "repair_turns": self.repair_turns,
                "backoff_s": self.backoff_s, "key_fingerprint": self.key_fingerprint,
                "provider": "openai", "base_url_host": url_host(self.base_url), "key_var": "OPENAI_API_KEY"
                if os.environ.get("OPENAI_API_KEY") else None, "cost_source": cost_source(self.model)}

    # --- one request ----------------------------------------------------------------------

    def _request(self, messages: list[dict[str, str]], timeout_s: float) -> tuple[str, Usage]:
        if self.wire_api == "responses":
            kwargs: dict[str, Any] = {"model": self.model, "instructions": SYSTEM, "input": messages,
                                      "store": False, "timeout": timeout_s}
            if self.temperature is not None:
                kwargs["temperature"] = self.temperature
            if self.reasoning_effort:
                kwargs["reasoning"] = {"effort": self.reasoning_effort}
            data = self.client.responses.create(**kwargs).model_dump()
            return responses_text(data), responses_usage(data)
        kwargs = {"model": self.model, "messages": [{"role": "system", "content": SYSTEM}, *messages],
                  "timeout": timeout_s}
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.reasoning_effort:
            kwargs["reasoning_effort"] = self.reasoning_effort
        data = self.client.chat.completions.create(**kwargs).model_dump()
        return chat_text(data), chat_usage(data)

    def _request_with_retries(self, messages, deadline: float, log, counts: dict[str, int], cancel=None):
        """(text, usage) or raises the last error; counts['retries'] grows with each retry."""
        attempt = 0
        while True:
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no time left for the request within --agent-timeout")
            start = time.monotonic()
            try:
                text, usage = self._cancellable(messages, min(self.request_timeout, remaining), cancel)
                log(f"request ok in {time.monotonic() - start:.1f}s: input {usage.input_tokens} "
                    f"(cached {usage.cached_tokens}), output {usage.output_tokens} tokens")
                return text, usage
            except openai.APIError as e:
                if cancel is not None and cancel.is_set():
                    raise Cancelled() from None
                log(f"request failed after {time.monotonic() - start:.1f}s: {describe_error(e)}")
                if not retryable(e) or attempt >= self.max_retries:
                    raise
                wait = retry_after_s(e)
                wait = min(BACKOFF_MAX_S, self.backoff_s * 2 ** attempt if wait is None else wait)
                if time.monotonic() + wait >= deadline:
                    raise
                attempt += 1
                counts["retries"] += 1
                log(f"retry {attempt}/{self.max_retries} in {wait:.2f}s")
                if cancel is not None and cancel.wait(wait):  # the wait ends early on a cancel
                    raise Cancelled() from None
                if cancel is None:
                    time.sleep(wait)

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
        usage, counts = Usage(), {"retries": 0}
        log(f"openai {self.wire_api} {self.base_url} model {self.model}; prompt {len(messages[0]['content'])} chars")
        turn = 0
        if self.client.is_closed():  # an earlier call was cancelled
            self.client = self._new_client()
        try:
            while True:
                try:
                    text, turn_usage = self._request_with_retries(messages, deadline, log, counts, task.cancel)
                except Cancelled as e:
                    log("cancelled" + (" with a request in flight" if e.in_flight else ""))
                    # A request in flight may be billed but will never say how much: unknown.
                    spent = Usage.unknown() if e.in_flight else usage
                    return Proposal("", spent, time.monotonic() - start, counts["retries"],
                                    error="openai call cancelled", error_kind="cancelled")
                except (openai.APIError, TimeoutError) as e:
                    kind = "timeout" if isinstance(e, TimeoutError) else error_kind(e)
                    detail = str(e) if isinstance(e, TimeoutError) else describe_error(e)
                    return Proposal("", usage, time.monotonic() - start, counts["retries"],
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
                                        time.monotonic() - start, counts["retries"])
                    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": str(e)}]
                    turn += 1
                    continue
                for path, new_text in changed.items():
                    (task.worktree / path).write_text(new_text)
                log(f"applied edits to {', '.join(changed)}: {description}")
                return Proposal(description, usage, time.monotonic() - start, counts["retries"])
        finally:
            logf.close()
