"""Fixtures for the tests of the real researcher CLIs (installed by scripts/install_clis.sh).

Each test gets a loopback-only network namespace with a scripted server of the CLI's wire
format in it (netns.py, llm_server.py), a throwaway HOME, and runs `harness` as a real
subprocess inside the same namespace.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from .helpers import rows
from .netns import Netns, Server, describe, unavailable

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".cache" / "npm" / "node_modules" / ".bin"
# Codex refuses to write its helper files under /tmp, so the throwaway homes live in the project,
# or (a checkout under /tmp, as CI's may be) under /var/tmp.
HOMES = (Path("/var/tmp/autoresearch-harness-homes") if str(ROOT.resolve()).startswith("/tmp/")
         else ROOT / ".cache" / "homes")
WIRES = {"codex": "responses", "claude": "anthropic", "gemini": "gemini"}
KEYS = {"codex": ("OPENAI_API_KEY", "sk-test-codex-0123456789abcdef"),
        "claude": ("ANTHROPIC_API_KEY", "sk-ant-test-0123456789abcdef"),
        "gemini": ("GEMINI_API_KEY", "gm-test-0123456789abcdef")}
# The names each CLI looks up at start although --base-url points it at the scripted server, as
# tests/fakes/egress.py records them (docs/researchers.md says what for). The recorder answers
# NXDOMAIN, so none is ever followed by a connection: blocked, recorded, and nothing else allowed.
LOOKUPS = {"codex": {"github.com", "api.github.com", "chatgpt.com", "ab.chatgpt.com"},
           "claude": {"api.anthropic.com"},
           "gemini": {"play.googleapis.com"}}
KEY_NAMES = {"OPENAI_API_KEY", "CODEX_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL",
             "GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GEMINI_BASE_URL", "OPENAI_BASE_URL", "HARNESS_PRICES"}


def executable(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        pytest.skip(f"the real `{name}` is not in .cache/npm: scripts/install_clis.sh could not install it "
                    f"(npm missing or the package unavailable)")
    return path


class Rig:
    """One real CLI, its scripted server and a home, in one namespace."""

    def __init__(self, name: str, ns: Netns, tmp_path: Path):
        self.name = name
        self.executable = executable(name)
        self.ns = ns
        self.server: Server = ns.server(WIRES[name], tmp_path / "server")
        self.home = HOMES / uuid.uuid4().hex[:12]
        self.home.mkdir(parents=True)
        self.key_var, self.key = KEYS[name]
        self.since = ns.mark()  # the attempts to leave the namespace from here on are this rig's

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in KEY_NAMES}
        env.update(HOME=str(self.home), PYTHONPATH=str(ROOT), **{self.key_var: self.key}, **extra)
        return env

    def harness(self, *args, timeout_s: float = 120, **extra_env: str) -> subprocess.CompletedProcess:
        """`python -m harness ARGS` in the namespace, with --agent-executable pointing at the real CLI."""
        argv = [sys.executable, "-m", "harness", *[str(a) for a in args]]
        return self.ns.run(argv, env=self.env(**extra_env), capture_output=True, text=True, timeout=timeout_s)

    def start_harness(self, *args, **extra_env: str) -> subprocess.Popen:
        """`python -m harness ARGS` in the namespace, not waited for (nsenter execs it: the pid is harness's)."""
        argv = [sys.executable, "-m", "harness", *[str(a) for a in args]]
        return subprocess.Popen(self.ns.argv(argv), env=self.env(**extra_env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def egress(self) -> list[str]:
        """What tried to leave the namespace since this rig was made (netns.describe), each once, in order."""
        return list(dict.fromkeys(describe(entry) for entry in self.ns.attempts(self.since)))

    def lookups(self) -> set[str]:
        """The names this CLI looked up so far; fails, listing every attempt, if anything but the
        scripted server was tried: a connection anywhere else, or a name not in LOOKUPS."""
        seen = self.egress()
        names = {a.split()[-1] for a in seen if a.startswith("dns ")}
        strays = [a for a in seen if not a.startswith("dns ") or a.split()[-1] not in LOOKUPS[self.name]]
        assert not strays, f"{self.name} tried to leave the namespace: {strays} (all attempts: {seen})"
        return names

    def leftovers(self) -> list[int]:
        """Processes still alive that run with this rig's HOME (the CLI and anything it started)."""
        mark = f"HOME={self.home}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if mark in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        found.append(int(entry))
            except OSError:
                continue
        return found

    def close(self) -> None:
        self.server.stop()
        shutil.rmtree(self.home, ignore_errors=True)


def fault_matrix(rate_limited: str, status: int, failed: str) -> list:
    """The faults in the order one `harness run` meets them, each held for the whole call (the CLI's own
    retries included): a 429 storm, a 5xx, a hang, a 200 with garbage, an edit then a hang; then a good call."""
    return [{"do": "status", "status": 429, "message": rate_limited, "call": True},
            {"do": "status", "status": status, "message": failed, "call": True},
            {"do": "hang", "call": True}, {"do": "garbage", "call": True}, "edit_then_hang",
            {"do": "edit", "input_tokens": 1000, "cached_tokens": 0, "output_tokens": 10}]


def run_through(rig: Rig, repo: Path, tag: str, args: list, steps: list) -> list[dict]:
    """`harness run ARGS` through the scripted steps, one iteration each: one crash row per fault and the
    loop goes on (five failures in a row would stop it as unhealthy), a keep for the good call at the end."""
    rig.server.script(*steps)
    done = rig.harness(*args, "--iterations", len(steps), "--on-unhealthy", "continue")
    assert done.returncode == 0, done.stderr[-3000:]
    ledger = rows(repo, tag)
    assert [r["status"] for r in ledger] == ["keep"] + ["crash"] * (len(steps) - 1) + ["keep"], ledger
    return ledger[1:]


def assert_killed(rows: list[dict], timeout_s: int) -> None:
    """Rows of calls killed at --agent-timeout before the CLI reported usage: tokens unknown, not 0."""
    for row in rows:
        assert f"did not finish within {timeout_s}s" in row["description"], row
        assert row["input_tokens"] is None and row["output_tokens"] is None, row


@pytest.fixture(scope="module")
def netns(tmp_path_factory):
    reason = unavailable()
    if reason:
        pytest.skip(f"no loopback-only network namespace, so no real CLI may run: {reason}")
    ns = Netns.start(tmp_path_factory.mktemp("netns") / "egress.jsonl")
    yield ns
    ns.stop()
