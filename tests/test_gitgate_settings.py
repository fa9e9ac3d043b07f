"""The harness's git (the gitgate package): the user's signing and hooks never run on the harness's
own commits, the rest of the user's settings hold; a git that hangs is killed with a message that
says what to do; and no other module of the harness runs git itself."""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import gitgate, ledger
from harness.gitgate import plain

from conftest import ROOT, alive, git, make_repo

NIGHT_TIMEOUT_S = 240  # a bound on a hung test, not a figure it measures


def night(repo: Path, tag: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A real `harness run` of 3 mutate iterations and one baseline run (the fake trainer prints its
    result at once: the work is bounded by iterations, not by time)."""
    cmd = [sys.executable, "-m", "harness", "run", "--repo", str(repo), "--tag", tag, "--agent", "mutate",
           "--iterations", "3", "--baseline-runs", "1"]
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=NIGHT_TIMEOUT_S)


def all_rows(repo: Path, tag: str) -> list[dict]:
    return ledger.read_rows(repo / "runs" / tag / "results.tsv")


def tried(repo: Path, tag: str) -> list[str]:
    out = git(repo, "for-each-ref", "--format=%(objectname)", f"refs/autoresearch/{tag}/tried/")
    return out.split()


def hook(repo: Path, name: str, body: str) -> None:
    path = repo / ".git" / "hooks" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def users_commit_fails(repo: Path) -> str:
    """The user's own commit under these settings fails (they are live); the checkout is left as it was."""
    (repo / "notes.txt").write_text("x\n")
    git(repo, "add", "notes.txt")
    done = subprocess.run(["git", "-C", str(repo), "commit", "-qm", "notes"], capture_output=True, text=True, timeout=60)
    git(repo, "reset", "-q")
    (repo / "notes.txt").unlink()
    assert done.returncode != 0, "the repo's settings should refuse the user's own commit"
    return done.stderr


def test_a_failing_gpg_with_commit_signing_on_runs_the_whole_night(tmp_path):
    repo = make_repo(tmp_path / "r")
    git(repo, "config", "commit.gpgsign", "true")
    git(repo, "config", "tag.gpgsign", "true")
    git(repo, "config", "gpg.program", "/bin/false")
    assert "gpg" in users_commit_fails(repo)
    done = night(repo, "s")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = all_rows(repo, "s")
    assert len(rows) == 4 and [r["status"] for r in rows][0] == "keep", [(r["status"], r["description"]) for r in rows]
    assert all(r["status"] in ("keep", "discard") for r in rows), [r["description"] for r in rows]
    commits = tried(repo, "s")
    assert len(commits) == 3  # every candidate committed, unsigned
    assert all("gpgsig" not in git(repo, "cat-file", "commit", c) for c in commits)


def test_failing_hooks_never_run_on_the_harness_commits_and_the_users_identity_holds(tmp_path):
    repo = make_repo(tmp_path / "r")
    marks = tmp_path / "marks"
    marks.mkdir()
    hook(repo, "pre-commit", "echo 'pre-commit: refused' >&2\nexit 1\n")
    hook(repo, "commit-msg", "echo 'commit-msg: refused' >&2\nexit 1\n")
    for name in ("post-commit", "post-checkout", "prepare-commit-msg", "reference-transaction"):
        hook(repo, name, f"touch {marks}/{name}\n")
    assert "pre-commit: refused" in users_commit_fails(repo)
    for mark in marks.iterdir():
        mark.unlink()  # the user's own (refused) commit ran some of them
    done = night(repo, "h")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = all_rows(repo, "h")
    assert len(rows) == 4 and all(r["status"] in ("keep", "discard") for r in rows), [r["description"] for r in rows]
    commits = tried(repo, "h")
    assert len(commits) == 3
    assert sorted(p.name for p in marks.iterdir()) == []  # no hook of the user's ran: worktrees, commits, refs
    # the rest of the user's config holds: the candidates carry the repo's own identity
    assert {git(repo, "log", "-1", "--format=%an <%ae>", c) for c in commits} == {"Test User <test@example.com>"}


def hanging_git(bin_dir: Path, subcommand: str, pid_file: Path) -> Path:
    """A `git` first on PATH that hangs on one subcommand (its pid in pid_file) and runs the real git otherwise."""
    real = shutil.which("git")
    assert real
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapper = bin_dir / "git"
    wrapper.write_text(f'#!/bin/sh\nfor a in "$@"; do\n  if [ "$a" = {subcommand} ]; then echo $$ > {pid_file}; '
                       f'exec sleep 600; fi\ndone\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    return bin_dir


def test_a_git_that_hangs_is_killed_and_the_run_stops_with_what_to_do(tmp_path):
    repo = make_repo(tmp_path / "r")
    pid_file = tmp_path / "hung.pid"
    bin_dir = hanging_git(tmp_path / "bin", "commit", pid_file)
    done = night(repo, "g", env={"PATH": f"{bin_dir}:{os.environ['PATH']}", plain.TIMEOUT_ENV: "5"})
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode != 0, out
    assert "commit" in out and "did not finish in 5s and was killed" in out, out
    assert plain.TIMEOUT_ENV in out and "--resume" in out, out
    assert pid_file.exists() and not alive(int(pid_file.read_text())), "the hung git was left running"
    assert [r["status"] for r in all_rows(repo, "g")] == ["keep"]  # the baseline; the hung candidate has no row


def test_run_git_and_gitpython_calls_share_the_deadline(tmp_path, monkeypatch):
    repo = make_repo(tmp_path / "r")
    pid_file = tmp_path / "hung.pid"
    bin_dir = hanging_git(tmp_path / "bin", "status", pid_file)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv(plain.TIMEOUT_ENV, "1")
    with pytest.raises(gitgate.GitTimeout, match=r"`git status` in .* did not finish in 1s"):
        gitgate.run_git(["status"], repo)
    assert not alive(int(pid_file.read_text()))
    pid_file.unlink()
    with gitgate.Worktree(repo) as wt, pytest.raises(gitgate.GitTimeout, match=r"git status --porcelain.* did not finish in 1s"):
        wt.changes()
    assert not alive(int(pid_file.read_text()))
    assert gitgate.run_git(["rev-parse", "HEAD"], repo).stdout.strip() == git(repo, "rev-parse", "HEAD")


INTERRUPTED = """
import os, signal, sys, threading, time
from pathlib import Path
from harness import gitgate
signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
started = time.monotonic()
with gitgate.Worktree(Path(sys.argv[1])) as wt:
    signal.alarm(1)  # a Ctrl-C while `git status` hangs
    try:
        wt.changes()
    except KeyboardInterrupt:
        print("interrupted after", round(time.monotonic() - started, 1))
    print("threads", [t.name for t in threading.enumerate() if t is not threading.main_thread()])
"""


def test_an_interrupt_inside_a_git_call_kills_git_and_leaves_nothing_to_wait_for(tmp_path):
    """A library user's Ctrl-C while a gitgate call waits on git: the interrupt propagates at
    once, git is killed before it does, and no deadline thread is left for Python's exit to wait
    on (the deadline is 300 s here; GitPython's own kill_after_timeout timer would hold it)."""
    repo = make_repo(tmp_path / "r")
    pid_file = tmp_path / "hung.pid"
    bin_dir = hanging_git(tmp_path / "bin", "status", pid_file)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), plain.TIMEOUT_ENV: "300"}
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED)
    done = subprocess.run([sys.executable, str(script), str(repo)], env=env, capture_output=True, text=True,
                          timeout=120)  # the timer thread would hold the exit 300 s
    assert done.returncode == 0, done.stderr
    assert "interrupted after" in done.stdout and "threads []" in done.stdout, done.stdout
    assert pid_file.exists() and not alive(int(pid_file.read_text())), "the interrupted git was left running"


# ---------------------------------------------------------------------------------------------
# Only gitgate runs git

HARNESS = ROOT / "harness"
GIT_MODULES = set((HARNESS / "gitgate").rglob("*.py"))  # the package: its verbs on a Repo and plain.py, the raw call
SHELL_CALLS = {"run", "Popen", "call", "check_call", "check_output", "system", "popen", "getoutput",
               "getstatusoutput", "spawn", "execvp", "execv", "execlp"}


def git_calls(source: str) -> list[str]:
    """What in source runs git by itself: GitPython imported, GitPython's command wrapper called
    (`<repo>.git.<verb>(...)`), the string "git" (an argv's program, `shutil.which("git")`), or a
    shell command line that starts with `git `."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] == "git"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "git":
            found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Constant) and node.value == "git":
            found.append(f"line {node.lineno}: the string 'git'")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute) and func.value.attr == "git":
                found.append(f"line {node.lineno}: .git.{func.attr}(...)")
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0] if node.args else None
            if (name in SHELL_CALLS and isinstance(first, ast.Constant) and isinstance(first.value, str)
                    and first.value.lstrip().startswith("git ")):
                found.append(f"line {node.lineno}: {name}({first.value!r})")
    return found


@pytest.mark.parametrize("source", [
    "import git\n", "import git.cmd\n", "from git import Repo\n", "from git.exc import GitCommandError\n",
    "subprocess.run(['git', 'status'], cwd=p)\n", "argv = ('git', *args)\n", "shutil.which('git')\n",
    "repo.git.status('--porcelain')\n", "gate.repo.git.execute(['x'])\n", "os.system('git gc')\n",
    "subprocess.check_output('git rev-parse HEAD', shell=True)\n",
])
def test_the_scan_finds_git_run_outside_gitgate(source):
    assert git_calls(source), source


def test_the_scan_leaves_other_code_alone():
    clean = ("from . import gitgate\nfrom .gitgate import run_git\nrun_git(['status'], wt)\n"
             "gitgate.GitGate(repo).diff(a, b, paths)\nx = Path(repo) / '.git'\nwt.repo.git_dir\n"
             "subprocess.run(['nvidia-smi'])\n'''the git guard'''\n")
    assert git_calls(clean) == []


def test_no_module_but_gitgate_runs_git():
    modules = sorted(HARNESS.rglob("*.py"))
    assert HARNESS / "integrity" / "guard.py" in modules and GIT_MODULES <= set(modules)
    offenders = {str(p.relative_to(ROOT)): found for p in modules if p not in GIT_MODULES
                 for found in [git_calls(p.read_text())] if found}
    assert offenders == {}, offenders
    assert git_calls((HARNESS / "gitgate" / "__init__.py").read_text())  # the scan sees gitgate's own git


def test_a_candidate_costs_few_git_commands_and_reads_nothing_twice(tmp_path):
    """Every git a sequential candidate starts (GIT_TRACE: the ones git starts itself included),
    from its tried ref to the next candidate's: within a bound, and without the repeats it once
    had: its protected file read from git before and after the job, the worktree reset to the
    parent twice with only reads between, the parent's train.py read again for every candidate.
    A kept candidate costs one reset more: the run branch moves to it."""
    repo = make_repo(tmp_path / "r")
    trace = tmp_path / "git.trace"
    done = night(repo, "g", {"GIT_TRACE": str(trace)})
    assert done.returncode == 0, done.stderr
    commands = [line.split("trace: built-in: git ", 1)[1] for line in trace.read_text().splitlines()
                if "trace: built-in: git " in line]
    starts = [i for i, c in enumerate(commands) if c.startswith("update-ref refs/autoresearch/g/tried/")]
    assert len(starts) == 3, commands
    status = {r["iteration"]: r["status"] for r in all_rows(repo, "g")}
    for iteration, (a, b) in enumerate(zip(starts, starts[1:]), start=1):
        row, kept = commands[a:b], status[iteration] == "keep"
        assert len(row) <= GIT_PER_CANDIDATE + 2 * kept, "\n".join(row)
        assert sum(c == "cat-file blob HEAD:prepare.py" for c in row) == 1, row
        # the job's worktree to the candidate, the run's back to the parent (after a keep: the
        # run's to the candidate, moving its branch, then to the candidate as the next one's parent)
        assert sum(c.startswith("reset --hard") for c in row) == 2 + kept, row
    parents = [c for c in commands if re.fullmatch(r"cat-file blob [0-9a-f]{40}:train\.py", c)]  # the policy's
    assert parents and len(parents) == len(set(parents)), parents


GIT_PER_CANDIDATE = 23  # 22 today for a discarded candidate (26 before the repeats went)
