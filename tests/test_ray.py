"""The Ray executor on a real local Ray cluster: `harness run --executor ray` as a user runs it.

The fixture starts one real Ray head node (tests/raycluster.py: `ray start --head --block`,
2 CPUs, no dashboard, no usage statistics) in a private temp dir and stops it, and everything it
started, afterwards. Jobs ask for {"CPU": 1}: two slots. tests/test_ray_nodes.py has two nodes.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

ray = pytest.importorskip("ray", reason="ray is not installed: pip install -e '.[ray]'")

from harness import ledger  # noqa: E402
from harness.lifecycle import supervise
from harness.cli import main  # noqa: E402

from conftest import ROOT, git, make_repo, set_globals, FAKE_TRAIN  # noqa: E402
from raycluster import (LocalCluster, free_port, kill_driver_and_workers, processes_under, trained_rows,  # noqa: E402
                        wait_for)

CPU_JOB = '{"CPU": 1}'


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(Path(tmp_path_factory.mktemp("ray")))
    try:
        t0 = time.monotonic()
        head = c.start("head", cpus=2)
        yield {"address": c.address, "start_s": time.monotonic() - t0, "work": head.work}
    finally:
        c.stop()
    assert not any(c.processes(n) for n in c.nodes)


def harness(*args: str, expect: int = 0):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == expect, result.output
    return result


def ray_run(repo: Path, cluster, tag: str, *extra: str, expect: int = 0):
    return harness("run", "--repo", str(repo), "--tag", tag, "--executor", "ray", "--ray-address",
                   cluster["address"], "--job-resources", CPU_JOB, "--agent", "mutate",
                   "--baseline-runs", "1", *extra, expect=expect)


def test_run_on_the_cluster(tmp_path: Path, cluster):
    repo = make_repo(tmp_path / "research")
    ray_run(repo, cluster, "night", "--iterations", "3")
    run_dir = repo / "runs" / "night"
    rows = ledger.read_rows(run_dir / "results.tsv")
    assert len(rows) == 4 and rows[0]["description"] == "baseline"
    header = (run_dir / "results.tsv").read_text().split("\n", 1)[0].split("\t")
    assert "node" in header
    host = socket.gethostname()
    trained = trained_rows(rows)
    assert trained[0] is rows[0] and len(trained) >= 2, rows
    assert all(r["node"] and r["node"].startswith(host + "/") and r["train_s"] is not None for r in trained)
    assert all(not r["node"] for r in rows if r not in trained)
    for r in trained:  # each log streamed back into the run's logs/ as in a local run
        log = run_dir / r["log"]
        assert log.parent == run_dir / "logs" and "fake training" in log.read_text()
    best = ledger.best_row(rows)
    assert git(repo, "rev-parse", "autoresearch/night").startswith(best["commit"])
    assert not list((run_dir / "ray-tasks").glob("*.json"))  # no task left recorded
    assert not list((cluster["work"] / "jobs").glob("*"))  # every job's folder removed on the worker


def test_killed_worker_is_retried_once(tmp_path: Path, cluster):
    flag = tmp_path / "hold"  # every job trains while it exists (120 s at most): the first is killed mid-job
    flag.touch()
    hold = (f"import os as _os, time as _time\n_held = _time.monotonic()\n"
            f"while _os.path.exists({str(flag)!r}) and _time.monotonic() - _held < 120:\n    _time.sleep(0.05)\n")
    repo = make_repo(tmp_path / "research", hold + FAKE_TRAIN)
    tasks = repo / "runs" / "kill" / "ray-tasks"
    killed: list[int] = []

    def kill_first_job():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            pid = task_pid(tasks)
            if pid and processes_under(cluster["work"], running="train.py"):  # mid-job: its trainer holds
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                flag.unlink()  # the retry and what follows train at once
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_first_job, daemon=True)
    killer.start()
    ray_run(repo, cluster, "kill", "--iterations", "1")
    killer.join(5)
    assert killed, "the worker's pid never appeared under ray-tasks/"
    run_dir = repo / "runs" / "kill"
    rows = ledger.read_rows(run_dir / "results.tsv")
    assert [r["status"] for r in rows][0] == "keep" and len(rows) == 2  # the baseline trained on the retry
    events = [json.loads(line) for line in (run_dir / "events.log").read_text().splitlines()]
    infra = [e for e in events if e["kind"] == "infrastructure"]
    assert len(infra) == 1 and "retrying" in infra[0]["message"]
    # The killed worker's training process was stopped on the node, not left running.
    assert not list((cluster["work"] / "jobs").glob("*"))
    assert not processes_under(cluster["work"])


def test_unreachable_cluster_is_a_clear_error(tmp_path: Path):
    repo = make_repo(tmp_path / "research")
    address = f"127.0.0.1:{free_port()}"
    result = harness("run", "--repo", str(repo), "--tag", "x", "--executor", "ray", "--ray-address", address,
                     "--job-resources", CPU_JOB, "--agent", "mutate", "--iterations", "1", expect=1)
    assert address in result.output and "cannot be reached" in result.output
    assert not (repo / "runs" / "x" / "results.tsv").exists()


def test_bad_job_resources_is_a_clear_error(tmp_path: Path):
    repo = make_repo(tmp_path / "research")
    result = harness("run", "--repo", str(repo), "--tag", "x", "--executor", "ray", "--job-resources", "GPU=1",
                     "--agent", "mutate", "--iterations", "1", expect=1)
    assert "--job-resources" in result.output and '{"GPU": 1}' in result.output


SETUP = '''import sys
EVAL_BYTES = 1000
if __name__ == "__main__":  # the node's set-up: count the runs, fail when asked
    open(sys.argv[1], "a").write("x")
    if sys.argv[2:] == ["fail"]:
        print("the data download failed (simulated)")
        sys.exit(3)
'''


def setup_repo(path: Path, count: Path, fail: bool = False) -> Path:
    extra = f'setup_command = "{sys.executable} prepare.py {count}{" fail" if fail else ""}"\n'
    repo = make_repo(path, extra=extra)
    (repo / "prepare.py").write_text(SETUP)
    git(repo, "commit", "-qam", "prepare.py sets the node up")
    return repo


def test_setup_command_runs_once_per_node(tmp_path: Path, cluster):
    count = tmp_path / "setups"
    repo = setup_repo(tmp_path / "research", count)
    ray_run(repo, cluster, "setup", "--iterations", "2")
    rows = ledger.read_rows(repo / "runs" / "setup" / "results.tsv")
    assert len(rows) == 3 and rows[0]["status"] == "keep"
    assert count.read_text() == "x"  # one node: set up once for three jobs


def test_failed_setup_marks_the_node_not_the_candidate(tmp_path: Path, cluster):
    count = tmp_path / "setups"
    repo = setup_repo(tmp_path / "research", count, fail=True)
    result = ray_run(repo, cluster, "nosetup", "--iterations", "1", expect=1)
    out = " ".join(result.output.split())
    assert "infrastructure: setup_command" in out and "exit code 3" in out and "download failed" in out, out
    assert "no usable node" in out  # the retry did not run the set-up again on that node
    assert count.read_text() == "x"


def task_pid(tasks: Path) -> int | None:
    for path in tasks.glob("*.json") if tasks.exists() else []:
        try:
            pid = json.loads(path.read_text()).get("pid")
        except ValueError:
            continue
        if pid:
            return pid
    return None


def test_cancel_stops_the_running_task(tmp_path: Path, cluster):
    from harness.config import load as config
    from harness.executors import Job, make_executor
    repo = make_repo(tmp_path / "research", set_globals(FAKE_TRAIN, MODE="hang"))
    cfg = config.resolve(repo, "cancel", {"executor": "ray", "ray_address": cluster["address"],
                                          "job_resources": CPU_JOB})
    executor = make_executor(cfg, repo, cfg.run_dir)
    try:
        assert executor.slots() == 2  # 2 CPUs, {"CPU": 1} a job
        job = Job(cfg, git(repo, "rev-parse", "HEAD"), 1, cfg.logs_dir / "hang.log")
        future = executor.submit(job)
        wait_for(lambda: job.log_path.exists() and "fake training" in job.log_path.read_text())  # streamed
        assert processes_under(cluster["work"])
        future.cancel()
        with pytest.raises(KeyboardInterrupt):
            future.result(timeout=90)
        wait_for(lambda: not processes_under(cluster["work"]), timeout_s=30)
        assert not list((cfg.run_dir / "ray-tasks").glob("*.json"))
    finally:
        executor.close()


def test_killed_supervisor_leaves_no_task_after_resume(tmp_path: Path, cluster):
    flag = tmp_path / "hold"  # while it exists, the job waits: a job that is mid-way when the supervisor dies
    source = f"import os as _os, time as _time\nwhile _os.path.exists({str(flag)!r}):\n    _time.sleep(0.1)\n"
    repo = make_repo(tmp_path / "research", source + FAKE_TRAIN)
    flag.touch()
    argv = [sys.executable, "-m", "harness", "run", "--repo", str(repo), "--tag", "r", "--executor", "ray",
            "--ray-address", cluster["address"], "--job-resources", CPU_JOB, "--agent", "mutate",
            "--baseline-runs", "1", "--iterations", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    run_dir = repo / "runs" / "r"
    worker = wait_for(lambda: task_pid(run_dir / "ray-tasks"))
    orphans = wait_for(lambda: processes_under(cluster["work"], running="train.py"))  # held, not unpacking
    kill_driver_and_workers(first, [worker])
    time.sleep(1.0)
    assert all(supervise.alive(p) for p in orphans)  # the job outlived its supervisor
    assert list((run_dir / "ray-tasks").glob("*.json"))  # and its task is on record
    second = subprocess.Popen([*argv, "--resume"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
    try:
        events = run_dir / "events.log"
        wait_for(lambda: events.exists() and "ray_tasks_cancelled" in events.read_text())
        assert not any(supervise.alive(p) for p in orphans)  # stopped on the node before anything trained
        flag.unlink()
        _, err = second.communicate(timeout=120)
        assert second.returncode == 0, err.decode()
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    rows = ledger.read_rows(run_dir / "results.tsv")
    assert sorted(r["iteration"] for r in rows) == [0, 1, 2]  # every experiment once (two lanes: any order)
    assert not list((run_dir / "ray-tasks").glob("*.json"))


def test_a_job_lost_twice_is_an_infrastructure_crash(tmp_path: Path, cluster):
    from harness.lifecycle import health
    flag = tmp_path / "hold"  # iteration 1's jobs train while it exists (120 s at most): killed mid-job
    flag.touch()
    hold = (f"import os as _os, time as _time\n_held = _time.monotonic()\n"
            f"while _os.environ.get('HARNESS_ITERATION') == '1' and _os.path.exists({str(flag)!r})"
            f" and _time.monotonic() - _held < 120:\n    _time.sleep(0.05)\n")
    repo = make_repo(tmp_path / "research", hold + FAKE_TRAIN)
    tasks = repo / "runs" / "lost" / "ray-tasks"
    killed: list[str] = []

    def kill_iteration_one():  # both attempts of iteration 1's job: its worker SIGKILLed mid-job
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and len(killed) < 2:
            for path in tasks.glob("*.json") if tasks.exists() else []:
                try:
                    record = json.loads(path.read_text())
                except ValueError:
                    continue
                if record.get("job") == "iter-0001" and record.get("pid") and record["token"] not in killed \
                        and processes_under(cluster["work"], running="train.py"):  # its trainer holds
                    os.kill(record["pid"], signal.SIGKILL)
                    killed.append(record["token"])
            time.sleep(0.05)
        flag.unlink()

    killer = threading.Thread(target=kill_iteration_one, daemon=True)
    killer.start()
    ray_run(repo, cluster, "lost", "--iterations", "2")
    killer.join(5)
    assert len(killed) == 2
    rows = ledger.read_rows(repo / "runs" / "lost" / "results.tsv")
    by_iter = {r["iteration"]: r for r in rows}
    lost = by_iter[1]
    assert lost["status"] == "crash" and "[infrastructure: WorkerCrashedError" in lost["description"]
    assert "; then WorkerCrashedError" in lost["description"]  # retried once, then recorded
    assert by_iter[2]["status"] in ("keep", "discard")  # the night went on
    assert lost not in health.candidates(rows)  # not held against the researcher
