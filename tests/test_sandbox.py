"""The sandbox really is one: real bwrap, real processes, a real server on 127.0.0.1."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from harness import events, ledger
from harness.executors import sandbox

needs_bwrap = pytest.mark.skipif(not sandbox.probe(sandbox.bwrap_path()).works,
                                 reason="bubblewrap does not work on this machine (apt install bubblewrap)")


@pytest.fixture
def space(tmp_path):
    """A run folder with a ledger, a worktree inside it, a private tmp and an output folder."""
    run_dir = tmp_path / "repo" / "runs" / "t"
    wt = run_dir / "worktree"
    wt.mkdir(parents=True)
    (run_dir / "results.tsv").write_text("commit\tval_bpb\nabc\t1.0\n")
    tmp, out = run_dir / "jobs" / "1" / "tmp", run_dir / "jobs" / "1" / "out"
    tmp.mkdir(parents=True)
    out.mkdir(parents=True)
    return {"run_dir": run_dir, "wt": wt, "tmp": tmp, "out": out, "outside": tmp_path / "outside.txt"}


def run_job(space, code: str, **kw) -> subprocess.CompletedProcess:
    (space["wt"] / "job.py").write_text(textwrap.dedent(code))
    argv = sandbox.wrap([sys.executable, "job.py"], worktree=space["wt"], tmp_dir=space["tmp"],
                        output_dir=space["out"], hidden=[space["run_dir"]], **kw)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_wrap_orders_mounts_so_the_worktree_inside_a_hidden_folder_stays_visible(space):
    argv = sandbox.wrap(["python", "train.py"], worktree=space["wt"], tmp_dir=space["tmp"],
                        output_dir=space["out"], hidden=[space["run_dir"]], readonly=[space["outside"]])
    hide = argv.index("--tmpfs")
    assert argv[hide + 1] == str(space["run_dir"])
    assert argv.index("--bind", hide) > hide  # the worktree is bound after its folder is covered
    assert argv[argv.index("--chdir") + 1] == str(space["wt"])
    assert argv[-3:] == ["--", "python", "train.py"]
    assert "--unshare-net" in argv and "--unshare-pid" in argv and "--die-with-parent" in argv
    assert "--unshare-net" not in sandbox.wrap(["true"], worktree=space["wt"], tmp_dir=space["tmp"], network=True)
    assert str(space["outside"]) not in argv  # read-only paths that do not exist are left out


@needs_bwrap
def test_a_job_cannot_write_outside_its_worktree(space):
    site = Path(os.__file__).parent
    done = run_job(space, f"""
        import os
        open("inside.txt", "w").write("ok")
        open("/tmp/private.txt", "w").write("ok")
        open(os.environ.get("OUT", "{space['out']}") + "/model.bin", "w").write("ok")
        for target in ({str(space['outside'])!r}, {str(site / 'planted.pth')!r},
                       os.path.expanduser("~/.cache/planted.txt")):
            try:
                open(target, "w").write("x")
                print("WROTE", target)
            except OSError as e:
                print("refused", target, e.errno)
        """)
    assert done.returncode == 0, done.stderr
    # site-packages and ~/.cache are read-only; the outside path lies under the host's /tmp, which
    # the job sees as its private /tmp: the write lands there, never in the real file
    assert done.stdout.count("refused") == 2 and f"refused {site / 'planted.pth'} 30" in done.stdout
    assert (space["wt"] / "inside.txt").exists() and (space["out"] / "model.bin").exists()
    assert (space["tmp"] / "private.txt").exists()  # /tmp is the job's private folder
    assert not space["outside"].exists() and not (site / "planted.pth").exists()


@needs_bwrap
def test_a_job_cannot_read_or_change_the_run_folder(space):
    ledger = space["run_dir"] / "results.tsv"
    done = run_job(space, f"""
        import os
        print("listing", sorted(os.listdir({str(space['run_dir'])!r})))
        try:
            print("READ", open({str(ledger)!r}).read())
        except OSError:
            print("no ledger")
        open({str(ledger)!r}, "w").write("forged")  # lands in the tmpfs, never on disk
        """)
    assert done.returncode == 0, done.stderr
    assert "no ledger" in done.stdout and "READ" not in done.stdout
    assert "'results.tsv'" not in done.stdout
    assert ledger.read_text() == "commit\tval_bpb\nabc\t1.0\n"


@needs_bwrap
def test_a_hidden_file_inside_the_worktree_stays_hidden(space):
    corpus = space["wt"] / "data" / "corpus.bin"
    corpus.parent.mkdir()
    corpus.write_bytes(b"the held-out bytes")
    (space["wt"] / "job.py").write_text(
        f"try:\n    print(repr(open({str(corpus)!r}, 'rb').read()))\n"
        "except OSError as e:\n    print('denied', e.errno)\n")
    argv = sandbox.wrap([sys.executable, "job.py"], worktree=space["wt"], tmp_dir=space["tmp"],
                        hidden=[space["run_dir"], corpus])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "denied 13"  # /dev/null on a nodev mount: unreadable
    assert corpus.read_bytes() == b"the held-out bytes"


@needs_bwrap
def test_a_job_cannot_reach_a_server_on_loopback(space):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        code = f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=5)
                print("CONNECTED")
            except OSError as e:
                print("refused", e)
            """
        done = run_job(space, code)
        assert done.returncode == 0, done.stderr
        assert "refused" in done.stdout and "CONNECTED" not in done.stdout
        allowed = run_job(space, code, network=True)  # --network: the host's loopback is reachable
        assert "CONNECTED" in allowed.stdout, allowed.stderr
    finally:
        server.close()


@needs_bwrap
def test_a_double_forked_daemon_dies_with_the_job(space):
    marker = space["out"] / "daemon.pid"
    start = time.monotonic()
    done = run_job(space, f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:  # the grandchild: a daemon in its own session
                open({str(marker)!r}, "w").write(str(os.getpid()))
                time.sleep(600)
            os._exit(0)
        time.sleep(1)
        print("parent exits")
        """)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 60  # bwrap did not wait for the daemon's ten minutes
    assert marker.exists()
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "time.sleep(600)" not in out and str(space["wt"] / "job.py") not in out


@needs_bwrap
def test_the_job_sees_only_its_own_processes(space):
    done = run_job(space, "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n")
    assert done.returncode == 0, done.stderr
    assert max(eval(done.stdout)) < 100  # bwrap's init, the job, nothing of the host


def test_resolve_off_auto_and_a_machine_without_bwrap(monkeypatch, tmp_path):
    assert sandbox.resolve("off") == sandbox.Choice("off", "off")
    with pytest.raises(Exception, match="sandbox must be one of"):
        sandbox.resolve("docker")
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    sandbox.reset_cache()
    try:
        choice = sandbox.resolve("auto")
        assert choice.mode == "off" and "NO SANDBOX" in choice.warning
        assert "apt install bubblewrap" in choice.warning
        assert sandbox.warn_once(choice) == choice.warning and sandbox.warn_once(choice) is None
        with pytest.raises(Exception, match="apt install bubblewrap"):
            sandbox.resolve("bwrap")
    finally:
        sandbox.reset_cache()


# ---------------------------------------------------------------------------
# The harness with and without it (the fake trainer; tests/conftest.py)


def harness(args, env=None):
    from click.testing import CliRunner
    from harness.cli import main
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, env=env)


def bin_without_bwrap(tmp_path) -> str:
    """A PATH that has git and python but no bwrap: a machine without bubblewrap."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("git", "python3", "ps"):
        found = shutil.which(tool)
        if found:
            (folder / tool).symlink_to(found)
    return str(folder)


@needs_bwrap
def test_a_run_and_harness_check_under_the_sandbox(tmp_path):
    from conftest import make_repo
    repo = make_repo(tmp_path / "r", sandbox="bwrap")
    result = harness(["run", "--repo", repo, "--tag", "s", "--agent", "mutate", "--iterations", 1,
                      "--baseline-runs", 1])
    assert result.exit_code == 0, result.output
    manifest = json.loads((repo / "runs" / "s" / "run.json").read_text())
    assert manifest["sandbox"] == "bwrap" and manifest["config"]["sandbox"] == "bwrap"
    rows = ledger.read_rows(repo / "runs" / "s" / "results.tsv")
    assert rows[0]["status"] == "keep" and len(rows) == 2
    assert rows[0]["sealed"] == "no"  # a foreign workload (no evaluate_command): the printed block, unsealed
    report = harness(["report", repo / "runs" / "s", "--out", tmp_path / "rep"])
    assert report.exit_code == 0, report.output
    assert "| sandbox | bwrap |" in (tmp_path / "rep" / "report.md").read_text()
    check = harness(["check", "--repo", repo, "--agent", "mutate"])
    assert check.exit_code == 0, check.output
    assert "sandbox     bwrap (own PID namespace" in check.output


def test_without_bwrap_auto_warns_loudly_and_still_runs(tmp_path, monkeypatch):
    from conftest import make_repo
    repo = make_repo(tmp_path / "r", sandbox="auto")
    monkeypatch.setenv("PATH", bin_without_bwrap(tmp_path))
    sandbox.reset_cache()
    try:
        result = harness(["run", "--repo", repo, "--tag", "w", "--agent", "mutate", "--iterations", 1,
                          "--baseline-runs", 1])
        assert result.exit_code == 0, result.output
        assert result.output.count("NO SANDBOX") == 1 and "apt install bubblewrap" in result.output
        assert json.loads((repo / "runs" / "w" / "run.json").read_text())["sandbox"] == "off"
        assert [e["kind"] for e in events.read(repo / "runs" / "w")[0]].count("sandbox_off") == 1
        off = harness(["run", "--repo", repo, "--tag", "o", "--agent", "mutate", "--iterations", 1,
                       "--baseline-runs", 1, "--sandbox", "off"])
        assert off.exit_code == 0 and "NO SANDBOX" not in off.output
        refused = harness(["run", "--repo", repo, "--tag", "b", "--agent", "mutate", "--iterations", 1,
                           "--sandbox", "bwrap"])
        assert refused.exit_code != 0 and "apt install bubblewrap" in refused.output
        assert not (repo / "runs" / "b" / "results.tsv").exists()
    finally:
        sandbox.reset_cache()


# ---------------------------------------------------------------------------
# The researcher's own sandbox (agents/sandboxed.py; its cheats: tests/cheats/test_cheats_researcher.py)


def test_a_researchers_view_names_its_install_root_and_interpreters(tmp_path, monkeypatch):
    from harness.agents import sandboxed
    prefix = tmp_path / "npm"  # an npm prefix: a bin/ link into node_modules, a script run by `env node`
    package = prefix / "lib" / "node_modules" / "tool" / "bin"
    package.mkdir(parents=True)
    (package / "tool.js").write_text("#!/usr/bin/env -S node --no-warnings\nconsole.log(1)\n")
    (package / "tool.js").chmod(0o755)
    venv = tmp_path / "venv"  # a venv's python, found first on PATH as `node` would be
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "node").symlink_to(sys.executable)
    (prefix / "bin").mkdir()
    (prefix / "bin" / "tool").symlink_to(package / "tool.js")
    monkeypatch.setenv("PATH", f"{prefix / 'bin'}{os.pathsep}{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    seen = sandboxed.runtime_paths("tool")
    assert seen[0] == prefix and venv in seen  # the package's prefix, the interpreter's venv
    assert Path(sys.executable).resolve().parent.parent in seen  # and the venv's own base python
    assert sandboxed.interpreter(package / "tool.js") == "node"
    assert sandboxed.install_root(tmp_path / "scripts" / "bin" / "x") == tmp_path / "scripts" / "bin"  # no prefix
    assert sandboxed.install_root(Path.home() / "bin" / "x") == Path.home() / "bin"  # never the whole home


@needs_bwrap
def test_agent_sandbox_bwrap_refuses_to_start_without_bwrap(tmp_path, monkeypatch):
    from conftest import make_repo
    repo = make_repo(tmp_path / "r")
    agent = tmp_path / "agent.py"
    agent.write_text("print('nothing')\n")
    monkeypatch.setenv("PATH", bin_without_bwrap(tmp_path))
    sandbox.reset_cache()
    try:
        refused = harness(["run", "--repo", repo, "--tag", "b", "--agent", f"cmd:{sys.executable} {agent}",
                           "--iterations", 1, "--agent-sandbox", "bwrap"])
        assert refused.exit_code != 0 and "--agent-sandbox bwrap was asked for" in refused.output
        assert "apt install bubblewrap" in refused.output
        assert not (repo / "runs" / "b" / "results.tsv").exists()
    finally:
        sandbox.reset_cache()
