"""The Ray executor on a real two-node Ray cluster on this machine (tests/raycluster.py).

Two nodes, one fake GPU each (`ray start --num-gpus 1`), jobs with the default
`--job-resources` ({"GPU": 1}): two slots, one per node. A third node joins during one night
and is lost (every process of it SIGKILLed, as a machine is lost) while it trains a job. The
trainer is the sleep trainer (tests/fake_train.py) with a prelude that holds or records each job:
its start and end times, its node (the work folder it ran in) and its CUDA_VISIBLE_DEVICES.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

ray = pytest.importorskip("ray", reason="ray is not installed: pip install -e '.[ray]'")

from harness import ledger  # noqa: E402
from harness.lifecycle import supervise
from harness.cli import main  # noqa: E402

from conftest import ROOT, FAKE_TRAIN, git, make_repo  # noqa: E402
from raycluster import LocalCluster, kill_driver_and_workers, processes_under, trained_rows, wait_for  # noqa: E402

RUN_TIMEOUT_S = int(os.environ.get("RAY_TEST_TIMEOUT_S", 300))  # a whole night of sleep jobs on a loaded 2-core machine: wide


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(Path(tmp_path_factory.mktemp("ray2")))
    try:
        c.start("head", cpus=1, gpus=1)
        c.start("b", cpus=1, gpus=1)
        yield c
    finally:
        c.stop()
    assert not any(c.processes(n) for n in c.nodes)


def trainer(jobs: Path, hold_s: float = 0.0, flag: Path | None = None) -> str:
    """The sleep trainer, holding each job hold_s seconds (or while flag exists, the baseline
    excepted, marking itself held) and appending `start end cwd CUDA_VISIBLE_DEVICES iteration`
    to jobs at its end."""
    prelude = (
        "import atexit as _ax, os as _os, time as _time\n"
        "_t0 = _time.time()\n"
        f"_ax.register(lambda: open({str(jobs)!r}, 'a').write(' '.join(map(str, (_t0, _time.time(), _os.getcwd(), "
        "_os.environ.get('CUDA_VISIBLE_DEVICES'), _os.environ.get('HARNESS_ITERATION')))) + '\\n'))\n"
        f"_time.sleep({hold_s!r})\n")
    if flag is not None:  # a held job marks itself held: <flag>.<iteration>
        prelude += (f"while _os.path.exists({str(flag)!r}) and _os.environ.get('HARNESS_ITERATION') != '0':\n"
                    f"    open({str(flag)!r} + '.' + _os.environ['HARNESS_ITERATION'], 'a').close()\n"
                    "    _time.sleep(0.1)\n")
    return prelude + FAKE_TRAIN


def read_jobs(jobs: Path, cluster: LocalCluster) -> list[dict]:
    out = []
    for line in jobs.read_text().splitlines() if jobs.exists() else []:
        start, end, cwd, gpu, iteration = line.split(" ")
        node = next(n.name for n in cluster.nodes if cwd.startswith(str(n.work)))
        out.append({"start": float(start), "end": float(end), "node": node, "gpu": gpu, "iteration": iteration})
    return out


def overlaps(jobs: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs of jobs on the same node at the same time."""
    return [(a, b) for i, a in enumerate(jobs) for b in jobs[i + 1:]
            if a["node"] == b["node"] and a["start"] < b["end"] and b["start"] < a["end"]]


def harness(*args: str, expect: int = 0):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == expect, result.output
    return result


def argv(repo: Path, cluster: LocalCluster, tag: str, *extra: str) -> list[str]:
    return ["run", "--repo", str(repo), "--tag", tag, "--executor", "ray", "--ray-address", cluster.address,
            "--agent", "mutate", "--baseline-runs", "1", *extra]


def records(tasks: Path) -> list[dict]:
    """The running tasks' records (those whose task has started on a node)."""
    out = []
    for path in tasks.glob("*.json") if tasks.exists() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("pid"):
            out.append(record)
    return out


def events_of(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "events.log").read_text().splitlines() if (run_dir / "events.log").exists() else []
    return [e for e in map(json.loads, lines) if e["kind"] == kind]


def start_night(repo: Path, cluster: LocalCluster, tag: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness", *argv(repo, cluster, tag, *extra)],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


def finish(proc: subprocess.Popen, timeout_s: float = RUN_TIMEOUT_S) -> None:
    try:
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err.decode()


# ---------------------------------------------------------------------------


def test_a_night_on_two_nodes(tmp_path: Path, cluster):
    jobs = tmp_path / "jobs.txt"
    repo = make_repo(tmp_path / "research", trainer(jobs, hold_s=0.5))
    harness(*argv(repo, cluster, "two", "--iterations", "5"))
    run_dir = repo / "runs" / "two"
    rows = ledger.read_rows(run_dir / "results.tsv")
    assert len(rows) == 6 and rows[0]["description"] == "baseline"
    assert sorted(r["iteration"] for r in rows) == list(range(6))
    trained = trained_rows(rows)
    assert len({r["node"] for r in trained}) == 2  # the ledger names both nodes
    assert all(not r["node"] for r in rows if r not in trained)
    for r in trained:  # each log streamed back into the run's logs/
        log = run_dir / r["log"]
        assert log.parent == run_dir / "logs" and "fake training" in log.read_text()
    assert git(repo, "rev-parse", "autoresearch/two").startswith(ledger.best_row(rows)["commit"])
    ran = read_jobs(jobs, cluster)
    assert len(ran) == len(trained) and {j["node"] for j in ran} == {"head", "b"}
    assert not overlaps(ran)  # one GPU a node: a job never shares its slot
    assert {j["gpu"] for j in ran} == {"0"}  # the GPU Ray gave the task
    assert not records(run_dir / "ray-tasks")
    assert not any(processes_under(n.work) for n in cluster.nodes)


def test_slots_follow_the_cluster_unless_pinned(tmp_path: Path, cluster):
    from harness.config import load as config
    from harness.executors import make_executor
    repo = make_repo(tmp_path / "research")
    for pinned, want in ((None, 2), (1, 1), (5, 5)):
        cfg = config.resolve(repo, "slots", {"executor": "ray", "ray_address": cluster.address, "slots": pinned})
        executor = make_executor(cfg, repo, cfg.run_dir)
        try:
            assert executor.slots() == want
        finally:
            executor.close()


def test_a_node_joins_then_is_lost_mid_job(tmp_path: Path, cluster):
    """Nodes that join are used without a restart (a third lane), a lost node's job is retried once
    on another node, its lanes are dropped, and the night goes on."""
    jobs, hold = tmp_path / "jobs.txt", tmp_path / "hold"  # hold: jobs wait until the lanes were dropped
    repo = make_repo(tmp_path / "research", trainer(jobs, hold_s=2.0, flag=hold), kill_after=120)
    # 20: enough left, however far the two lanes got while c joined, for a held job on each node
    night = start_night(repo, cluster, "grow", "--iterations", "20")
    run_dir = repo / "runs" / "grow"
    try:
        wait_for(lambda: len(records(run_dir / "ray-tasks")) == 2, RUN_TIMEOUT_S)  # two lanes busy
        c = cluster.start("c", cpus=1, gpus=1)
        wait_for(lambda: events_of(run_dir, "lanes"), 60)
        wait_for(lambda: any(j["node"] == "c" for j in read_jobs(jobs, cluster)), 60)  # c trained a job
        hold.touch()  # the night goes on no further until the lost node's lanes are dropped
        # Each lane's job is held in turn: three jobs at once, one a node, however the machine's
        # load spread them before. c is lost in the middle of its held job.
        in_flight = wait_for(lambda: held_jobs(run_dir, hold), 90)
        on_c = [r for r in in_flight if r["node_id"] == c.node_id]
        cluster.kill(c)
        wait_for(lambda: any(e["message"].startswith("2 lane(s), was 3") for e in events_of(run_dir, "lanes")), 120)
        hold.unlink()
        finish(night)
    finally:
        if night.poll() is None:
            os.killpg(night.pid, signal.SIGKILL)
    lanes = [e["message"] for e in events_of(run_dir, "lanes")]
    assert lanes[0].startswith("3 lane(s), was 2") and any(m.startswith("2 lane(s), was 3") for m in lanes), lanes
    rows = ledger.read_rows(run_dir / "results.tsv")
    assert sorted(r["iteration"] for r in rows) == list(range(21))  # every experiment once
    lost = next(r for r in rows if r["log"].endswith(on_c[0]["job"] + ".log"))
    assert lost["status"] in ("keep", "discard") and lost["node"] != on_c[0]["node"]  # the retry's result
    infra = events_of(run_dir, "infrastructure")
    assert len(infra) == 1 and infra[0]["message"].startswith(on_c[0]["job"]) and "retrying" in infra[0]["message"]
    ran = read_jobs(jobs, cluster)
    assert {j["node"] for j in ran} == {"head", "b", "c"}
    assert len({r["node_id"] for r in in_flight}) == 3  # the joined node ran a job beside the other two
    assert not overlaps([j for j in ran if j["node"] != "c"])
    assert not any(processes_under(n.work) for n in cluster.nodes)


def held_jobs(run_dir: Path, hold: Path) -> list[dict]:
    """The running tasks' records, once a held job runs on each of three nodes; [] before."""
    held = [r for r in records(run_dir / "ray-tasks")
            if Path(f"{hold}.{int(r['job'].removeprefix('iter-'))}").exists()]
    return held if len({r["node_id"] for r in held}) == 3 else []


def test_ab_arms_on_the_cluster(tmp_path: Path, cluster):
    repo = make_repo(tmp_path / "research", trainer(tmp_path / "jobs.txt", hold_s=0.5))
    harness("ab", "--repo", str(repo), "--tag", "ab", "--executor", "ray", "--ray-address", cluster.address,
            "--agent", "mutate", "--baseline-runs", "1", "--iterations", "2")
    setup = json.loads((repo / "runs" / "ab" / "ab.json").read_text())
    assert setup["schedule"] == "parallel"  # side by side on the cluster's slots
    for arm in ("a", "b"):
        rows = ledger.read_rows(repo / "runs" / "ab" / arm / "results.tsv")
        assert sorted(r["iteration"] for r in rows) == [0, 1, 2]
        assert all(r["node"] and r["arm"] == arm for r in trained_rows(rows)) and all(r["arm"] == arm for r in rows)
    assert (repo / "runs" / "ab" / "report.md").exists()
    assert not records(repo / "runs" / "ab" / "ray-tasks")


def test_killed_supervisor_with_tasks_on_both_nodes(tmp_path: Path, cluster):
    flag = tmp_path / "hold"  # while it exists, every job but the baseline waits
    flag.touch()
    repo = make_repo(tmp_path / "research", trainer(tmp_path / "jobs.txt", flag=flag))
    first = start_night(repo, cluster, "r", "--iterations", "2")
    run_dir = repo / "runs" / "r"
    try:
        running = wait_for(lambda: (lambda rs: rs if len({r["node_id"] for r in rs}) == 2 else None)(
            records(run_dir / "ray-tasks")), RUN_TIMEOUT_S)
    except AssertionError as e:
        first.kill()
        raise AssertionError(f"{e}; events: {(run_dir / 'events.log').read_text() if (run_dir / 'events.log').exists() else ''}"
                             f"; tasks: {[p.read_text() for p in (run_dir / 'ray-tasks').glob('*')]}; nodes: {[(n.name, n.node_id) for n in cluster.nodes]}"
                             f"; stderr: {first.stderr.read().decode()[-3000:]}") from None
    orphans = wait_for(lambda: (lambda ps: ps if len(ps) >= 2 else None)(
        [p for n in cluster.nodes[:2] for p in processes_under(n.work / "jobs", running="train.py")]))
    kill_driver_and_workers(first, [r["pid"] for r in running])
    time.sleep(1.0)
    assert all(supervise.alive(p) for p in orphans)  # both jobs outlived their supervisor
    second = start_night(repo, cluster, "r", "--iterations", "2", "--resume")
    try:
        wait_for(lambda: events_of(run_dir, "ray_tasks_cancelled"), RUN_TIMEOUT_S)
        assert not any(supervise.alive(p) for p in orphans)  # stopped on both nodes before anything trained
        flag.unlink()
        finish(second)
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    assert "2 Ray task(s)" in events_of(run_dir, "ray_tasks_cancelled")[0]["message"]
    rows = ledger.read_rows(run_dir / "results.tsv")
    assert sorted(r["iteration"] for r in rows) == [0, 1, 2]  # every experiment once
    assert not records(run_dir / "ray-tasks")
    assert not any(processes_under(n.work) for n in cluster.nodes)
