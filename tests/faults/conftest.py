"""Shared helpers of the fault suite: a real `harness run` subprocess, a scriptable cmd researcher,
and the invariants that must hold after any fault and a resume."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness import ledger
from harness.ledger import guard as ledgerguard

from conftest import FAKE_TRAIN, ROOT, git, make_repo

AGENT = r'''
"""A cmd researcher for the fault suite: lowers VALUE each call; MODE picks a misbehaviour."""
import json, os, re, signal, subprocess, sys, time
from pathlib import Path

wt, mode = Path(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "ok")
run_dir = wt.parent.parent if wt.parent.name == "lanes" else wt.parent  # a lane's worktree, or the run's
count_file = run_dir / "agent-count"
n = int(count_file.read_text()) + 1 if count_file.exists() else 1
count_file.write_text(str(n))
(run_dir / "agent.pid").write_text(str(os.getpid()))
train = wt / "train.py"
source = train.read_text()
value = float(re.search(r"^VALUE = (\S+)", source, re.M).group(1)) - 0.01
train.write_text(re.sub(r"^VALUE = \S+", f"VALUE = {value!r}", source, count=1, flags=re.M))
if mode == "kill_parent" and n == 1:       # SIGKILL the supervisor while the researcher runs
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)
if mode == "hang":
    time.sleep(60)
if mode == "garbage":
    sys.stdout.buffer.write(bytes(range(256)) * 20)
    print("\n{not json at all")
    sys.exit(0)
if mode == "ledger" and n in (1, 2):       # the ledger is reachable from the researcher's shell
    ledger = run_dir / "results.tsv"
    if n == 1:
        ledger.write_text(ledger.read_text().replace("keep", "discard").replace("baseline", "edited"))
    else:
        ledger.unlink()
if mode == "git" and n in (1, 2):
    git = ["git", "-c", "user.name=x", "-c", "user.email=x@x"]
    if n == 1:
        subprocess.run([*git, "commit", "-qam", "amended", "--amend"], cwd=wt, check=True)
    else:
        subprocess.run([*git, "reset", "-q", "--soft", "HEAD~1"], cwd=wt, check=False)
        subprocess.run([*git, "checkout", "-q", "-b", "elsewhere"], cwd=wt, check=True)
if mode == "lock" and n == 1:              # a git command of ours, killed half-way
    gitdir = subprocess.run(["git", "rev-parse", "--git-dir"], cwd=wt, capture_output=True, text=True).stdout.strip()
    (wt / gitdir / "index.lock").write_text("")
print(json.dumps({"description": f"VALUE {value}", "input_tokens": 100, "output_tokens": 10}))
'''


def slow_repo(path: Path, sleep_s: float = 0.4, hold: Path | None = None, **kw) -> Path:
    """A research repo whose fake trainer takes sleep_s: long enough to be killed mid-training.
    hold: a candidate's job (not the baseline's, VALUE 1.0) also trains while that file exists (120 s
    at most): it is still training when the test stops the run, and the resume, once the test has
    removed the file, does not wait."""
    source = FAKE_TRAIN.replace("SLEEP_S = 0.0", f"SLEEP_S = {sleep_s}")
    if hold is not None:
        source = source.replace("time.sleep(SLEEP_S)\n", (
            f"time.sleep(SLEEP_S)\n_held = time.monotonic()\nwhile VALUE != 1.0 and os.path.exists({str(hold)!r})"
            " and time.monotonic() - _held < 120:\n    time.sleep(0.05)\n"))
    return make_repo(path, source, **kw)


def agent_arg(tmp: Path, mode: str = "ok") -> str:
    script = tmp / "agent.py"
    if not script.exists():
        script.write_text(AGENT)
    return f"cmd:{sys.executable} {script} {{workdir}} {mode}"


def harness_run(repo: Path, tag: str, *args: str, fault: str | None = None, timeout: float = 120):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env["PYTHONPATH"] = str(ROOT)
    if fault:
        env["HARNESS_FAULT"] = fault
    cmd = [sys.executable, "-m", "harness", "run", "--repo", str(repo), "--tag", tag,
           "--baseline-runs", "1", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def candidates(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["status"] != "repeat"]


def assert_recovered(repo: Path, tag: str, iterations: int, run_dir: Path | None = None) -> list[dict]:
    """Every candidate on the ledger exactly once, HEAD = best, worktree clean, nothing in flight.
    run_dir: an A/B arm's folder (its tag is then <ab-tag>-<arm>)."""
    run_dir = run_dir or repo / "runs" / tag
    path = run_dir / "results.tsv"
    data = path.read_bytes()
    assert data.endswith(b"\n"), "a torn last line was left in the ledger"
    assert data == ledgerguard.shadow_path(path).read_bytes(), "ledger and the harness's copy differ"
    rows = ledger.read_rows(path)
    numbered = candidates(rows)  # lanes: any order; a proposal back after a stop is a `stopped` row with a
    # number of its own (its spend), not one of --iterations
    assert sorted(r["iteration"] for r in numbered) == list(range(len(numbered))), rows  # no gap, no double
    assert len([r for r in numbered if r["status"] != "stopped"]) == iterations + 1, rows
    assert all(r["metric"] is None for r in numbered if r["status"] == "stopped"), rows  # never trained
    assert len(data.decode().strip().split("\n")) == len(rows) + 1  # header + rows: no line unparsed
    best = ledger.best_row(rows)
    wt = run_dir / "worktree"
    assert git(wt, "rev-parse", "HEAD").startswith(best["commit"])
    assert git(wt, "status", "--porcelain", "--ignored") == ""
    assert git(wt, "symbolic-ref", "HEAD") == f"refs/heads/autoresearch/{tag}"
    base = json.loads((run_dir / "run.json").read_text())["baseline_commit"]
    kept = [r["commit"] for r in candidates(rows)[1:] if r["status"] == "keep"]
    assert [c[:12] for c in git(repo, "rev-list", "--reverse", f"{base}..autoresearch/{tag}").split()] == kept
    assert not list(run_dir.glob("inflight*.json"))
    assert not list((run_dir / "procs").glob("*.json")), "a process record outlived its process"
    return rows


def run_processes(run_dir: Path) -> list[str]:
    """Live processes that belong to the run: its supervisor's mark in their environment, or a
    working directory inside the run folder. What no stop may leave behind."""
    root = str(Path(run_dir).resolve())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid() or not alive(int(entry)):
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if f"HARNESS_SUPERVISOR={root}".encode() in environ or cwd == root or cwd.startswith(root + "/"):
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry}: {cmdline[:120]}")
    return found


def start_run(args: list[str], fault: str | None = None, command: str = "run") -> subprocess.Popen:
    """A real `harness` subprocess in the background (own session, as in a terminal)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env["PYTHONPATH"] = str(ROOT)
    if fault:
        env["HARNESS_FAULT"] = fault
    return subprocess.Popen([sys.executable, "-m", "harness", command, *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def wait_for(predicate, timeout_s: float = 60.0, what: str = "") -> None:
    import time
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def worktrees(repo: Path) -> list[str]:
    """The worktrees git knows of, besides the user's checkout."""
    out = git(repo, "worktree", "list", "--porcelain")
    paths = [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")]
    return sorted(p for p in paths if Path(p).resolve() != Path(repo).resolve())
