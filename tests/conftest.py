"""Shared fixtures: real git repos in tmp_path driven by a fake trainer or the real train.py."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.agents import Proposal, Task

ROOT = Path(__file__).resolve().parent.parent
# One thread per torch job (the real train.py and its evaluator, here and in every subprocess and Ray
# node the tests start): three workers share two cores, and a job's spinning OpenMP threads on a busy
# core make a few CPU steps take many seconds. Set before any test starts a process.
os.environ.setdefault("OMP_NUM_THREADS", "1")
FAKE_TRAIN = (Path(__file__).parent / "fake_train.py").read_text()

SETTINGS = """editable = ["train.py"]
protected = ["prepare.py"]
train_command = "{python} train.py"
metric = "val_bpb"
direction = "minimize"
time_budget = 5
kill_after = {kill_after}
program = "program.md"
sandbox = "{sandbox}"
agent_sandbox = "{agent_sandbox}"
"""
# The fake trainers keep state next to the repo (noise and drift counters, GPU logs, child pids),
# which the sandbox rightly hides from a job; so these repos run unsandboxed unless a test asks.
# The same for the test researchers (call counters, pids, scripts they consume, in the run folder
# or tmp_path) and the researcher's sandbox (tests/cheats/test_cheats_researcher.py exercises it).
# The sandbox itself is exercised by tests/test_sandbox.py, the cheat suite and test_evaluation.py.


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (one gone between the two looks is not alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def own_cgroups(root: Path = Path("/sys/fs/cgroup")) -> list[Path]:
    """The cgroups this process made for its jobs (limits.py names them harness-PID-...) still
    there: made since it started (an earlier process with its PID, killed, may have left its own).
    Walked with os.walk, which skips a folder gone meanwhile: the other workers' jobs make and
    remove theirs as this looks."""
    import psutil
    mine, since = f"harness-{os.getpid()}-", psutil.Process().create_time() - 1
    found = []
    for top, dirs, _ in os.walk(root):
        for d in dirs:
            if d.startswith(mine):
                try:
                    if os.stat(Path(top) / d).st_ctime >= since:
                        found.append(Path(top) / d)
                except OSError:  # removed as this looked
                    pass
    return found


def set_globals(source: str, **values) -> str:
    """Rewrite `NAME = ...` lines of a train.py source."""
    for name, value in values.items():
        source, n = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", source, count=1, flags=re.M)
        assert n == 1, name
    return source


def make_repo(path: Path, train_source: str = FAKE_TRAIN, kill_after: float = 20, extra: str = "",
              sandbox: str = "off", agent_sandbox: str = "off") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "train.py").write_text(train_source)
    (path / "prepare.py").write_text("# protected evaluation code\nEVAL_BYTES = 1000\n")
    (path / "program.md").write_text("Lower val_bpb wins.\n\n{{BEST}}\n\n{{RESULTS}}\n\n{{LAST_FAILURE}}\n")
    settings = SETTINGS.format(python=sys.executable, kill_after=kill_after, sandbox=sandbox,
                               agent_sandbox=agent_sandbox)
    (path / "harness.toml").write_text(settings + extra)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.name", "Test User")
    git(path, "config", "user.email", "test@example.com")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "research")


class ScriptedResearcher:
    """A researcher that applies a scripted list of edits: each a dict of globals, a callable or an exception."""
    name = "scripted"
    model = None

    def __init__(self, script):
        self.script = list(script)
        self.calls: list[Task] = []

    def describe(self):
        return {"backend": "scripted"}

    def propose(self, task: Task) -> Proposal:
        self.calls.append(task)
        step = self.script.pop(0) if self.script else {}
        start = time.monotonic()
        if isinstance(step, BaseException):
            raise step
        if callable(step):
            return step(task)
        train = task.worktree / "train.py"
        train.write_text(set_globals(train.read_text(), **step))
        desc = ", ".join(f"{k}={v}" for k, v in step.items()) or "nothing"
        return Proposal(desc, agent_s=time.monotonic() - start)


# The bundled model at the size the tests train it: one block of 64 channels (82K parameters)
# instead of the CPU default's four of 128 (0.8M). The same train.py, export and evaluation (every
# check, every probe call), at about 5 CPU-s per candidate instead of 8 (the evaluation's 48
# forward calls shrink the most); the README's demo path (test_cli.py) keeps the default size.
SMALL_MODEL = {"DEPTH": 1, "WIDTH": 64}


def small_model(source: str) -> str:
    """A bundled train.py's source with the tests' model size (SMALL_MODEL)."""
    return set_globals(source, **SMALL_MODEL)


def small_example(dest: Path, test_split: bool = True) -> Path:
    """`harness init --example` at dest, its model made small (SMALL_MODEL) in a second commit;
    without its test_command unless test_split (no end-of-night training of the baseline again
    for the test split: tests/test_testsplit.py and tests/cheats/test_cheats_testsplit.py have it)."""
    from harness.commands.initrepo import init_example
    repo = init_example(dest)
    (repo / "train.py").write_text(small_model((repo / "train.py").read_text()))
    if not test_split:
        toml = repo / "harness.toml"
        toml.write_text("".join(line for line in toml.read_text().splitlines(True) if not line.startswith("test_command")))
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "the tests' model size")
    return repo


@pytest.fixture
def work(tmp_path):
    """A copy of the bundled workload, as the harness's worktree would hold it (the tests' model size)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(small_model((ROOT / "train.py").read_text()))
    shutil.copy(ROOT / "prepare.py", work / "prepare.py")
    shutil.copytree(ROOT / "data", work / "data")
    return work

# ---------------------------------------------------------------------------
# Parallel runs (pytest-xdist, `--dist loadgroup` in scripts/test.sh). A module whose expensive
# fixture is shared by its tests runs on one worker, so the fixture is made once, not once per
# worker (or again whenever the worker's next test is another module's): the cheat suite's runs,
# the built wheel. The tests that start a Ray cluster share one worker too, one after another (a
# head binds fixed ports besides its own, and two clusters at once would take both cores).
# First match wins: test_cheats_ray is Ray's. Each other cheat module is a group of its own (its own
# module-scoped runs), so several of them can run on the workers at once; so is any other module
# whose tests share a module-scoped fixture (_shares_a_module_fixture).
SERIAL_GROUPS = {"ray": ("test_ray", "test_cheats_ray"), "cheats": ("test_cheats",), "install": ("test_install",)}
OWN_GROUP = ("test_cheats_",)  # within "cheats": the module's own name is its group


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks into node ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("xdist_group"):  # a module that splits its shared runs names their groups
            continue
        name = Path(str(item.fspath)).stem
        group = next((g for g, prefixes in SERIAL_GROUPS.items() if name.startswith(prefixes)), None)
        if group == "cheats" and name.startswith(OWN_GROUP):
            group = name
        if group is None and _shares_a_module_fixture(item):
            group = f"module:{item.nodeid.split('::')[0]}"
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=_start_rank)  # stable: the collection's order within a rank


# The longest groups first (xdist hands a worker its next group in the collection's order): the Ray
# group (one cluster at a time, minutes of serial work) and the cheat suite's two halves start at
# once, and the short tests fill in around them, rather than the Ray group starting last and
# running on alone after everything else is done.
START_FIRST = {"ray": 0, "cheats-a": 1, "cheats-b": 1}


def _start_rank(item) -> int:
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return 3
    return START_FIRST.get(mark.args[0] if mark.args else mark.kwargs.get("name", ""), 2)


def _shares_a_module_fixture(item) -> bool:
    """Does the test use a fixture made once per module (or package) and shared by the module's tests:
    then its module runs on one worker, in one piece, and the fixture is made once (the rule above
    for every module, not a list of them)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope in ("module", "package") for name in item.fixturenames
               for d in info.name2fixturedefs.get(name, ()))
