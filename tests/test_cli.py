"""The `harness` command as a user runs it: refusals, run, step, status, init, Ctrl-C."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import ledger
from harness.cli import main

from conftest import ROOT, git, make_repo


def harness(*args: str, expect: int = 0):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == expect, result.output
    return result


def test_run_with_mutate_then_status(repo: Path):
    harness("run", "--repo", str(repo), "--tag", "night", "--agent", "mutate", "--iterations", "4")
    rows = [r for r in ledger.read_rows(repo / "runs/night/results.tsv") if r["status"] != "repeat"]
    assert len(rows) == 5 and rows[0]["status"] == "keep"
    assert all(r["agent"] == "mutate" for r in rows)
    assert all("->" in r["description"] for r in rows[1:])
    assert all(r["status"] in ("keep", "discard", "crash") for r in rows[1:])
    out = harness("status", "night", "--repo", str(repo)).output
    assert "experiments:   4," in out and "baseline:      1.000000" in out
    listed = harness("status", "--repo", str(repo)).output  # no tag: the runs, one a line
    assert listed.splitlines()[1].split()[:3] == ["night", "run", "4"]
    # The same seed proposes the same edits.
    harness("run", "--repo", str(repo), "--tag", "again", "--agent", "mutate", "--iterations", "4")
    again = [r for r in ledger.read_rows(repo / "runs/again/results.tsv") if r["status"] != "repeat"]
    assert [r["description"] for r in again] == [r["description"] for r in rows]


def test_step_runs_one_iteration_per_call(repo: Path):
    for _ in range(3):
        harness("step", "--repo", str(repo), "--tag", "s", "--agent", "mutate", "--baseline-runs", "1")
    rows = ledger.read_rows(repo / "runs/s/results.tsv")
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]


@pytest.mark.parametrize("setup,args,message", [
    ("nogit", [], "is not a git repository"),
    ("no_train", [], "train.py is not committed"),
    ("no_prepare", [], "prepare.py is not committed"),
    ("dirty", [], "uncommitted changes in train.py"),
    ("branch", [], "already exists: pass --resume"),
    ("none", ["--resume"], "nothing to resume"),
    ("unknown_key", [], "unknown config key 'learning_rate'"),
    ("bad_value", [], "'time_budget' must be a positive number"),
    ("bad_toml", [], "is not valid TOML"),
    ("none", ["--from", "nosuchrev"], "'nosuchrev' is not a commit"),
    ("none", ["--agent", "gpt-robot"], "unknown agent 'gpt-robot'"),
])
def test_refusals_say_what_to_do(tmp_path: Path, setup: str, args: list[str], message: str):
    repo = make_repo(tmp_path / "r")
    if setup == "nogit":
        import shutil
        shutil.rmtree(repo / ".git")
    elif setup == "no_train":
        git(repo, "rm", "-q", "train.py")
        git(repo, "commit", "-qm", "drop train.py")
    elif setup == "no_prepare":
        git(repo, "rm", "-q", "prepare.py")
        git(repo, "commit", "-qm", "drop prepare.py")
    elif setup == "dirty":
        (repo / "train.py").write_text((repo / "train.py").read_text() + "\n# wip\n")
    elif setup == "branch":
        git(repo, "branch", "autoresearch/t")
    elif setup in ("unknown_key", "bad_value", "bad_toml"):
        extra = {"unknown_key": "learning_rate = 0.1\n", "bad_value": "", "bad_toml": "time_budget = [\n"}[setup]
        text = (repo / "harness.toml").read_text() + extra
        if setup == "bad_value":
            text = text.replace("time_budget = 5", "time_budget = -1")
        (repo / "harness.toml").write_text(text)
    before = git(repo, "status", "--porcelain") if setup != "nogit" else ""
    result = harness("run", "--repo", str(repo), "--tag", "t", "--iterations", "1", *args, expect=1)
    assert message in result.output
    if setup != "nogit":
        assert git(repo, "status", "--porcelain") == before  # nothing touched
        assert not (repo / "runs/t/results.tsv").exists() or setup == "branch"


def slow_run(tmp_path: Path, tag: str, *args: str) -> tuple[Path, list[str], dict, subprocess.Popen]:
    """A real `harness run` on a repo whose (fake) training takes 1 s, started in the background
    and waited for until its first candidate trains: (repo, its command line, env, process)."""
    source = (ROOT / "tests/fake_train.py").read_text().replace("SLEEP_S = 0.0", "SLEEP_S = 1.0")
    repo = make_repo(tmp_path / "r", train_source=source)
    cmd = [sys.executable, "-m", "harness", "run", "--repo", str(repo), "--tag", tag, "--agent", "mutate", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = repo / f"runs/{tag}/logs/iter-0001.log"
    deadline = time.monotonic() + 30
    while not log.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.exists(), proc.communicate(timeout=10)
    return repo, cmd, env, proc


def test_a_closed_terminal_ends_the_run_with_129_and_its_summary_in_a_file(tmp_path: Path):
    """`harness run` in a real terminal (a pty, its controlling tty) that is closed while a candidate
    trains, as a closed tmux pane or ssh session does: SIGHUP, then every print fails (EIO). The run
    still ends as a stop does: exit 129 (128 + SIGHUP), the summary in runs/<tag>/summary.txt, the
    candidate journalled for --resume, nothing left running."""
    import fcntl
    import termios
    import threading
    source = (ROOT / "tests/fake_train.py").read_text().replace("SLEEP_S = 0.0", "SLEEP_S = 2.0")
    repo = make_repo(tmp_path / "r", train_source=source)
    master, slave = os.openpty()

    def controlling_tty():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    cmd = [sys.executable, "-m", "harness", "run", "--repo", str(repo), "--tag", "h", "--agent", "mutate",
           "--iterations", "3", "--baseline-runs", "1"]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm"}, stdin=slave,
                            stdout=slave, stderr=slave, preexec_fn=controlling_tty)
    os.close(slave)
    seen = bytearray()

    def drain():  # a terminal someone reads, until it is closed
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                seen.extend(chunk)
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    log = repo / "runs/h/logs/iter-0001.log"
    deadline = time.monotonic() + 60
    while not log.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert log.exists(), bytes(seen)[-2000:]
    os.close(master)  # the terminal goes away
    assert proc.wait(timeout=60) == 129, bytes(seen)[-2000:]
    summary = (repo / "runs/h/summary.txt").read_text()
    assert "SIGHUP" in summary and "best" in summary, summary
    assert json.loads((repo / "runs/h/inflight-0a.json").read_text())["iteration"] == 1
    assert subprocess.run(["pgrep", "-f", str(repo)], capture_output=True).stdout == b""


def test_ctrl_c_in_the_first_second_is_one_line_and_130(tmp_path: Path):
    """A Ctrl-C before the run's own handlers exist (the CLI still importing, the config being read,
    the baseline about to start) ends `harness run` with exit 130 and no traceback, wherever it lands."""
    repo = make_repo(tmp_path / "r")
    for n, delay in enumerate((0.0, 0.15, 0.4, 0.8)):
        cmd = [sys.executable, "-m", "harness", "run", "--repo", str(repo), "--tag", f"e{n}", "--agent", "mutate",
               "--iterations", "1", "--baseline-runs", "1"]
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, errtext = proc.communicate(timeout=60)
        assert "Aborted!" not in errtext, (delay, errtext)
        if "Traceback" in errtext:  # only Python's own start-up (site), before any harness code ran
            assert "harness/" not in errtext and "harness." not in errtext, (delay, errtext)
            assert proc.returncode in (1, -signal.SIGINT, 130), (delay, proc.returncode, errtext)
            continue
        # -2: killed before the interpreter had its own handler (a shell shows 130 too); 0: it had finished
        assert proc.returncode in (130, -signal.SIGINT, 0), (delay, proc.returncode, errtext)


STALLING_GIT = """#!/bin/sh
# git, except that the set-up's dirty-repo check stalls (the marker says it has started)
case "$*" in
  "status --porcelain --untracked-files=all"*) touch "$STALL_MARK"; sleep 30 ;;
esac
exec {git} "$@"
"""


def test_ctrl_c_while_the_set_up_waits_on_git_exits_at_once(tmp_path: Path):
    """A Ctrl-C that lands while the set-up waits on a git command (a slow disk, a big repo): exit
    130 at once. GitPython's deadline is a timer thread that its call leaves running when an
    interrupt escapes it, and Python's exit waits for every such thread (GIT_TIMEOUT_S, 300 s)."""
    import shutil
    repo = make_repo(tmp_path / "r")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(STALLING_GIT.format(git=shutil.which("git")))
    (bin_dir / "git").chmod(0o755)
    mark = tmp_path / "stalled"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{bin_dir}:{os.environ['PATH']}", "STALL_MARK": str(mark)}
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", "--repo", str(repo), "--tag", "g", "--agent",
                             "mutate", "--iterations", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        until = time.monotonic() + 120
        while not mark.exists() and proc.poll() is None and time.monotonic() < until:
            time.sleep(0.05)
        assert mark.exists(), "the set-up never ran its dirty-repo check"
        proc.send_signal(signal.SIGINT)
        out, errtext = proc.communicate(timeout=60)  # the timer thread would hold it 300 s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, errtext
    assert "Traceback" not in errtext and "interrupted (Ctrl-C)" in errtext, errtext


def test_ctrl_c_during_training_then_resume(tmp_path: Path):
    """A real SIGINT to a real `harness run` while a candidate trains: nothing lost, HEAD at best."""
    repo, cmd, env, proc = slow_run(tmp_path, "c", "--iterations", "3", "--baseline-runs", "1")
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, errtext = proc.communicate(timeout=30)
    assert proc.returncode == 130, errtext  # 128 + SIGINT, as a shell expects of an interrupted command
    assert "interrupted" in errtext
    rows = ledger.read_rows(repo / "runs/c/results.tsv")
    assert [r["status"] for r in rows] == ["keep"]  # nothing decided; the candidate waits for --resume
    assert "1 committed candidate will be trained first" in " ".join(errtext.split()), errtext
    journal = json.loads((repo / "runs/c/inflight-0a.json").read_text())
    assert journal["iteration"] == 1 and journal["commit"]
    wt = repo / "runs/c/worktree"
    assert git(wt, "rev-parse", "HEAD").startswith(rows[0]["commit"])
    assert git(wt, "status", "--porcelain") == ""
    # No training job survives the supervisor.
    assert subprocess.run(["pgrep", "-f", str(wt / "train.py")], capture_output=True).returncode != 0
    status = subprocess.run([sys.executable, "-m", "harness", "status", "c", "--repo", str(repo)],
                            env=env, capture_output=True, text=True, timeout=60).stdout
    assert "waiting for --resume: iteration 1" in status
    resumed = subprocess.run(cmd + ["--resume"], env=env, check=True, capture_output=True, text=True, timeout=60)
    assert "training the candidate the interruption left untrained" in resumed.stderr
    rows = ledger.read_rows(repo / "runs/c/results.tsv")
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert rows[1]["commit"] == journal["commit"][:12] and rows[1]["status"] in ("keep", "discard")


def test_a_second_supervisor_on_a_running_run_is_refused(tmp_path: Path):
    """`harness run --resume` in another pane while the run goes on: refused, nothing disturbed."""
    repo, cmd, env, first = slow_run(tmp_path, "one", "--baseline-runs", "1", "--time-budget", "5",
                                     "--iterations", "2")
    second = subprocess.run(cmd + ["--resume"], env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode != 0
    assert "already being driven by another harness (pid " in " ".join(second.stderr.split())
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    rows = ledger.read_rows(repo / "runs/one/results.tsv")
    assert [r["iteration"] for r in rows] == [0, 1, 2]  # the first run went on undisturbed
    assert "orphan" not in " ".join(r["description"] for r in rows)
    # Once the first has ended, --resume is welcome again.
    again = subprocess.run(cmd[:-1] + ["3", "--resume"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert len(ledger.read_rows(repo / "runs/one/results.tsv")) == 4


def test_init_existing_repo_and_karpathy_checkout(tmp_path: Path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "train.py").write_text("print('hi')\n")
    harness("init", "--repo", str(plain))
    assert 'train_command = "python train.py"' in (plain / "harness.toml").read_text()
    assert "{{RESULTS}}" in (plain / "program.md").read_text()
    # A karpathy/autoresearch-style checkout: uv project, prepare.py, its own program.md.
    kp = tmp_path / "kp"
    kp.mkdir()
    for name in ("train.py", "prepare.py", "uv.lock"):
        (kp / name).write_text("# x\n")
    (kp / "program.md").write_text("# autoresearch\n")
    (kp / "pyproject.toml").write_text('[project]\nname = "autoresearch"\nversion = "0.1.0"\n')
    harness("init", "--repo", str(kp))
    text = (kp / "pyproject.toml").read_text()
    assert 'train_command = "uv run train.py"' in text and 'protected = ["prepare.py"]' in text
    assert (kp / "program.md").read_text() == "# autoresearch\n"
    from harness.config.load import resolve
    cfg = resolve(kp, "x", {})
    assert cfg.train_command == "uv run train.py" and cfg.protected == ("prepare.py",)
    harness("init", "--repo", str(tmp_path / "missing"), expect=1)


def test_init_example_creates_a_ready_repo(tmp_path: Path):
    dest = tmp_path / "example"
    harness("init", "--example", str(dest))
    for name in ("train.py", "prepare.py", "program.md", "data/shakespeare.txt.xz", "harness.toml"):
        assert (dest / name).exists(), name
    assert git(dest, "status", "--porcelain") == ""
    harness("init", "--example", str(dest), expect=1)  # not empty any more


def demo_flags(**overrides: str) -> list[str]:
    """scripts/demo.sh's `harness run` flags, its defaults filled in (a flag in overrides replaced)."""
    import re
    import shlex
    text = (ROOT / "scripts/demo.sh").read_text().replace("\\\n", " ")
    line = text[text.index("exec harness run ") + len("exec harness run "):].splitlines()[0]
    argv = shlex.split(re.sub(r'"\$\{\w+:-([^}]*)\}"', r"\1", line))
    argv = [a for a in argv if a != "$@"]
    flags = dict(zip(argv[::2], argv[1::2]))
    flags.pop("--tag")
    flags.update({f"--{k.replace('_', '-')}": v for k, v in overrides.items()})
    return [x for pair in flags.items() for x in pair]


def test_demo_path_on_the_real_workload(tmp_path: Path, monkeypatch):
    """What the README's demo does (scripts/demo.sh's flags), on a new repo made by `harness init
    --example`: the real train.py, step-bounded, sealed, and reproducible from run to run; its
    time budget cannot bind, so a loaded machine gives the same figures."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    dest = tmp_path / "example"
    harness("init", "--example", str(dest))
    flags = demo_flags(iterations="1", max_steps="5")  # a baseline and one candidate, in each of the two runs
    assert float(flags[flags.index("--time-budget") + 1]) >= 1800  # 60 CPU steps never take that long
    args = ["--repo", str(dest), *flags]
    harness("run", "--tag", "one", *args)
    harness("run", "--tag", "two", *args)
    one = ledger.read_rows(dest / "runs/one/results.tsv")
    two = ledger.read_rows(dest / "runs/two/results.tsv")
    assert [r["iteration"] for r in one] == [0, 1]
    assert 3.0 < one[0]["metric"] < 8.0  # learned something in 5 steps; 8.0 is a uniform guess
    assert all(r["sealed"] == "yes" for r in one if r["metric"] is not None)
    assert [(r["description"], r["metric"], r["status"]) for r in one] == \
        [(r["description"], r["metric"], r["status"]) for r in two]
    assert git(dest, "status", "--porcelain") == ""
    # scripts/gpu_check.sh's figures, from a run folder (here a CPU one): the job's own report block
    summary = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_check_summary.py"), str(dest / "runs/one")],
                             capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0, summary.stderr
    assert "device cpu" in summary.stdout and "status keep" in summary.stdout and "steps 5" in summary.stdout
    assert "tokens/s" in summary.stdout and "CapEff 0000000000000000" in summary.stdout


def test_gpu_check_says_what_is_missing_on_a_machine_without_a_gpu():
    """scripts/gpu_check.sh is run later, where a GPU is lent; without one it says so and stops."""
    if subprocess.run(["sh", "-c", "command -v nvidia-smi"], capture_output=True).returncode == 0:
        pytest.skip("this machine has nvidia-smi: scripts/gpu_check.sh is run by hand here")
    done = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no nvidia-smi" in done.stderr


def test_step_declares_every_option_of_run_but_the_runs_length():
    from harness.cli.runs import run, step
    names = lambda command: {opt for p in command.params for opt in p.opts + p.secondary_opts}  # noqa: E731
    assert names(run) - names(step) == {"--hours", "--iterations"}
