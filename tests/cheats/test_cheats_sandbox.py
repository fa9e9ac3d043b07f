"""Escapes from the job's sandbox, as root (as CI runs): a train.py that remounts, unmounts, mounts,
unshares, looks for sibling processes and reads every copy of the corpus it can name. Each attempt
is reported by the job itself in its log, and every one must have failed; none may end `keep`.

The copies of the validation bytes it looks for are the ones a real machine has: the harness's own
checkout (an editable install: its data/ and .git), a copy under /var/tmp and one under a home-like
folder outside /tmp, the user's real /tmp and the run folder behind the private /tmp.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from harness.driver import loop as driver
from harness import ledger
from harness.config.load import resolve
from harness.executors import sandbox

from conftest import ScriptedResearcher, git

from .conftest import MAX_STEPS, TIME_BUDGET_S, after_imports, code_cheat, research_repo

pytestmark = pytest.mark.skipif(not sandbox.probe(sandbox.bwrap_path()).works,
                                reason="bubblewrap does not work on this machine (apt install bubblewrap)")
HARNESS_CHECKOUT = Path(sandbox.__file__).resolve().parents[2]  # the source folder of this harness
MARK = "ESCAPE-REPORT"
ESCAPE = '''import ctypes, json, os, subprocess
_libc = ctypes.CDLL(None, use_errno=True)
_r = {"caps": [l for l in open("/proc/self/status") if l.startswith(("CapEff", "CapBnd"))]}
def _sh(*argv):
    try:
        return subprocess.run(list(argv), capture_output=True, timeout=20).returncode
    except OSError as e:
        return "no " + argv[0]
_r["remount /"] = _sh("mount", "-o", "remount,rw", "/")
_r["mount syscall remount"] = _libc.mount(b"none", b"/", None, 32 | 4096, None)  # MS_REMOUNT|MS_BIND
_r["umount /tmp"] = _libc.umount2(b"/tmp", 2)  # MNT_DETACH
_r["umount data/"] = _libc.umount2(os.path.abspath("data").encode(), 2)
_r["tmpfs over data/"] = _libc.mount(b"none", os.path.abspath("data").encode(), b"tmpfs", 0, None)
_r["unshare -Urm"] = _sh("unshare", "-Urm", "true")
for _t in ("/root/escaped-CHEAT", "/etc/escaped-CHEAT", "/usr/escaped-CHEAT"):
    try:
        open(_t, "w").write("x")
        _r["wrote " + _t] = 0
    except OSError as e:
        _r["wrote " + _t] = e.errno
_found = {}
for _p in PATHS:
    try:
        _found[_p] = sorted(os.listdir(_p))[:5] if os.path.isdir(_p) else len(open(_p, "rb").read())
    except OSError as e:
        _found[_p] = e.errno
_r["found"] = _found
_r["processes"] = sorted(open(f"/proc/{p}/cmdline", "rb").read().replace(b"\\0", b" ").decode()[:80]
                         for p in os.listdir("/proc") if p.isdigit())
print("MARK", json.dumps(_r), flush=True)
'''


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Copies of the corpus where a careless machine has them, outside the repo and outside /tmp."""
    corpus = Path(__file__).resolve().parents[2] / "data" / "shakespeare.txt.xz"
    places = [Path(tempfile.mkdtemp(prefix="harness-cheat-", dir="/var/tmp")),
              Path(tempfile.mkdtemp(prefix="harness-cheat-home-", dir="/var/tmp")) / "home" / "me" / ".cache"]
    copies = []
    for folder in places:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(corpus, folder / "shakespeare.txt.xz")
        copies.append(str(folder / "shakespeare.txt.xz"))
    yield copies
    for folder in places:
        shutil.rmtree(folder if folder.name.startswith("harness-cheat") else folder.parents[2], ignore_errors=True)


def on_the_way(folder: str, name: str) -> bool:
    """folder/name leads to the interpreter the job runs (its prefix is shown, so its parents exist)."""
    return any(str(Path(p)).startswith(str(Path(folder) / name)) for p in (sys.prefix, sys.base_prefix))


def escape_code(repo: Path, tag: str, planted: list[str]) -> str:
    paths = [*planted, str(HARNESS_CHECKOUT / "data" / "shakespeare.txt.xz"), str(HARNESS_CHECKOUT / ".git"),
             str(repo / "data" / "shakespeare.txt.xz"), str(repo / ".git" / "objects"), str(repo / "runs" / tag),
             str(repo / "runs" / tag / "results.tsv"), "/root", "/home", "/var/tmp", "/opt", "/mnt",
             os.path.expanduser("~/.cache"), "data/shakespeare.txt.xz", "/etc/shadow"]
    return f"PATHS = {paths!r}\n" + ESCAPE.replace("MARK", MARK).replace("CHEAT", tag)


def test_escapes_as_root_fail_and_none_is_kept(tmp_path_factory, planted, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    repo = research_repo(tmp_path_factory.mktemp("escape"))
    tag = "escape"
    code = escape_code(repo, tag, planted)
    # with the policy off, the obfuscated form runs the plain one's code (conftest.RUNTIME_NIGHT)
    steps = [code_cheat("escape the sandbox (obfuscated)", after_imports, code, hide=True)]
    cfg = resolve(repo, tag, {"time_budget": TIME_BUDGET_S, "max_steps": MAX_STEPS, "kill_after": 60,
                              "baseline_runs": 1, "iterations": len(steps), "policy": False,
                              "on_unhealthy": "continue", "gate": "strict", "health_every": 0,
                              "sandbox": "bwrap"})
    driver.run(cfg, researcher=ScriptedResearcher(steps))
    rows = ledger.read_rows(cfg.ledger_path)
    assert len(rows) == 2 and all(r["status"] != "keep" for r in rows[1:]), rows
    assert git(repo, "rev-parse", cfg.branch) == git(repo, "rev-parse", "main")
    for row in rows[1:]:
        log = (cfg.run_dir / row["log"]) if not os.path.isabs(row["log"]) else Path(row["log"])
        line = next(l for l in log.read_text().splitlines() if l.startswith(MARK))
        report = json.loads(line[len(MARK):])
        assert all(" 0000000000000000" in c.replace("\t", " ") for c in report["caps"]), report["caps"]
        for attempt in ("remount /", "mount syscall remount", "umount /tmp", "umount data/",
                        "tmpfs over data/", "unshare -Urm"):
            assert report[attempt] != 0, (attempt, report)
        assert all(v != 0 for k, v in report.items() if k.startswith("wrote ")), report
        for path, seen in report["found"].items():  # not there at all (ENOENT), or covered (EACCES)
            # the run folder holds only the empty folders bwrap made to mount the worktree and data on
            # and a home that holds the interpreter shows the folder on the way to it, nothing else
            assert seen in (2, 13) or seen == [] or path.endswith(f"runs/{tag}") and "results.tsv" not in seen \
                or isinstance(seen, list) and all(on_the_way(path, name) for name in seen), (path, seen)
        assert not any("harness" in p or "pytest" in p for p in report["processes"]), report["processes"]
        assert len(report["processes"]) <= 6, report["processes"]  # bwrap's init, the job and its tools
    for target in ("/root", "/etc", "/usr"):
        assert not os.path.exists(f"{target}/escaped-{tag}")
    manifest = json.loads((cfg.run_dir / "run.json").read_text())
    assert manifest["sandbox"] == "bwrap" and manifest["sandbox_caps"]["CapEff"] == "0000000000000000"
