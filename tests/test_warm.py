"""Warm start (issue 27, executors/warm.py): the slot's next job is handed to an interpreter started
while the previous job trained. Real git, real bwrap, the real local executor and driver: the
jobs report what they see from inside (capabilities, mounts, limits, environment, sys.path,
stdin) and a warm job must see exactly what a cold one does; a job that tries to leave something
for the next one finds nothing of it there.
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from harness import ledger
from harness.config.load import resolve
from harness.driver import loop as driver
from harness.executors import Job, LocalExecutor, sandbox, warm
from harness.gitgate import GitGate

from conftest import ScriptedResearcher, alive, git, make_repo

needs_bwrap = pytest.mark.skipif(not sandbox.probe(sandbox.bwrap_path()).works,
                                 reason="bubblewrap cannot run here (a warm start is sandboxed only)")

# The job: what it sees, as one JSON line in its log; its behaviour per seed from the shown folder
# (`data_paths`): "cheat" leaves what it can for later jobs, "wait" first waits for a `go` file.
TRAIN = r'''import json, os, sys
NAMES = sorted(globals())  # what Python put in __main__ for the script
VALUE = 1.0  # the metric it reports
SHOWN = os.environ.get("WARM_SHOWN", "")
mode = ""
if SHOWN and os.path.exists(os.path.join(SHOWN, "mode-" + os.environ["HARNESS_SEED"])):
    mode = open(os.path.join(SHOWN, "mode-" + os.environ["HARNESS_SEED"])).read().strip()
cwd = os.getcwd()
own = sorted(n for n, m in list(sys.modules.items())
             if n != "__main__" and str(getattr(m, "__file__", "") or "").startswith(cwd))
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return " ".join(line.split()[1:])
mounts = sorted(" ".join([l.split()[4], l.split()[5].split(",")[0], l.split(" - ")[1].split()[0]])
                for l in open("/proc/self/mountinfo"))
st, null = os.fstat(0), os.stat("/dev/null")
seen = {
    "caps": {k: status(k) for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Uid", "Gid")},
    "mounts": mounts, "limits": open("/proc/self/limits").read(), "env": dict(os.environ), "path": sys.path,
    "argv": sys.argv, "name": __name__, "stdin_is_null": st.st_rdev == null.st_rdev, "cwd": cwd,
    "main": [NAMES, type(__builtins__).__name__, __file__, __spec__ is None, type(__loader__).__name__,
             sys.modules["__main__"].__dict__ is globals()],
    "pids": sorted(p for p in os.listdir("/proc") if p.isdigit()), "own_modules": own,
    "marks": {p: os.path.exists(p) for p in ("/tmp/left-by-an-earlier-job", "/dev/shm/left-by-an-earlier-job",
                                             os.path.join(cwd, "json.py"), os.path.join(cwd, "left.txt"))},
    "json_from": json.__file__,
    "age_s": float(open("/proc/uptime").read().split()[0])  # how long this process has lived
             - int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK"),
}
if mode == "wait":
    import time
    until = time.monotonic() + 120
    while not os.path.exists(os.path.join(SHOWN, "go")) and time.monotonic() < until:
        time.sleep(0.05)
if mode in ("wait", "cheat"):
    cmdlines = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cmdlines.append(open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode())
            except OSError:
                pass
    seen["others"] = cmdlines
    for path in ("/tmp/left-by-an-earlier-job", "/dev/shm/left-by-an-earlier-job", "json.py", "left.txt"):
        try:
            open(path, "w").write("raise SystemExit('state from an earlier job')\n")
        except OSError:
            pass
    os.environ["LEFT_BY_AN_EARLIER_JOB"] = "1"
print("SEEN " + json.dumps(seen))
if mode == "exit3":
    sys.exit(3)
print("---")
print(f"val_bpb: {VALUE}")
'''


@pytest.fixture
def shown(tmp_path) -> Path:
    folder = tmp_path / "shown"
    folder.mkdir()
    return folder


@pytest.fixture
def warm_repo(tmp_path, shown) -> Path:
    extra = f'sealed = false\ndata_paths = ["{shown}"]\njob_disk_mb = 2000\n'
    return make_repo(tmp_path / "research", TRAIN, kill_after=120, extra=extra, sandbox="bwrap")


def cfg_of(repo: Path, shown: Path, tag: str = "w", **overrides):
    cfg = resolve(repo, tag, overrides)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    return cfg


def seen(log: Path) -> dict:
    line = next(line for line in log.read_text().splitlines() if line.startswith("SEEN "))
    return json.loads(line[5:])


def normal(view: dict, job: Path) -> dict:
    """What must be the same for every job: the worktree's and the job's own folders' paths replaced."""
    text = json.dumps({k: v for k, v in view.items() if k not in ("marks", "others", "json_from", "pids", "age_s")})
    text = text.replace(view["cwd"], "<worktree>")
    text = re.sub(r"/[^\" ]*?\.job/", "<job>/", text)
    out = json.loads(text)
    for key in ("HARNESS_SEED", "HARNESS_ITERATION", "HARNESS_COMMIT"):
        out["env"].pop(key, None)
    return out


def wait_for(predicate, timeout_s: float = 120.0) -> None:
    until = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < until, "timed out waiting for a state"
        time.sleep(0.05)


@pytest.fixture
def executor(warm_repo, shown, monkeypatch):
    monkeypatch.setenv("WARM_SHOWN", str(shown))
    cfg = cfg_of(warm_repo, shown)
    ex = LocalExecutor(warm_repo, cfg.run_dir / "slots")
    head = GitGate(warm_repo).repo.head.commit.hexsha
    yield ex, cfg, head
    ex.close()


def job(cfg, head: str, seed: int, iteration: int | None = None) -> Job:
    return Job(cfg, head, seed, cfg.run_dir / "logs" / f"job-{seed}.log", iteration=iteration)


@needs_bwrap
def test_a_warm_job_sees_what_a_cold_one_sees(executor):
    ex, cfg, head = executor
    results = [ex.run(job(cfg, head, seed, iteration=seed)) for seed in (1, 2, 3)]
    assert [r.start for r in results] == ["cold", "warm", "warm"], [r.reason for r in results]
    assert all(r.status == "ok" and r.value("val_bpb") == 1.0 for r in results)
    views = [seen(cfg.run_dir / "logs" / f"job-{seed}.log") for seed in (1, 2, 3)]
    cold, *warmed = [normal(v, cfg.run_dir) for v in views]
    for w in warmed:
        for key in cold:
            assert w[key] == cold[key], key
    assert cold["caps"]["CapEff"] == "0000000000000000" and cold["caps"]["CapBnd"] == "0000000000000000"
    assert cold["stdin_is_null"] and cold["argv"] == ["train.py"] and cold["name"] == "__main__"
    assert cold["own_modules"] == []  # nothing of the worktree was imported before the script ran
    assert cold["main"][1:] == ["module", "<worktree>/train.py", True, "SourceFileLoader", True]
    for seed, v in zip((1, 2, 3), views):  # each its own seed and iteration, told at the handover
        assert v["env"]["HARNESS_SEED"] == str(seed) and v["env"]["HARNESS_ITERATION"] == str(seed)
        assert v["env"]["HARNESS_COMMIT"] == head
    assert views[1]["cwd"] != views[0]["cwd"]  # the next job's interpreter waited in the slot's other worktree


@needs_bwrap
def test_a_job_cannot_leave_state_for_the_next_ones(executor, shown):
    """The first job runs while the second one's interpreter waits: it sees no process but its
    own, and what it writes (a json.py that would shadow the library, /tmp, /dev/shm, its
    worktree, its environment) reaches neither the job handed to that interpreter nor the one
    after, whose interpreter starts in the worktree the cheat wrote to."""
    ex, cfg, head = executor
    (shown / "mode-1").write_text("wait")
    first = ex.submit(job(cfg, head, 1))
    wait_for(lambda: ex.all[0].ready is not None and ex.all[0].ready.proc.poll() is None)
    waiting = ex.all[0].ready.proc.pid
    (shown / "go").touch()
    assert first.result().start == "cold"
    cheat = seen(cfg.run_dir / "logs" / "job-1.log")
    assert not any("-c" in c and "runpy" in c for c in cheat["others"]), cheat["others"]
    assert len(cheat["pids"]) <= 3  # bwrap's init, the job (and its shell): nothing of the host nor the other sandbox
    results = [ex.run(job(cfg, head, seed)) for seed in (2, 3)]
    assert [r.start for r in results] == ["warm", "warm"] and all(r.status == "ok" for r in results)
    for seed in (2, 3):
        later = seen(cfg.run_dir / "logs" / f"job-{seed}.log")
        assert not any(later["marks"].values()), later["marks"]
        assert "LEFT_BY_AN_EARLIER_JOB" not in later["env"]
        assert later["json_from"].startswith(sys.base_prefix) or "site-packages" not in later["json_from"]
        assert not later["json_from"].startswith(later["cwd"])
    assert not alive(waiting)  # used once: it ran job 2 and is gone


@needs_bwrap
def test_the_clock_starts_at_the_handover_and_a_job_keeps_its_exit(executor, shown):
    ex, cfg, head = executor
    assert ex.run(job(cfg, head, 1)).start == "cold"
    wait_for(lambda: ex.all[0].ready is not None)
    idle_s = 8.0
    time.sleep(idle_s)  # the interpreter waits, started: none of this is the next job's
    (shown / "mode-2").write_text("exit3")
    done = ex.run(job(cfg, head, 2))
    assert done.start == "warm" and done.status == "crash" and done.returncode == 3, done
    age_s = seen(cfg.run_dir / "logs" / "job-2.log")["age_s"]  # the interpreter's life: the wait, then the job
    assert age_s > idle_s and done.train_s < age_s - idle_s / 2  # the job's clock left the wait out


@needs_bwrap
def test_a_job_whose_start_differs_starts_cold_and_the_waiting_one_is_stopped(executor):
    ex, cfg, head = executor
    assert ex.run(job(cfg, head, 1)).start == "cold"
    wait_for(lambda: ex.all[0].ready is not None)
    waiting = ex.all[0].ready
    other = resolve(cfg.repo, cfg.tag, {"max_steps": 7})  # another HARNESS_MAX_STEPS: another start
    done = ex.run(job(other, head, 2))
    assert done.start == "cold" and done.status == "ok"
    assert "HARNESS_MAX_STEPS" in seen(cfg.run_dir / "logs" / "job-2.log")["env"]
    assert not alive(waiting.proc.pid) and not waiting.space.root.exists()


@needs_bwrap
def test_closing_the_executor_stops_the_waiting_interpreter(warm_repo, shown, monkeypatch):
    monkeypatch.setenv("WARM_SHOWN", str(shown))
    cfg = cfg_of(warm_repo, shown)
    ex = LocalExecutor(warm_repo, cfg.run_dir / "slots")
    head = GitGate(warm_repo).repo.head.commit.hexsha
    assert ex.run(job(cfg, head, 1)).start == "cold"
    wait_for(lambda: ex.all[0].ready is not None)
    pid = ex.all[0].ready.proc.pid
    ex.close()
    assert not alive(pid)
    assert not ex.warm_root.exists() and not (cfg.run_dir / "slots" / "0w").exists()
    assert "0w" not in git(warm_repo, "worktree", "list")


@needs_bwrap
@pytest.mark.parametrize("pipeline", [False, True], ids=["sequential", "pipelined"])
def test_a_night_hands_its_candidates_to_warm_interpreters_and_the_ledger_says_so(warm_repo, shown, monkeypatch,
                                                                                   pipeline):
    monkeypatch.setenv("WARM_SHOWN", str(shown))
    started = []  # every interpreter a slot readied
    real_start = warm.start
    monkeypatch.setattr(warm, "start", lambda *a, **k: started.append(a[1]) or real_start(*a, **k))
    # three candidates, none kept: pipelined, none is rebased onto a new best (trained on the best it had)
    edits = [{"VALUE": v} for v in (1.1, 1.2, 1.3)]
    cfg = resolve(warm_repo, "night", {"iterations": 3, "baseline_runs": 1, "gate": "strict", "policy": False,
                                       "pipeline": pipeline})
    driver.run(cfg, researcher=ScriptedResearcher(edits))
    rows = ledger.read_rows(cfg.ledger_path)
    events = (cfg.run_dir / "events.log").read_text() if (cfg.run_dir / "events.log").exists() else ""
    assert [r["start"] for r in rows] == ["cold", "warm", "warm", "warm"], events
    # one for each candidate, none after the last: the run foresaw no job after it (Job.successor)
    assert len(started) == 3, started
    off = resolve(warm_repo, "cold", {"iterations": 1, "baseline_runs": 1, "gate": "strict", "policy": False,
                                      "warm_start": False})
    driver.run(off, researcher=ScriptedResearcher([{"VALUE": 0.5}]))
    assert [r["start"] for r in ledger.read_rows(off.ledger_path)] == ["cold", "cold"]


def test_only_a_plain_python_script_is_started_warm(tmp_path):
    repo = make_repo(tmp_path / "r", "print('hi')\n")
    for command, ok in (("python train.py", True), ("python3.11 train.py --lr 1", True),
                        (f"{sys.executable} train.py", True), ("uv run train.py", False),
                        ("python -u train.py", False), ("bash run.sh", False), ("python -m train", False)):
        cfg = resolve(repo, "c", {"train_command": command})
        assert (warm.command(cfg) is not None) is ok, command
    assert warm.command(resolve(repo, "c", {"warm_start": False})) is None


def test_the_modules_imported_ahead_are_the_interpreters_not_the_worktrees(tmp_path):
    (tmp_path / "train.py").write_text("import os, numpy as np\nfrom torch import nn\nfrom prepare import x\n"
                                       "from . import y\nimport helpers.sub\ndef f():\n    import json\n"
                                       "try:\n    import pyarrow\nexcept ImportError:\n    import csv\n")
    (tmp_path / "prepare.py").write_text("import math\n")
    (tmp_path / "helpers").mkdir()
    (tmp_path / "broken.py").write_text("def (:\n")
    assert warm.modules(tmp_path) == ["csv", "math", "numpy", "os", "pyarrow", "torch"]  # json: in a function


def test_the_launcher_runs_the_script_as_python_would(tmp_path):
    """Without a sandbox: the launcher's own semantics (argv, __main__, sys.path, exit code)."""
    import subprocess
    (tmp_path / "train.py").write_text("import sys, os\nimport helper\nprint(sys.argv, __name__, sys.path[0] == "
                                       "os.getcwd(), os.environ['HARNESS_SEED'], 'GONE' in os.environ)\n"
                                       "sys.exit(int(os.environ['HARNESS_SEED']))\n")
    (tmp_path / "helper.py").write_text("")
    (tmp_path / "json.py").write_text("raise SystemExit('the worktree was imported before the handover')\n")
    proc = subprocess.Popen([sys.executable, "-c", warm.LAUNCHER, "json,os"], cwd=tmp_path, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={"GONE": "1", "PATH": "/usr/bin"})
    out, _ = proc.communicate(json.dumps({"env": {"HARNESS_SEED": "4"}, "unset": ["GONE"],
                                          "argv": ["train.py", "--x"]}).encode() + b"\n", timeout=60)
    assert proc.returncode == 4, out
    assert out.decode().strip() == "['train.py', '--x'] __main__ True 4 False"
    quiet = subprocess.run([sys.executable, "-c", warm.LAUNCHER, ""], cwd=tmp_path, input=b"", timeout=60)
    assert quiet.returncode == 0  # the harness went away before a job came: it never runs one


def test_only_the_default_disk_bound_may_drift_between_two_starts():
    from harness.executors.limits import Limits
    a, b = Limits(1000, 64, 20_000, 128, disk_default=True), Limits(1000, 64, 19_000, 128, disk_default=True)
    assert warm.same_bounds(a, b)  # a share of the free disk, measured at each start
    assert not warm.same_bounds(Limits(1000, 64, 20_000, 128), Limits(1000, 64, 19_000, 128))  # set: exact
    assert not warm.same_bounds(a, Limits(1000, 64, 20_000, 128))
    assert not warm.same_bounds(a, Limits(2000, 64, 20_000, 128, disk_default=True))


@needs_bwrap
def test_a_killed_supervisor_leaves_no_interpreter_behind_and_resume_finishes(warm_repo, tmp_path):
    from faults.conftest import agent_arg, assert_recovered, harness_run, run_processes
    args = ("--agent", agent_arg(tmp_path), "--iterations", "3", "--job-disk-mb", "2000")
    killed = harness_run(warm_repo, "k", *args, fault="during_train:3")  # iteration 2's job, handed over warm
    assert killed.returncode == -9, killed.stderr
    run_dir = warm_repo / "runs" / "k"
    wait_for(lambda: not run_processes(run_dir), 60)  # bwrap's --die-with-parent: the job and the waiting one
    resumed = harness_run(warm_repo, "k", *args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    rows = assert_recovered(warm_repo, "k", 3)
    assert "warm" in [r["start"] for r in rows] and rows[0]["start"] == "cold"
