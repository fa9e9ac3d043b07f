"""The wire formats of tests/fakes/llm_server.py: what each CLI's API looks like on the wire.

OpenAI Responses (codex), Anthropic Messages (claude), Gemini streamGenerateContent (gemini):
a tool call that edits train.py through the CLI's own tool, the final message, errors, usage.
Our tool calls' ids carry what the follow-up request needs (see _call_id). Standard library only.
"""
from __future__ import annotations

import hashlib
import json
import re
import uuid
from pathlib import Path
from typing import Any

SIDE_USAGE = {"input_tokens": 11, "cached_tokens": 0, "output_tokens": 3}
EDIT_MARK = "harness-edit"  # in our tool call ids, to recognise the follow-up
FINAL_TEXT = "I changed one constant.\n\n"


def usage_of(behaviour: dict[str, Any]) -> dict[str, int]:
    """The usage a behaviour reports. input_tokens counts everything sent (cache reads and writes
    included); cache_write_tokens (Anthropic only) are written to the cache, the 1-hour part of them
    cache_write_1h_tokens."""
    usage = {"input_tokens": int(behaviour.get("input_tokens", 1000)),
             "cached_tokens": int(behaviour.get("cached_tokens", 0)),
             "output_tokens": int(behaviour.get("output_tokens", 50))}
    for key in ("cache_write_tokens", "cache_write_1h_tokens"):
        if behaviour.get(key):
            usage[key] = int(behaviour[key])
    return usage


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


def sse(kind: str | None, data: dict[str, Any]) -> bytes:
    head = f"event: {kind}\n" if kind else ""
    return (head + f"data: {json.dumps(data)}\n\n").encode()


class Wire:
    content_type = "text/event-stream"
    messages_key = ""  # the field of a request that holds its conversation

    def streams(self, path: str) -> bool:
        """Whether the answer at path is an event stream (else one JSON body)."""
        return True

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

    def conversation(self, body: dict[str, Any]) -> str:
        """The conversation a fresh request opens (the prompt): the same for the CLI's retries of one
        call, another for the next iteration's call (its prompt carries the ledger's new row)."""
        return hashlib.sha256(json.dumps(body.get(self.messages_key), sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------------------
# OpenAI Responses (codex): SSE events, tool calls as function_call output items


class ResponsesWire(Wire):
    messages_key = "input"

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
    messages_key = "messages"

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
        writes, long_writes = usage.get("cache_write_tokens", 0), usage.get("cache_write_1h_tokens", 0)
        start = {"type": "message_start", "message": {
            "id": mid, "type": "message", "role": "assistant", "model": body.get("model"), "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": usage["input_tokens"] - usage["cached_tokens"] - writes,
                      "cache_creation_input_tokens": writes, "cache_read_input_tokens": usage["cached_tokens"],
                      "cache_creation": {"ephemeral_5m_input_tokens": writes - long_writes,
                                         "ephemeral_1h_input_tokens": long_writes},
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
    messages_key = "contents"

    def streams(self, path: str) -> bool:
        return "alt=sse" in path

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
