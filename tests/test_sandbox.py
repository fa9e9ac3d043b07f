"""The sandbox really is one: real bwrap, real processes, a real server on 127.0.0.1."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from harness.ledger import events
from harness import ledger
from harness.executors import sandbox, view

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


def test_wrap_shows_an_allow_list_and_names_the_interpreter_by_its_path(space):
    corpus = space["wt"] / "data.bin"
    corpus.write_bytes(b"x")
    argv = sandbox.wrap(["python", "train.py"], worktree=space["wt"], tmp_dir=space["tmp"],
                        output_dir=space["out"], hidden=[space["run_dir"], corpus], readonly=[space["outside"]])
    assert "/" not in [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]  # never the disk
    assert str(space["run_dir"]) not in argv  # hidden outside what is shown: simply not mounted
    assert argv.index("--bind", argv.index(str(space["tmp"])) + 1) < argv.index(str(corpus))  # covered after
    assert argv[argv.index("--chdir") + 1] == str(space["wt"])
    run = argv[argv.index("--") + 1:]
    assert os.path.isabs(run[0]) and run[1:] == ["train.py"]  # the interpreter, resolved outside
    assert argv[1:4] == ["--unshare-user", "--cap-drop", "ALL"]
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


def test_capabilities_are_read_from_a_status_text():
    status = "Name:\tx\nUid:\t0\t0\t0\t0\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n" \
             "CapBnd:\t000001fffeffffff\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n"
    caps = sandbox.read_caps(status)
    assert caps["CapBnd"] == "000001fffeffffff" and caps["Uid"] == "0 0 0 0"
    assert not sandbox.unprivileged(caps)  # a bounding set left: CAP_SYS_ADMIN could come back
    assert sandbox.unprivileged({**caps, "CapBnd": "0" * 16})
    assert sandbox.caps_line({**caps, "CapBnd": "0" * 16}) == "CapEff 0, CapBnd 0, uid 0"


@needs_bwrap
def test_the_job_holds_no_capability_as_root_and_as_a_user(space):
    done = run_job(space, "print(open('/proc/self/status').read())\n")
    assert done.returncode == 0, done.stderr
    caps = sandbox.read_caps(done.stdout)
    assert sandbox.unprivileged(caps) and caps["NoNewPrivs"] == "1", caps
    user = next((u for u in ("nobody", "daemon") if shutil.which("setpriv")), None)
    if os.geteuid() != 0 or user is None:
        return
    argv = [sandbox.bwrap_path(), *sandbox.isolation(), "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
            "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
            "--unshare-pid", "--", "/usr/bin/cat", "/proc/self/status"]
    as_user = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *argv],
                             capture_output=True, text=True, timeout=60)
    if as_user.returncode != 0 and "setting up uid map" in as_user.stderr:
        pytest.skip(f"unprivileged user namespaces are off here: {as_user.stderr.strip()}")
    assert as_user.returncode == 0, as_user.stderr
    caps = sandbox.read_caps(as_user.stdout)
    assert sandbox.unprivileged(caps) and caps["Uid"].split()[0] == "65534", caps


@pytest.mark.skipif(os.geteuid() != 0, reason="a bwrap that keeps privileges needs root to show it")
def test_a_bwrap_that_leaves_capabilities_is_refused(tmp_path, monkeypatch):
    """A bwrap that ignores its flags (an old or broken build, a wrapper script): jobs would run with
    root's capabilities, so --sandbox bwrap refuses and auto turns the sandbox off, loudly."""
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done\nshift\nexec "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    sandbox.reset_cache()
    try:
        found = sandbox.probe(sandbox.bwrap_path())
        assert not found.works and "kept capabilities" in found.detail and "CapEff 000001f" in found.detail
        with pytest.raises(Exception, match="kept capabilities"):
            sandbox.resolve("bwrap")
        assert sandbox.resolve("auto").mode == "off" and sandbox.capabilities("auto") == {}
    finally:
        sandbox.reset_cache()


def make_venv(where: Path) -> Path:
    """A venv that sees this interpreter's packages (no pip: quick), the way users make one."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(where)],
                   check=True, timeout=120)
    return where / "bin" / "python"


@needs_bwrap
@pytest.mark.parametrize("place", ["tmp", "elsewhere"])
def test_a_venv_under_tmp_or_elsewhere_is_the_interpreter_the_job_gets(space, tmp_path, place):
    root = tmp_path if place == "tmp" else Path(tempfile.mkdtemp(prefix="harness-venv-", dir="/var/tmp"))
    try:
        python = make_venv(root / "venv")
        site = next((root / "venv" / "lib").glob("python*/site-packages"))
        wheel_copy = site / "harness" / "example" / "data" / "corpus.txt.xz"  # a wheel of the harness there
        wheel_copy.parent.mkdir(parents=True)
        wheel_copy.write_bytes(b"held-out bytes")
        (space["wt"] / "job.py").write_text("import sys, subprocess, json, os\n"
                                            f"copy = os.path.exists({str(wheel_copy)!r})\n"
                                            "print(json.dumps([sys.prefix, subprocess.run(['python', '-c', "
                                            "'import sys; print(sys.prefix)'], capture_output=True, text=True)"
                                            ".stdout.strip(), __import__('numpy').__name__, copy]))\n")
        argv = sandbox.wrap([str(python), "job.py"], worktree=space["wt"], tmp_dir=space["tmp"],
                            hidden=[space["run_dir"]])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        prefix, child_prefix, numpy, copy = json.loads(done.stdout.strip().splitlines()[-1])
        assert prefix == child_prefix == str(root / "venv") and numpy == "numpy"  # `python` inside is the venv's
        assert copy is False  # the bundled corpus of a harness wheel in the venv is covered
    finally:
        if place != "tmp":
            shutil.rmtree(root, ignore_errors=True)


def test_a_venv_that_is_gone_is_a_clear_error_not_another_interpreter(space, tmp_path):
    with pytest.raises(view.ViewError, match="not found on PATH"):
        view.interpreter([str(tmp_path / "gone" / "bin" / "python"), "train.py"])
    with pytest.raises(view.ViewError, match="not found on PATH"):
        view.interpreter(["no-such-python3.99", "train.py"], path_var=str(tmp_path))


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
    assert manifest["sandbox_caps"]["CapEff"] == manifest["sandbox_caps"]["CapBnd"] == "0" * 16  # as root too
    rows = ledger.read_rows(repo / "runs" / "s" / "results.tsv")
    assert rows[0]["status"] == "keep" and len(rows) == 2
    assert rows[0]["sealed"] == "no"  # a foreign workload (no evaluate_command): the printed block, unsealed
    report = harness(["report", repo / "runs" / "s", "--out", tmp_path / "rep"])
    assert report.exit_code == 0, report.output
    assert "| sandbox | bwrap (CapEff 0, CapBnd 0, uid " in (tmp_path / "rep" / "report.md").read_text()
    check = harness(["check", "--repo", repo, "--agent", "mutate"])
    assert check.exit_code == 0, check.output
    assert "sandbox     bwrap (CapEff 0, CapBnd 0, uid " in check.output
    assert "researcher sandbox  none needed (it runs no code" in check.output  # mutate
    edit = "cmd:sed -i s/VALUE\\ =\\ 1.0/VALUE\\ =\\ 0.5/ train.py"
    jailed = harness(["check", "--repo", repo, "--agent", edit, "--agent-sandbox", "bwrap", "--agent-network", "off"])
    assert jailed.exit_code == 0, jailed.output
    assert "researcher sandbox  bwrap (CapEff 0, CapBnd 0, uid " in jailed.output and "no network" in jailed.output


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


@needs_bwrap
def test_a_night_whose_train_command_is_a_venv_outside_tmp(tmp_path):
    """train_command names a venv's python outside /tmp (where a home folder would be: not in the
    job's view unless the harness shows it); the night runs under the sandbox on that interpreter."""
    from conftest import git, make_repo
    root = Path(tempfile.mkdtemp(prefix="harness-venv-", dir="/var/tmp"))
    try:
        python = make_venv(root / "venv")
        repo = make_repo(tmp_path / "r", sandbox="bwrap")
        settings = (repo / "harness.toml").read_text().replace(f'train_command = "{sys.executable} train.py"',
                                                               f'train_command = "{python} train.py"')
        assert str(python) in settings
        (repo / "harness.toml").write_text(settings)
        (repo / "train.py").write_text("import sys\nVALUE = 1.0\nprint('---')\nprint(f'val_bpb: {VALUE}')\n"
                                       "print(f'prefix: {sys.prefix}')\n")
        git(repo, "commit", "-qam", "the venv's python")
        result = harness(["run", "--repo", repo, "--tag", "v", "--agent", "mutate", "--iterations", 1,
                          "--baseline-runs", 1])
        assert result.exit_code == 0, result.output
        rows = ledger.read_rows(repo / "runs" / "v" / "results.tsv")
        assert rows[0]["status"] == "keep" and len(rows) == 2
        log = (repo / "runs" / "v" / rows[0]["log"]).read_text()
        assert f"prefix: {root / 'venv'}" in log  # that interpreter, not another one on PATH
    finally:
        shutil.rmtree(root, ignore_errors=True)
