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
    {"do": "edit", "stale": true}  an edit whose old text is not in train.py: the CLI's tool fails,
                              and the final message still says it changed the constant

With `"call": true` a behaviour holds for every fresh request of the same conversation (the
CLI's own retries of one call, however many it makes before it gives up or is killed); the
first request of another conversation (the next iteration's call) moves on to the next one.

Requests the CLI makes on the side (no tools offered: titles, quota probes) get a short
text answer with small usage, recorded like every other. The formats are in llm_wires.py.
Standard library only.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from llm_wires import SIDE_USAGE, WIRES, Wire, lowered, train_py, usage_of  # beside this file

HANG_S = 3600.0  # s a hanging answer waits (the client gives up long before)


class Script:
    """The behaviours from DIR/script.json, consumed one per fresh request; the request log."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.lock = threading.Lock()
        self.used = 0  # fresh requests answered so far under the current script
        self.text = "[]"
        self.held: tuple[str, dict[str, Any]] | None = None  # (conversation, behaviour) of a "call" entry

    def next(self, conversation: str) -> dict[str, Any]:
        with self.lock:
            path = self.folder / "script.json"
            text = path.read_text() if path.exists() else "[]"
            if text != self.text:  # a new script starts from its first behaviour
                self.text, self.used, self.held = text, 0, None
            if self.held is not None and self.held[0] == conversation:  # the same call, retried
                return self.held[1]
            entries = json.loads(text)
            flat = []
            for entry in entries:
                entry = {"do": entry} if isinstance(entry, str) else entry
                flat += [entry] * int(entry.get("times", 1))
            behaviour = flat[self.used] if self.used < len(flat) else {"do": "edit"}
            self.used += 1
            self.held = (conversation, behaviour) if behaviour.get("call") else None
            return behaviour

    def record(self, **data: Any) -> None:
        with self.lock, open(self.folder / "requests.jsonl", "a") as f:
            f.write(json.dumps(data) + "\n")


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
            behaviour = self.script.next(wire.conversation(body))
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
            if change and behaviour.get("stale"):  # an edit of a line that is not in the file: it fails
                change = (change[0] + "  # a line that is not there", change[1])
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
        stream = self.wire.streams(self.path)
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
