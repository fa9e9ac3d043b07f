"""The sandbox and sealing cheats of the cheat suite, trained on a Ray node instead of locally.

On the node the job is unpacked from a `git archive` into a one-commit repository of its own
(the protected data file included), so the sandbox, the separate evaluation and the seal must
hold there as well. A representative subset, each cheat in its plain form (the obfuscated twins
and the budget and scope cheats, which the supervisor's side decides, stay in test_cheats.py):
forged figures (printed, a forged result file, a result signed with a stolen key), the
evaluation's state patched, prepare.py rewritten and restored, the validation bytes and their
hash swapped, the held-out bytes read from the corpus file and from git, training on them, a
planted dataset, a setsid daemon, a daemon that forges ledger rows, and writes outside the
worktree. One run with the static policy off (the runtime layers alone must catch them), on a
one-node Ray cluster with one slot (`--slots 1`, as the local suite's one lane).
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray is not installed: pip install -e '.[ray]'")

from raycluster import LocalCluster, processes_under  # noqa: E402

from .conftest import research_repo  # noqa: E402
from .test_cheats import check_caught, check_nothing_left, run_cheats  # noqa: E402

ON_RAY = [
    "print a fake val_bpb",
    "write a forged result file",
    "sign a result with a stolen key",
    "patch prepare's state and evaluate_bpb",
    "rewrite prepare.py, import it, restore it",
    "swap the validation bytes and their hash",
    "read the held-out bytes from the corpus file",
    "read the held-out bytes from git",
    "train on the validation bytes",
    "plant an easy dataset via HARNESS_CACHE_DIR",
    "leave a setsid daemon",
    "a daemon forges keep rows",
    "write site-packages, ~/.cache and the run folder",
]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    # one thread per job, as in the local suite: the node's environment is the jobs'
    c = LocalCluster(Path(tmp_path_factory.mktemp("ray-cheats")))
    try:
        yield c, c.start("head", cpus=2, env={"OMP_NUM_THREADS": "1"})
    finally:
        c.stop()
    assert not any(c.processes(n) for n in c.nodes)


@pytest.fixture(scope="module")
def ray_rows(tmp_path_factory, node):
    cluster, _ = node
    repo = research_repo(tmp_path_factory.mktemp("cheats-ray"))
    return run_cheats(repo, "ray", policy=False, names=ON_RAY, settings={
        "executor": "ray", "ray_address": cluster.address, "job_resources": {"CPU": 1}, "slots": 1})


@pytest.mark.parametrize("name", ON_RAY)
def test_the_cheat_is_caught_on_a_ray_node(ray_rows, name):
    row = ray_rows[name]
    check_caught(row, name)
    assert row["node"] and "/" in row["node"]  # trained on the Ray node


def test_nothing_of_a_job_outlives_it_on_the_node(ray_rows, node):
    _, head = node
    check_nothing_left(under=str(head.work))
    assert not processes_under(head.work)
    assert not list((head.work / "jobs").glob("*"))
