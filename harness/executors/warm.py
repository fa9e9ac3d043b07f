"""Warm start: the slot's next job's interpreter, started while the current job trains.

A job whose command is `python SCRIPT [ARGS]` need not pay its interpreter's start-up, its imports
and the first read of its training split on the slot's time: the local executor starts, in the
slot's second worktree, an interpreter that does them and then waits (`start`). When the slot's
next job comes, that worktree is reset to the job's commit and, if the job's start (launch.Launch:
environment, sandbox, bounds) is exactly the one the interpreter was started with (`fits`), the job
is handed to it (`hand_over`): its own variables (seed, iteration, commit), its argv, and the go.
The job's clock starts there, and the CPU the interpreter used before it is not the job's.

What keeps one job's code away from the next (docs/robustness.md, "Warm start"):
- a warm interpreter is started before any researcher code exists in it: it imports from the
  interpreter's own paths only (the worktree is put on sys.path at the handover, as `python
  SCRIPT` does, not before; and the worktree was reset to a commit and cleaned before it started);
- it is used by one job, once: it runs the job and exits, as a cold start does;
- it runs under the sandbox, bounds and environment the job's cold start gets (`fits`; anything
  else is a cold start), in its own PID, IPC and network namespaces, its own cgroup, private /tmp
  and output folder: the job training meanwhile can neither see it nor write where it reads;
- only under the sandbox: an unsandboxed job could reach the waiting interpreter of the next one.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from ..config import RunConfig
from ..lifecycle import supervise
from ..workload.runner import Started, TrainResult, kill_group
from . import limits, sandbox, view
from .launch import Launch, launch

PER_JOB_ENV = ("HARNESS_SEED", "HARNESS_ITERATION", "HARNESS_COMMIT")  # told at the handover, the rest at the start
PYTHON_RE = re.compile(r"^python(\d+(\.\d+)*)?$")  # `python`, `python3`, `python3.11`, a venv's bin/python
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_MODULES = 64  # top-level modules imported ahead
MAX_SCAN_BYTES = 1 << 20  # of a .py file parsed for its imports
WARM_READ_MB = 2048  # of the training split read ahead (into the page cache)

# What the warm interpreter runs (`python -c LAUNCHER MODULES`). Nothing here reads the worktree:
# its first statement takes the worktree (-c's '') off sys.path, so an import finds the
# interpreter's own modules only, and the job's script is run at the handover, as `python SCRIPT`
# would: its folder first on sys.path, its argv, stdin /dev/null, and its code run in the process's
# own __main__ module, emptied of the launcher's names and set up as Python sets up a script's
# (`__builtins__` the module, `__file__`, a SourceFileLoader, no `__spec__`).
LAUNCHER = r"""
import sys
del sys.path[0]
import os, json


def _ready(names, data, left):
    for name in names.split(","):
        try:
            if name:
                __import__(name)
        except Exception:
            pass
    for root, _, files in os.walk(data or "/nonexistent"):
        for file in sorted(files):
            try:
                with open(os.path.join(root, file), "rb") as f:
                    while left > 0 and f.read(1 << 20):
                        left -= 1 << 20
            except OSError:
                pass


def _go():
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 65536)
        if not chunk:
            os._exit(0)
        line += chunk
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    go = json.loads(line)
    for key in go["unset"]:
        os.environ.pop(key, None)
    os.environ.update(go["env"])
    sys.argv = go["argv"]
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))


def _run(script):
    import importlib.machinery, os, sys
    main = sys.modules["__main__"].__dict__
    for key in [k for k in main if k not in ("__name__", "__builtins__")]:
        del main[key]
    path = os.path.abspath(script)
    main.update(__doc__=None, __package__=None, __spec__=None, __annotations__={}, __file__=path,
                __cached__=None, __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, main)


_ready(sys.argv[1], os.environ.get("HARNESS_DATA_DIR"), %(read)d << 20)
_go()
_run(sys.argv[0])
""" % {"read": WARM_READ_MB}


def command(cfg: RunConfig) -> tuple[str, list[str]] | None:
    """(the interpreter as the command names it, [script, *args]) of a train_command a warm
    interpreter can run: `python SCRIPT.py [ARGS]`, no interpreter options; None otherwise."""
    if not cfg.warm_start:
        return None
    try:
        argv = shlex.split(cfg.train_command)
    except ValueError:
        return None
    if len(argv) < 2 or not PYTHON_RE.match(Path(argv[0]).name) or not argv[1].endswith(".py"):
        return None
    return argv[0], argv[1:]


def eligible(cfg: RunConfig) -> bool:
    """Can the run's jobs start warm at all: a `python SCRIPT` command, warm_start on, sandboxed."""
    return command(cfg) is not None and sandbox.resolve(cfg.sandbox).on


def modules(worktree: Path) -> list[str]:
    """The top-level modules the worktree's Python files import at module level that are not the
    worktree's own (torch, numpy, ...): what the warm interpreter imports ahead. Parsed, never run."""
    worktree = Path(worktree)
    found: set[str] = set()
    for path in sorted(worktree.glob("*.py")):
        try:
            if path.is_symlink() or path.stat().st_size > MAX_SCAN_BYTES:
                continue
            tree = ast.parse(path.read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        found.update(_imported(tree.body))
    own = {p.stem for p in worktree.glob("*.py")} | {p.name for p in worktree.iterdir() if p.is_dir()}
    return sorted(n for n in found if MODULE_RE.match(n) and n not in own and n != "__future__")[:MAX_MODULES]


def _imported(body: list[ast.stmt]) -> set[str]:
    """The top-level module names a module's own statements import (inside if / try / with blocks
    too, never inside a function or class: an import a function makes may never run)."""
    out: set[str] = set()
    for node in body:
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody", "handlers"):
                for inner in getattr(node, block, []):
                    out |= _imported(inner.body if isinstance(inner, ast.ExceptHandler) else [inner])
    return out


def _view(how: Launch, argv: list[str]) -> list[str]:
    """The sandbox a command gets (bwrap's arguments up to the program, and the program itself)."""
    wrapped = how.wrap(argv) if how.wrap is not None else []
    cut = wrapped.index("--") if "--" in wrapped else len(wrapped)
    return wrapped[:cut + 2]


def same_bounds(a: limits.Limits, b: limits.Limits) -> bool:
    """The same bounds; the machine's default disk bound (a share of the free disk, measured at each
    start) may have drifted between the two starts. The job runs under the interpreter's."""
    if a.disk_default and b.disk_default:
        return replace(a, disk_mb=0) == replace(b, disk_mb=0)
    return a == b


def _shared_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in PER_JOB_ENV}


@dataclass
class Warm:
    """An interpreter waiting in worktree for the slot's next job."""
    worktree: Path
    space: object  # evaluation.Space: the job's folders, bound for it when it started
    log: Path  # its output until the handover; the job's log after it
    proc: subprocess.Popen
    group: limits.Cgroup | None
    how: Launch  # the start it was given: the job must have this one
    view: list[str]  # its sandbox, as the job's cold start would get it
    why: str = ""  # why it was not handed its job, when it was not
    used: bool = False  # handed its job, or discarded: either way no other job gets it

    def unfit(self, how: Launch, train_command: str) -> str:
        """Why how (the job's start) is not the one this interpreter was started with ("" when it is:
        the same sandbox, bounds, GPU and environment, but for the per-job variables)."""
        if how.legacy_seal or how.wrap is None:
            return "the job is sealed by a key of its own" if how.legacy_seal else "the job is not sandboxed"
        if not same_bounds(how.bounds, self.how.bounds):
            return f"other bounds ({how.bounds} against {self.how.bounds})"
        if (how.on_gpu, how.testing) != (self.how.on_gpu, self.how.testing):
            return "another GPU use or test split"
        mine, theirs = _shared_env(self.how.environ()), _shared_env(how.environ())
        if mine != theirs:
            keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            return f"another environment ({', '.join(keys[:8])})"
        if _view(how, shlex.split(train_command)) != self.view:
            return "another sandbox view or program"
        return ""

    def hand_over(self, how: Launch, train_command: str, log_path: Path) -> Started | None:
        """Give the job to the interpreter: its log becomes log_path, it gets the job's own
        variables and argv and runs the script; None (discarded) when it is gone."""
        if self.proc.poll() is not None:
            self.why = f"it exited ({self.proc.returncode}) before the job came: {self.last_words()}"
            self.discard()
            return None
        self.used = True
        env = how.environ()
        message = {"env": {k: env[k] for k in PER_JOB_ENV if k in env},
                   "unset": [k for k in PER_JOB_ENV if k not in env], "argv": shlex.split(train_command)[1:]}
        cpu_before = self.group.cpu_seconds() if self.group is not None else None
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.log, log_path)  # the open file moves with it: what it printed so far stays on top
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.close()
        except OSError as e:  # it died meanwhile (a broken pipe), or the log could not move
            self.why = f"the handover failed: {e}"
            self.discard()
            return None
        return Started(self.proc, self.group, cpu_before)

    def last_words(self) -> str:
        try:
            return " ".join(self.log.read_text(errors="replace").split()[-40:]) or "nothing printed"
        except OSError:
            return "no output"

    def discard(self) -> None:
        """Stop it, unused: its processes, its cgroup and its folders go."""
        self.used = True
        kill_group(self.proc)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self.group is not None:
            self.group.remove()
        shutil.rmtree(self.space.root, ignore_errors=True)
        self.log.unlink(missing_ok=True)


def start(cfg: RunConfig, worktree: Path, space, base: str, gpu: str | None, job_env: dict[str, str],
          protected_sha256: dict[str, str], cancel=None) -> Warm | None:
    """An interpreter for the next job of cfg's run in worktree (reset to a commit and cleaned), with
    its folders space (evaluation.Space); None when such a job cannot have one (not `python SCRIPT`,
    not sandboxed, a sealed legacy workload, warm_start off) or its start failed. cancel (the
    executor's close) stops the training split's export or the setup it may have to wait for."""
    parts, choice = command(cfg), sandbox.resolve(cfg.sandbox)
    if parts is None or not choice.on:
        return None
    how = launch(cfg, worktree, space, base, choice, 0, space.root / "result.json", cancel, gpu,
                 {k: v for k, v in job_env.items() if k not in PER_JOB_ENV}, protected_sha256)
    if isinstance(how, TrainResult) or how.legacy_seal or how.wrap is None:
        return None
    python, script = parts
    try:
        shown = _view(how, [python, *script])
        argv = how.wrap([python, "-c", LAUNCHER, ",".join(modules(worktree))])
    except (OSError, ValueError, view.ViewError):  # the interpreter cannot be shown: a cold start says why
        return None
    group = limits.Cgroup.make(how.bounds)
    log = space.root / "warm.log"
    try:
        with open(log, "wb") as out:
            proc = supervise.spawn(f"warm {Path(worktree).name}", limits.prefix(how.bounds, group) + argv,
                                   cwd=worktree, env=how.environ(), stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.PIPE)
    except OSError:
        if group is not None:
            group.remove()
        return None
    return Warm(Path(worktree), space, log, proc, group, how, shown)
