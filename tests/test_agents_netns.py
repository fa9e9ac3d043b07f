"""The loopback-only namespace the real CLIs run in: nothing but 127.0.0.1 answers, at once."""
from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import pytest

from fakes.netns import Netns, unavailable

PROBE = """
import errno, socket, sys, time
start = time.monotonic()
try:
    socket.create_connection((sys.argv[1], 443), timeout=10)
    print("connected")
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno), round(time.monotonic() - start, 2))
try:
    socket.getaddrinfo("api.openai.com", 443)
    print("resolved")
except OSError:
    print("unresolved")
"""


@pytest.fixture
def ns():
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    ns = Netns.start()
    yield ns
    ns.stop()


def test_other_hosts_fail_at_once_and_the_server_is_only_inside(ns: Netns, tmp_path: Path):
    done = ns.run([sys.executable, "-c", PROBE, "93.184.216.34"], capture_output=True, text=True, timeout=60)
    unreachable, unresolved = done.stdout.split("\n")[:2]
    assert unreachable.split()[0] == "ENETUNREACH" and float(unreachable.split()[1]) < 2  # loudly, not a hang
    assert unresolved == "unresolved"
    server = ns.server("responses", tmp_path / "server")
    inside = ns.run([sys.executable, "-c", f"import urllib.request as u\ntry:\n u.urlopen('{server.url('/v1/x')}')\n"
                     f"except Exception as e: print(getattr(e, 'code', e))"], capture_output=True, text=True, timeout=60)
    assert inside.stdout.strip() == "404"  # the scripted server answers inside the namespace
    with pytest.raises(OSError):  # and is not on this machine's own loopback
        urllib.request.urlopen(server.url("/v1/x"), timeout=5)
    assert server.requests()[0]["path"] == "/v1/x"
