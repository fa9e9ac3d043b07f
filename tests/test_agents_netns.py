"""The loopback-only namespace the real CLIs run in: nothing but 127.0.0.1 answers, at once, and
every attempt to reach anything else is recorded (tests/fakes/egress.py)."""
from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import pytest

from fakes.netns import Netns, describe, unavailable

PROBE = """
import errno, socket, sys, time
for address in (("93.184.216.34", 443), ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", 80)):
    start = time.monotonic()
    try:
        socket.create_connection(address, timeout=10)
        print("connected")
    except OSError as e:
        print(errno.errorcode.get(e.errno, e.errno), round(time.monotonic() - start, 2))
try:
    socket.getaddrinfo("example.com", 443)
    print("resolved")
except OSError:
    print("unresolved")
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 123))
"""


@pytest.fixture
def ns(tmp_path: Path):
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    ns = Netns.start(tmp_path / "egress.jsonl")
    yield ns
    ns.stop()


def test_other_hosts_fail_at_once_are_recorded_and_the_server_is_only_inside(ns: Netns, tmp_path: Path):
    server = ns.server("responses", tmp_path / "server")
    inside = ns.run([sys.executable, "-c", f"import urllib.request as u\ntry:\n u.urlopen('{server.url('/v1/x')}')\n"
                     f"except Exception as e: print(getattr(e, 'code', e))"], capture_output=True, text=True, timeout=60)
    assert inside.stdout.strip() == "404"  # the scripted server answers inside the namespace
    assert ns.attempts() == []  # and talking to it is no attempt to leave
    with pytest.raises(OSError):  # it is not on this machine's own loopback
        urllib.request.urlopen(server.url("/v1/x"), timeout=5)
    assert server.requests()[0]["path"] == "/v1/x"
    mark = ns.mark()
    done = ns.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    v4, v6, lookup = done.stdout.split("\n")[:3]
    for line in (v4, v6):  # refused at once: loudly, not a hang, and nothing left the machine
        assert line.split()[0] == "ECONNREFUSED" and float(line.split()[1]) < 2, done.stdout
    assert lookup == "unresolved"
    seen = [describe(entry) for entry in ns.attempts(mark)]
    for attempt in ("tcp 93.184.216.34:443", "tcp 2606:2800:21f:cb07:6820:80da:af6b:8b2c:80",
                    "dns A example.com", "udp 8.8.8.8:123"):
        assert attempt in seen, seen
    assert all(entry["server"] for entry in ns.attempts(mark) if entry["kind"] == "dns")
