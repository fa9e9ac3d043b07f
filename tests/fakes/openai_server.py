"""A scripted OpenAI-compatible server on 127.0.0.1, for tests and benchmarks.

It speaks POST /v1/responses and POST /v1/chat/completions with the real response shapes
and usage objects. Each request takes the next behaviour from a queue (or the default):

    Reply(text, input_tokens=..., cached_tokens=..., output_tokens=..., reasoning_tokens=...)
    Fail(status, message, code=..., headers=...)     an error response (429, 500, 401, 404)
    Hang(seconds)                                     no response until the client gives up
    a callable(request) -> one of the above           e.g. lower_value, which edits VALUE
                                                      (approx_tokens sizes usage from the request)

Every request is recorded (path, JSON body, whether it carried a bearer token, the client's
attempt number).
Standard library only.
"""
from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass
class Reply:
    text: str
    input_tokens: int = 1200
    cached_tokens: int = 0
    output_tokens: int = 150
    reasoning_tokens: int = 0  # part of output_tokens, as the real API reports them


@dataclass
class Fail:
    status: int
    message: str = "scripted failure"
    code: str | None = None
    type: str = "server_error"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Hang:
    seconds: float = 30.0


@dataclass
class Request:
    path: str
    body: dict[str, Any]
    has_bearer: bool
    retry_count: int | None = None  # the openai client's X-Stainless-Retry-Count: which attempt this was

    def text(self) -> str:
        """All message text of the request (instructions, input or messages) as one string."""
        parts = [self.body.get("instructions") or ""]
        items = self.body.get("input") or self.body.get("messages") or []
        if isinstance(items, str):
            items = [{"content": items}]
        for item in items:
            content = item.get("content")
            if isinstance(content, list):
                content = " ".join(c.get("text", "") for c in content if isinstance(c, dict))
            parts.append(content or "")
        return "\n".join(parts)

    def last_user_text(self) -> str:
        items = self.body.get("input") or self.body.get("messages") or []
        users = [i.get("content") for i in items if isinstance(i, dict) and i.get("role") == "user"]
        return users[-1] if users and isinstance(users[-1], str) else ""


Behaviour = Reply | Fail | Hang | Callable[[Request], Any]


def lower_value(request: Request, step: float = 0.01, **usage: int) -> Reply:
    """A good edit: find `VALUE = x` in the train.py the model was shown, lower it by step."""
    m = re.search(r"^VALUE = ([-+0-9.eE]+)(.*)$", request.text(), re.M)
    if not m:
        return Reply("I could not find VALUE.\nno change")
    old = m.group(0)
    new_value = round(float(m.group(1)) - step, 6)
    new = f"VALUE = {new_value!r}{m.group(2)}"
    return Reply(f"Lower the value.\n\ntrain.py\n<<<<<<< SEARCH\n{old}\n=======\n{new}\n"
                 f">>>>>>> REPLACE\n\nlower VALUE to {new_value}", **usage)


def approx_tokens(text: str) -> int:
    """About four characters per token: enough to show how input grows with the prompt."""
    return max(1, len(text) // 4)


def bad_search(request: Request) -> Reply:
    """An edit that does not apply: its SEARCH text is not in the file."""
    return Reply("train.py\n<<<<<<< SEARCH\nVALUE = 123.456\n=======\nVALUE = 0.5\n"
                 ">>>>>>> REPLACE\nset VALUE to 0.5", input_tokens=1000, output_tokens=40)


class ScriptedServer:
    def __init__(self, default: Behaviour = lower_value, models: set[str] | None = None,
                 keys: set[str] | None = None):
        self.default = default
        self.models = models  # None: any model; else others get 404 model_not_found
        self.keys = keys  # None: any key; else others get 401 invalid_api_key
        self.queue: deque[Behaviour] = deque()
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def push(self, *behaviours: Behaviour) -> "ScriptedServer":
        with self.lock:
            self.queue.extend(behaviours)
        return self

    def start(self) -> "ScriptedServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "ScriptedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- behaviour -------------------------------------------------------------------------

    def _next(self, request: Request) -> Reply | Fail | Hang:
        with self.lock:
            self.requests.append(request)
            behaviour = self.queue.popleft() if self.queue else self.default
        if callable(behaviour) and not isinstance(behaviour, (Reply, Fail, Hang)):
            behaviour = behaviour(request)
        return behaviour

    def _check(self, request: Request, key: str | None) -> Fail | None:
        if self.keys is not None and key not in self.keys:
            return Fail(401, "Incorrect API key provided.", "invalid_api_key", "invalid_request_error")
        model = request.body.get("model")
        if self.models is not None and model not in self.models:
            return Fail(404, f"The model `{model}` does not exist or you do not have access to it.",
                        "model_not_found", "invalid_request_error")
        return None

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    body = {}
                auth = self.headers.get("authorization") or ""
                key = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
                path = self.path.split("?")[0]
                if path not in ("/v1/responses", "/v1/chat/completions"):
                    return self._send(404, {"error": {"message": f"Invalid URL (POST {path})",
                                                      "type": "invalid_request_error", "code": None}})
                attempt = self.headers.get("x-stainless-retry-count")
                request = Request(path, body, key is not None, int(attempt) if attempt else None)
                behaviour = server._check(request, key) or server._next(request)
                if isinstance(behaviour, Hang):
                    server.stopping.wait(behaviour.seconds)
                    return
                if isinstance(behaviour, Fail):
                    error = {"message": behaviour.message, "type": behaviour.type, "param": None,
                             "code": behaviour.code}
                    return self._send(behaviour.status, {"error": error}, behaviour.headers)
                shape = responses_body if path == "/v1/responses" else chat_body
                self._send(200, shape(body.get("model") or "", behaviour))

            def _send(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        return Handler


# ---------------------------------------------------------------------------
# The real shapes


def responses_body(model: str, reply: Reply) -> dict[str, Any]:
    now = int(time.time())
    return {
        "id": f"resp_{now}", "object": "response", "created_at": now, "status": "completed",
        "model": model, "error": None, "incomplete_details": None, "instructions": None,
        "output": [
            {"id": "rs_1", "type": "reasoning", "summary": []},
            {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": reply.text, "annotations": []}]},
        ],
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "usage": {
            "input_tokens": reply.input_tokens,
            "input_tokens_details": {"cached_tokens": reply.cached_tokens},
            "output_tokens": reply.output_tokens,
            "output_tokens_details": {"reasoning_tokens": reply.reasoning_tokens},
            "total_tokens": reply.input_tokens + reply.output_tokens,
        },
    }


def chat_body(model: str, reply: Reply) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "content": reply.text, "refusal": None}}],
        "usage": {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
            "prompt_tokens_details": {"cached_tokens": reply.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": reply.reasoning_tokens, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
        },
    }
