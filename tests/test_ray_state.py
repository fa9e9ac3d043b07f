"""Ray judges as the local executor does (issue 22, item 7), on a real one-node Ray cluster.

The worker gets the run's trusted baseline in the job's spec: the start-up allowance the
supervisor measured (so a slow job is `invalid` on a worker, by the harness's clock, the budget
named) and the baseline's protected files with their hashes (so the evaluation runs from them,
not from the candidate's); a job whose baseline is not the run's is refused before it ships.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray is not installed: pip install -e '.[ray]'")

from harness.driver import loop as driver  # noqa: E402
from harness import ledger  # noqa: E402
from harness.ledger import trust  # noqa: E402
from harness.config.load import resolve  # noqa: E402
from harness.executors import Job  # noqa: E402
from harness.executors.ray_executor import RayExecutor  # noqa: E402
from harness.gitgate import GitGate  # noqa: E402

from conftest import ScriptedResearcher, git, make_repo, set_globals, small_example  # noqa: E402
from raycluster import LocalCluster  # noqa: E402

TIME_BUDGET_S = 2  # s
SLOW_S = 20.0  # s the slow job trains: ten budgets, far past budget + slack + any start-up allowance


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(Path(tmp_path_factory.mktemp("ray-state")))
    try:
        head = c.start("head", cpus=2)
        yield {"address": c.address, "work": head.work}
    finally:
        c.stop()
    assert not any(c.processes(n) for n in c.nodes)


def ray_settings(cluster, **more) -> dict:
    return {"executor": "ray", "ray_address": cluster["address"], "job_resources": {"CPU": 1}, "slots": 1,
            "time_budget": TIME_BUDGET_S, "kill_after": 120, "baseline_runs": 1, "gate": "strict",
            "health_every": 0, "pipeline": False, "sandbox": "off", **more}


def slow_and_says_fast(task):
    """A candidate that trains ten budgets and prints that it trained one second."""
    path = task.worktree / "train.py"
    source = set_globals(path.read_text(), SLEEP_S=SLOW_S, VALUE=0.5)
    path.write_text(source.replace("{SLEEP_S:.1f}", "1.0"))
    from harness.agents import Proposal
    return Proposal("train ten budgets, report one second")


def test_a_slow_job_is_refused_on_a_worker_the_budget_named(tmp_path: Path, cluster):
    repo = make_repo(tmp_path / "research", kill_after=120)
    cfg = resolve(repo, "slow", ray_settings(cluster, iterations=1))
    driver.run(cfg, researcher=ScriptedResearcher([slow_and_says_fast]))
    base, row = ledger.read_rows(cfg.ledger_path)
    assert base["status"] == "keep" and "/" in base["node"]  # the baseline, on the worker
    assert row["status"] == "invalid" and "/" in row["node"], row
    assert f"against a {TIME_BUDGET_S}s budget" in row["description"], row["description"]
    assert "by the harness's clock" in row["description"] and "start-up allowance" in row["description"]
    assert row["train_s"] >= SLOW_S  # it ran on the worker, timed there, judged by the supervisor's allowance
    assert git(repo, "rev-parse", cfg.branch) == git(repo, "rev-parse", "main")
    assert not list((cluster["work"] / "jobs").glob("*"))


def test_a_job_whose_baseline_is_not_the_runs_is_refused_before_it_ships(tmp_path: Path, cluster):
    repo = make_repo(tmp_path / "research")
    cfg = resolve(repo, "forged", ray_settings(cluster))
    base = git(repo, "rev-parse", "HEAD")
    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repo, input="EVAL_BYTES = 1\n", text=True,
                          capture_output=True, check=True, timeout=30).stdout.strip()
    env = {**os.environ, "GIT_INDEX_FILE": str(tmp_path / "forged.index")}
    subprocess.run(["git", "read-tree", "HEAD"], cwd=repo, env=env, check=True, timeout=30)
    subprocess.run(["git", "update-index", "--cacheinfo", f"100644,{blob},prepare.py"], cwd=repo, env=env,
                   check=True, timeout=30)
    tree = subprocess.run(["git", "write-tree"], cwd=repo, env=env, capture_output=True, text=True, check=True,
                          timeout=30).stdout.strip()
    forged = git(repo, "commit-tree", tree, "-p", "HEAD", "-m", "forged")
    with GitGate(repo).worktree(repo) as wt:
        hashes = trust.protected_sha256(wt.repo, base, cfg.protected)
    forged_hashes = {"prepare.py": hashlib.sha256(b"EVAL_BYTES = 1\n").hexdigest()}
    cfg.logs_dir.mkdir(parents=True)
    executor = RayExecutor(repo, cfg.run_dir, cluster["address"], {"CPU": 1}, 1)
    try:
        refused = executor.run(Job(cfg, base, 1, cfg.logs_dir / "forged.log", baseline=forged,
                                   protected_sha256=forged_hashes, allowance_s=5.0))
        assert refused.status == "invalid" and "is not an ancestor of the job's commit" in refused.reason
        assert not (cfg.logs_dir / "forged.log").exists()  # never shipped
        honest = executor.run(Job(cfg, base, 1, cfg.logs_dir / "honest.log", baseline=base,
                                  protected_sha256=hashes, allowance_s=5.0))
        assert honest.status == "ok" and "/" in honest.node, honest
    finally:
        executor.close()


EVALUATES_ITSELF = ('import json as _j, os as _o, sys as _s\n'  # a candidate's prepare.py that scores itself
                    'if "--evaluate" in _s.argv:\n'
                    '    _j.dump({"val_bpb": 0.0001}, open(_o.environ["HARNESS_RESULT_FILE"], "w"))\n'
                    '    _s.exit(0)\n')


def test_on_a_worker_the_evaluation_runs_from_the_baselines_protected_files(tmp_path: Path, cluster):
    """A job whose commit carries a prepare.py that would score it 0.0001 is scored by the
    baseline's prepare.py on the worker (shipped and checked by hash), as it is locally."""
    repo = small_example(tmp_path / "example")  # the bundled workload: a separate, sandboxed evaluation
    cfg = resolve(repo, "eval", ray_settings(cluster, time_budget=4, max_steps=3, sandbox="auto"))
    base = git(repo, "rev-parse", "HEAD")
    (repo / "prepare.py").write_text(EVALUATES_ITSELF + (repo / "prepare.py").read_text())
    git(repo, "commit", "-qam", "a prepare.py that scores itself")
    candidate = git(repo, "rev-parse", "HEAD")
    with GitGate(repo).worktree(repo) as wt:
        hashes = trust.protected_sha256(wt.repo, base, cfg.protected)
    cfg.logs_dir.mkdir(parents=True)
    executor = RayExecutor(repo, cfg.run_dir, cluster["address"], {"CPU": 1}, 1)
    try:
        result = executor.run(Job(cfg, candidate, 1, cfg.logs_dir / "job.log", baseline=base,
                                  protected_sha256=hashes, allowance_s=None))
    finally:
        executor.close()
    assert result.status == "ok" and result.sealed and "/" in result.node, result
    assert result.value("val_bpb") > 1.0  # the baseline's evaluation, not the candidate's 0.0001
