"""The worker's side of the Ray executor: one job, in a private folder, under the local guarantees.

`run_job` is the body of the Ray task (a streaming generator). It unpacks the commit's files
(the `git archive` the driver put in the object store) into `<work root>/<token>/tree`, makes
that folder a git repository of the baseline's protected files (a second archive) and the
candidate on top (so the protected-file check has a committed version to compare with, and the
evaluation runs from the baseline's files, checked against the hashes in the spec), runs the
node's `setup_command` once, then trains with `local.train_once` under a supervisor of its own:
protected files, the seal channel, the process group, the hard deadline, stall detection and
the budget's verdict (by the allowance in the spec: the supervisor's) are the local executor's. The environment is the worker's own
(secrets filtered by runner.training_env); nothing of the supervisor's environment travels.

It yields ("started", info), ("log", bytes)... as the log grows, then ("result", TrainResult,
events) or ("unusable", reason) when the node's setup failed. Any exit (a cancel included)
kills the job's process group and removes the folder.
"""
from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shlex
import shutil
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Generator, Iterator

from ..lifecycle import faults, supervise
from ..ledger.events import NAME as EVENTS
from ..config import RunConfig
from ..gitgate import run_git
from ..workload.runner import TrainResult, training_env
from .base import join_bounded
from .local import train_once

WORK_VAR = "HARNESS_RAY_WORK_DIR"  # where jobs unpack on a node; default <tmp>/harness-ray
STREAM_S = 0.5  # s between log chunks sent back
CHUNK_BYTES = 1 << 20
GIT_TIMEOUT_S = 60
JOIN_S = 30.0  # s the job's thread has to end after a cancel (it kills the job's process group first)


def work_root() -> Path:
    return Path(os.environ.get(WORK_VAR) or Path(tempfile.gettempdir()) / "harness-ray")


def job_dir(token: str) -> Path:
    return work_root() / "jobs" / token


def node_name() -> str:
    import ray
    return f"{socket.gethostname()}/{ray.get_runtime_context().get_node_id()[:8]}"


IDENT = ["-c", "user.name=harness", "-c", "user.email=harness@localhost", "-c", "commit.gpgsign=false"]


def _extract(archive: bytes, tree: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
        for member in tar.getmembers():
            if member.isfile():
                files[member.name] = tar.extractfile(member).read()
    return files


def _commit(tree: Path, message: str) -> str:
    for args in (["add", "-A"], [*IDENT, "commit", "-q", "--allow-empty", "-m", message]):
        run_git(args, tree, timeout=GIT_TIMEOUT_S)
    return run_git(["rev-parse", "HEAD"], tree, timeout=GIT_TIMEOUT_S).stdout.strip()


def unpack(archive: bytes, tree: Path, baseline: bytes | None = None) -> tuple[dict[str, bytes], str]:
    """The archive's files under tree, committed; returns them by path (the pristine copies) and
    the local commit of the baseline's protected files ("" without baseline), committed first, so
    the evaluation runs from the baseline's files as it does locally, not from the candidate's."""
    tree.mkdir(parents=True, exist_ok=True)
    run_git(["init", "-q"], tree, timeout=GIT_TIMEOUT_S)
    base = ""
    if baseline is not None:
        _extract(baseline, tree)
        base = _commit(tree, "baseline")
    files = _extract(archive, tree)
    _commit(tree, "candidate")
    return files, base


def setup_once(command: str, tree: Path, timeout_s: float, run: str) -> str | None:
    """Run the run's setup command once on this node (across its workers); the reason it failed, or None."""
    key = hashlib.sha256(f"{run}\0{command}".encode()).hexdigest()[:16]
    root = work_root() / "setup"
    root.mkdir(parents=True, exist_ok=True)
    marker = root / f"{key}.json"
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second job on this node waits for the first one's setup
        if marker.exists():
            return json.loads(marker.read_text()).get("reason")
        log = root / f"{key}.log"
        env = training_env(dict(os.environ), {})
        try:
            with open(log, "wb") as out:
                proc = subprocess.run(shlex.split(command), cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, timeout=timeout_s)
            reason = None if proc.returncode == 0 else f"exit code {proc.returncode}"
        except (OSError, subprocess.TimeoutExpired) as e:
            reason = str(e)
        if reason:
            tail = log.read_bytes()[-600:].decode(errors="replace").strip() if log.exists() else ""
            reason = f"setup_command {command!r} failed on {socket.gethostname()}: {reason}" + (
                f"; its output ended: {tail}" if tail else "")
        marker.write_text(json.dumps({"command": command, "reason": reason}))
        return reason


def _changed(tree: Path, pristine: dict[str, bytes], protected: tuple[str, ...]) -> list[str]:
    out = []
    for path in protected:
        target = tree / path
        have = None if not target.is_file() or target.is_symlink() else target.read_bytes()
        if have != pristine.get(path):
            out.append(path)
    return out


def run_job(archive: Any, baseline: Any, cfg: RunConfig, spec: dict[str, Any]) -> Iterator[tuple]:
    """One training job on this node; see the module's docstring for what it yields."""
    import ray
    folder = job_dir(spec["token"])
    ctx = ray.get_runtime_context()
    yield ("started", {"node": node_name(), "node_id": ctx.get_node_id(), "task_id": ctx.get_task_id(),
                       "pid": os.getpid(), "folder": str(folder)})
    faults.ray_fail(spec.get("fault"))  # the fault suite's Ray errors (faults.RAY_ENV)
    archive, baseline = (ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in (archive, baseline))
    try:
        tree = folder / "tree"
        pristine, base = unpack(archive, tree, baseline)
        if cfg.setup_command:
            reason = setup_once(cfg.setup_command, tree, cfg.setup_timeout, str(cfg.run_dir))
            if reason:
                yield ("unusable", reason)
                return
        wcfg = replace(cfg, run_root=folder / "run", repo=tree)
        log = folder / "run" / "job.log"
        trusted = {"baseline": base, "protected_sha256": spec.get("protected_sha256") or {},
                   "allowance_s": spec.get("allowance_s"), "baseline_cpu_s": spec.get("baseline_cpu_s"),
                   "baseline_gpu_s": spec.get("baseline_gpu_s")}  # the supervisor's figures, as a local job gets them
        result = yield from _train(wcfg, tree, log, spec, trusted)
        changed = _changed(tree, pristine, cfg.protected)
        if changed and result.status != "invalid":
            result = replace(result, status="invalid",
                             reason=f"the training job changed protected file(s) {', '.join(changed)}")
        events = wcfg.run_dir / EVENTS
        lines = events.read_text().splitlines() if events.exists() else []
        yield ("result", replace(result, node=node_name()), lines)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _train(cfg: RunConfig, tree: Path, log: Path, spec: dict[str, Any],
           trusted: dict[str, Any]) -> Generator[tuple, None, TrainResult]:
    """train_once in a thread under this job's own supervisor; the log's new bytes as they come."""
    log.parent.mkdir(parents=True, exist_ok=True)
    cancel = threading.Event()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = train_once(cfg, tree, log, spec["seed"], None, cancel, spec.get("iteration"),
                                       spec.get("commit"), trusted)
        except BaseException as e:  # noqa: BLE001 - handed back to the generator
            box["error"] = e

    sent = 0
    with supervise.active(cfg.run_dir):
        thread = threading.Thread(target=work, name="harness-job", daemon=True)
        thread.start()
        try:
            while True:
                thread.join(STREAM_S)
                done = not thread.is_alive()
                chunk = _read_from(log, sent)
                while chunk:
                    sent += len(chunk)
                    yield ("log", chunk)
                    chunk = _read_from(log, sent)
                if done:
                    break
        finally:  # a cancel (KeyboardInterrupt in this thread) or the driver gone: the job is killed
            cancel.set()
            join_bounded([thread], JOIN_S, cfg.run_dir, "training")  # one that hangs is reported and left
    if "error" in box:
        raise box["error"]
    return box["result"]


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(CHUNK_BYTES)
    except OSError:
        return b""


def reap(tokens: list[str]) -> list[str]:
    """On a node: stop every process that the jobs with these tokens left behind; remove their folders."""
    stopped = []
    for token in tokens:
        folder = job_dir(token)
        run_dir = folder / "run"
        if run_dir.exists():
            stopped += supervise.reap(run_dir)
        shutil.rmtree(folder, ignore_errors=True)
    return stopped


def node_probe() -> str:
    """A cheap task: the node's name (tests and the executor's start-up check)."""
    time.sleep(0)
    return node_name()
