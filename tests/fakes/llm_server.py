#!/usr/bin/env python3
"""A scripted LLM server on 127.0.0.1 that speaks the wire formats the real researcher CLIs use.

    python llm_server.py --wire responses|anthropic|gemini --dir DIR

It runs as its own process so that it can start inside the loopback-only network namespace
of the CLI under test (tests/fakes/netns.py). DIR holds:

    script.json    the behaviours, one per *fresh* request, in order (read at each request;
                   a rewritten script starts again from its first); when it runs out: "edit"
    requests.jsonl one line per request: path, the behaviour used, the usage reported
    port           the port, written once the server listens

A fresh request is one that does not carry the result of our own edit tool call. Its
behaviour is one of:

    {"do": "edit", "input_tokens": N, "cached_tokens": N, "output_tokens": N}
        answer with a tool call that lowers `VALUE = x` in train.py (through the CLI's own
        edit tool); the follow-up request that carries the tool's result gets the final
        message, "lower VALUE to y", with the same usage again
    {"do": "status", "status": 429|500|529, "message": "...", "times": N}
        an error response, N requests in a row (a storm)
    {"do": "hang"}            the headers, then nothing until the client gives up
    {"do": "garbage"}         a 200 whose body is no event stream of the format
    {"do": "edit_then_hang"}  the edit tool call, then hang on the follow-up

Requests the CLI makes on the side (no tools offered: titles, quota probes) get a short
text answer with small usage, recorded like every other. Standard library only.
"""
from __future__ import annotations

import argparse
import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HANG_S = 3600.0  # s a hanging answer waits (the client gives up long before)
SIDE_USAGE = {"input_tokens": 11, "cached_tokens": 0, "output_tokens": 3}
EDIT_MARK = "harness-edit"  # in our tool call ids, to recognise the follow-up
FINAL_TEXT = "I changed one constant.\n\n"


class Script:
    """The behaviours from DIR/script.json, consumed one per fresh request; the request log."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.lock = threading.Lock()
        self.used = 0  # fresh requests answered so far under the current script
        self.text = "[]"

    def next(self) -> dict[str, Any]:
        with self.lock:
            path = self.folder / "script.json"
            text = path.read_text() if path.exists() else "[]"
            if text != self.text:  # a new script starts from its first behaviour
                self.text, self.used = text, 0
            entries = json.loads(text)
            flat = []
            for entry in entries:
                entry = {"do": entry} if isinstance(entry, str) else entry
                flat += [entry] * int(entry.get("times", 1))
            behaviour = flat[self.used] if self.used < len(flat) else {"do": "edit"}
            self.used += 1
            return behaviour

    def record(self, **data: Any) -> None:
        with self.lock, open(self.folder / "requests.jsonl", "a") as f:
            f.write(json.dumps(data) + "\n")


def usage_of(behaviour: dict[str, Any]) -> dict[str, int]:
    return {"input_tokens": int(behaviour.get("input_tokens", 1000)),
            "cached_tokens": int(behaviour.get("cached_tokens", 0)),
            "output_tokens": int(behaviour.get("output_tokens", 50))}


def lowered(text: str) -> tuple[str, str] | None:
    """(old line, new line) for the first `VALUE = x` in text, x lowered by 0.1."""
    m = re.search(r"^VALUE = ([-+0-9.eE]+)(.*)$", text, re.M)
    if not m:
        return None
    return m.group(0), f"VALUE = {round(float(m.group(1)) - 0.1, 6)!r}{m.group(2)}"


def train_py(workdir: str | None) -> str:
    try:
        return Path(workdir or ".", "train.py").read_text()
    except OSError:
        return ""


# ---------------------------------------------------------------------------
# One handler for all wires; the wire modules below say what the bytes look like


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wire: "Wire"
    script: Script

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self.script.record(method="GET", path=self.path, behaviour="get", usage=None)
        self._json(404, {"error": {"message": "not here", "type": "not_found_error"}})

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {}
        wire = self.wire
        body["__path"] = self.path  # for a wire whose answer's shape depends on the endpoint
        side = wire.is_side_request(self.path, body)
        follow = None if side else wire.edit_result(body)
        if side:
            behaviour = {"do": "side", **SIDE_USAGE}
        elif follow is not None:
            behaviour = {"do": "final", **follow}
        else:
            behaviour = self.script.next()
        kind = behaviour["do"]
        reported = None
        key_header = wire.key_header(self.headers)
        if kind == "status":
            self.script.record(path=self.path, behaviour=kind, status=behaviour["status"], usage=None, key=key_header)
            self._json(int(behaviour["status"]), wire.error_body(int(behaviour["status"]),
                                                                 behaviour.get("message", "scripted failure")))
            return
        if kind == "hang" or (kind == "final" and follow.get("hang") and follow.get("next") == "final"):
            self.script.record(path=self.path, behaviour="hang", usage=None, key=key_header)
            self._start_stream()
            time.sleep(HANG_S)
            return
        if kind == "garbage":
            self.script.record(path=self.path, behaviour=kind, usage=None, key=key_header)
            data = b"<html>502 bad gateway, or so</html>\n"
            self.send_response(200)
            self.send_header("Content-Type", wire.content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        usage = usage_of(behaviour)
        if kind in ("edit", "edit_then_hang"):
            change = lowered(train_py(wire.workdir(body))) or lowered(wire.visible_text(body))
            events = wire.edit_events(body, usage, change, hang_after=kind == "edit_then_hang")
            reported = usage
        elif kind == "final":
            events = wire.follow_events(body, usage, follow)
            reported = usage
        else:  # side
            events = wire.final_events(body, usage, "ok")
            reported = usage
        self.script.record(path=self.path, behaviour=kind, usage=reported, key=key_header,
                           model=body.get("model"))
        self._start_stream()
        for chunk in events:
            self.wfile.write(chunk)
            self.wfile.flush()
        self.close_connection = True

    def _start_stream(self) -> None:
        self.send_response(200)
        stream = "alt=sse" in self.path or not isinstance(self.wire, GeminiWire)
        self.send_header("Content-Type", self.wire.content_type if stream else "application/json")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 429:
            self.send_header("Retry-After", "0")
        self.end_headers()
        self.wfile.write(data)


def sse(kind: str | None, data: dict[str, Any]) -> bytes:
    head = f"event: {kind}\n" if kind else ""
    return (head + f"data: {json.dumps(data)}\n\n").encode()


class Wire:
    content_type = "text/event-stream"

    def is_side_request(self, path: str, body: dict[str, Any]) -> bool:
        return not body.get("tools")

    def key_header(self, headers) -> bool:
        return bool(headers.get("Authorization") or headers.get("x-api-key") or headers.get("x-goog-api-key"))

    def workdir(self, body: dict[str, Any]) -> str | None:
        """The CLI's working directory, as its system prompt or environment context states it."""
        m = re.search(r"<cwd>([^<]+)</cwd>|working directory: (/[^\s\"']+)|"
                      r"Workspace Directories:\**\s*-\s*(/[^\s\"']+)", self.visible_text(body), re.I)
        return next((g for g in m.groups() if g), None) if m else None

    def follow_events(self, body: dict[str, Any], usage: dict[str, int], note: dict[str, Any]) -> list[bytes]:
        """The answer to a request that carries our tool's result: by default, the final message."""
        return self.final_events(body, usage, FINAL_TEXT + note["description"])

    def visible_text(self, body: dict[str, Any]) -> str:
        return json.dumps(body).replace("\\n", "\n")


# ---------------------------------------------------------------------------
# OpenAI Responses (codex): SSE events, tool calls as function_call output items


class ResponsesWire(Wire):
    def is_side_request(self, path: str, body: dict[str, Any]) -> bool:
        return not path.rstrip("/").endswith("/responses") or not body.get("tools")

    def edit_result(self, body: dict[str, Any]) -> dict[str, Any] | None:
        for item in body.get("input") or []:
            if item.get("type") == "function_call_output" and EDIT_MARK in str(item.get("call_id")):
                return _follow(item.get("call_id"))
        return None

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": "server_error" if status >= 500 else "rate_limit_exceeded",
                          "code": None}}

    def _completed(self, rid: str, usage: dict[str, int], output: list) -> bytes:
        return sse("response.completed", {"type": "response.completed", "response": {
            "id": rid, "object": "response", "status": "completed", "output": output,
            "usage": {"input_tokens": usage["input_tokens"],
                      "input_tokens_details": {"cached_tokens": usage["cached_tokens"]},
                      "output_tokens": usage["output_tokens"],
                      "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": usage["input_tokens"] + usage["output_tokens"]}}})

    def edit_events(self, body, usage, change, hang_after=False) -> list[bytes]:
        rid = "resp_" + uuid.uuid4().hex[:12]
        created = sse("response.created", {"type": "response.created", "response": {"id": rid}})
        if change is None:
            return self.final_events(body, usage, "I could not find VALUE in train.py.")
        old, new = change
        patch = f"*** Begin Patch\n*** Update File: train.py\n@@\n-{old}\n+{new}\n*** End Patch"
        call = {"type": "function_call", "id": "fc_" + rid, "call_id": _call_id(usage, hang_after, new),
                "name": "exec_command",
                "arguments": json.dumps({"cmd": f"apply_patch <<'EOF'\n{patch}\nEOF\n"})}
        done = sse("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": call})
        return [created, done, self._completed(rid, usage, [call])]

    def final_events(self, body, usage, text) -> list[bytes]:
        rid = "resp_" + uuid.uuid4().hex[:12]
        message = {"type": "message", "id": "msg_" + rid, "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": text, "annotations": []}]}
        added = dict(message, status="in_progress", content=[])
        return [sse("response.created", {"type": "response.created", "response": {"id": rid}}),
                sse("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                                   "item": added}),
                sse("response.output_text.delta", {"type": "response.output_text.delta", "delta": text,
                                                   "item_id": message["id"], "output_index": 0}),
                sse("response.output_item.done", {"type": "response.output_item.done", "output_index": 0,
                                                  "item": message}),
                self._completed(rid, usage, [message])]


def _call_id(usage: dict[str, int], hang_after: bool, new: str, next_step: str = "final",
             prefix: str = "call_", extra: dict[str, Any] | None = None) -> str:
    """Our tool call's id carries what the follow-up needs: the usage to report, hang or not,
    and what comes next (the final message, or the edit after a read)."""
    note = {"u": usage, "h": hang_after, "d": f"lower {new.split('#')[0].strip()}", "n": next_step, **(extra or {})}
    return f"{prefix}{EDIT_MARK}_" + json.dumps(note, separators=(",", ":")).encode().hex()


def _follow(call_id: str | None) -> dict[str, Any]:
    try:
        note = json.loads(bytes.fromhex(str(call_id).split(f"{EDIT_MARK}_", 1)[1]))
    except (IndexError, ValueError):
        return {"description": "lower VALUE", "next": "final"}
    return {**note["u"], "hang": note["h"], "next": note["n"], "note": note,
            "description": note["d"].replace("lower VALUE = ", "lower VALUE to ")}


# ---------------------------------------------------------------------------
# Anthropic Messages (claude): SSE message_start ... message_stop; tool_use blocks. claude's
# Edit tool wants the file read first, so an edit is Read, then Edit, then the final text.


class AnthropicWire(Wire):
    def is_side_request(self, path: str, body: dict[str, Any]) -> bool:
        return "/messages" not in path or not body.get("tools") or "count_tokens" in path

    def key_header(self, headers) -> bool:
        return bool(headers.get("x-api-key") or headers.get("Authorization"))

    def edit_result(self, body: dict[str, Any]) -> dict[str, Any] | None:
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        content = last.get("content") if isinstance(last.get("content"), list) else []
        for block in content:
            if block.get("type") == "tool_result" and EDIT_MARK in str(block.get("tool_use_id")):
                return _follow(block.get("tool_use_id"))
        return None

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = {429: "rate_limit_error", 529: "overloaded_error", 401: "authentication_error"}.get(
            status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def _message(self, body, usage, blocks: list[dict[str, Any]], stop: str) -> list[bytes]:
        mid = "msg_" + uuid.uuid4().hex[:20]
        start = {"type": "message_start", "message": {
            "id": mid, "type": "message", "role": "assistant", "model": body.get("model"), "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": usage["input_tokens"] - usage["cached_tokens"],
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": usage["cached_tokens"],
                      "output_tokens": 1}}}
        events = [sse("message_start", start)]
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                events += [sse("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": {"type": "text", "text": ""}}),
                           sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                       "delta": {"type": "text_delta", "text": block["text"]}})]
            else:
                head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                events += [sse("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": head}),
                           sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
                               "type": "input_json_delta", "partial_json": json.dumps(block["input"])}})]
            events.append(sse("content_block_stop", {"type": "content_block_stop", "index": index}))
        events += [sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                         "usage": {"output_tokens": usage["output_tokens"]}}),
                   sse("message_stop", {"type": "message_stop"})]
        return events

    def edit_events(self, body, usage, change, hang_after=False) -> list[bytes]:
        if change is None:
            return self.final_events(body, usage, "I could not find VALUE in train.py.")
        path = str(Path(self.workdir(body) or ".") / "train.py")
        old, new = change
        tool_id = _call_id(usage, hang_after, new, "edit", "toolu_", {"p": path, "o": old, "w": new})
        return self._message(body, usage, [{"type": "text", "text": "Let me read train.py first."},
                                           {"type": "tool_use", "id": tool_id, "name": "Read",
                                            "input": {"file_path": path}}], "tool_use")

    def follow_events(self, body, usage, note) -> list[bytes]:
        if note["next"] != "edit":
            return super().follow_events(body, usage, note)
        raw = note["note"]
        tool_id = _call_id(usage, note["hang"], raw["w"], "final", "toolu_")
        return self._message(body, usage, [{"type": "tool_use", "id": tool_id, "name": "Edit", "input": {
            "file_path": raw["p"], "old_string": raw["o"], "new_string": raw["w"]}}], "tool_use")

    def final_events(self, body, usage, text) -> list[bytes]:
        return self._message(body, usage, [{"type": "text", "text": text}], "end_turn")


# ---------------------------------------------------------------------------
# Gemini (gemini-cli): streamGenerateContent?alt=sse, `data:` chunks of GenerateContentResponse;
# tool calls are functionCall parts (the `replace` tool edits a file); usageMetadata per chunk.


class GeminiWire(Wire):
    def is_side_request(self, path: str, body: dict[str, Any]) -> bool:
        return ":streamGenerateContent" not in path or not body.get("tools")

    def key_header(self, headers) -> bool:
        return bool(headers.get("x-goog-api-key"))

    def edit_result(self, body: dict[str, Any]) -> dict[str, Any] | None:
        contents = body.get("contents") or []
        last = contents[-1] if contents else {}
        for part in last.get("parts") or []:
            response = part.get("functionResponse")
            if response and EDIT_MARK in str(response.get("id")):
                return _follow(response.get("id"))
        return None

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        name = {429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}.get(status, "UNKNOWN")
        return {"error": {"code": status, "message": message, "status": name}}

    def _chunk(self, body, usage, parts: list[dict[str, Any]]) -> bytes:
        data = {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": usage["input_tokens"],
                                  "cachedContentTokenCount": usage["cached_tokens"],
                                  "candidatesTokenCount": usage["output_tokens"],
                                  "totalTokenCount": usage["input_tokens"] + usage["output_tokens"]},
                "modelVersion": "scripted"}
        if ":streamGenerateContent" not in body.get("__path", ""):
            return json.dumps(data).encode()  # generateContent: one JSON body
        return sse(None, data)

    def edit_events(self, body, usage, change, hang_after=False) -> list[bytes]:
        if change is None:
            return self.final_events(body, usage, "I could not find VALUE in train.py.")
        old, new = change
        path = str(Path(self.workdir(body) or ".") / "train.py")
        call = {"name": "replace", "id": _call_id(usage, hang_after, new), "args": {
            "file_path": path, "instruction": "Lower VALUE by 0.1.", "old_string": old, "new_string": new}}
        return [self._chunk(body, usage, [{"functionCall": call}])]

    def final_events(self, body, usage, text) -> list[bytes]:
        return [self._chunk(body, usage, [{"text": text}])]


WIRES = {"responses": ResponsesWire, "anthropic": AnthropicWire, "gemini": GeminiWire}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wire", choices=sorted(WIRES), required=True)
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    handler = type("H", (Handler,), {"wire": WIRES[args.wire](), "script": Script(args.dir)})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    tmp = args.dir / "port.tmp"
    tmp.write_text(str(httpd.server_address[1]))
    tmp.rename(args.dir / "port")
    httpd.serve_forever()


if __name__ == "__main__":
    main()
