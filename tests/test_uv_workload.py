"""A repo with karpathy/autoresearch's layout (pyproject.toml + uv.lock, prepare.py, program.md, the
output block) through `harness init`, `harness check` and a night under the sandbox with the real uv:
`uv run train.py` runs in the run's own environment, built once, shown to the job read-only."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import ledger
from harness.cli import main
from harness.executors import sandbox, uvenv

from conftest import git

UV = shutil.which("uv") or shutil.which("uv", path=sysconfig.get_path("scripts"))
pytestmark = [pytest.mark.skipif(UV is None, reason="uv is not installed (pip install uv; scripts/test.sh does)"),
              pytest.mark.skipif(not sandbox.probe(sandbox.bwrap_path()).works,
                                 reason="bubblewrap does not work on this machine (apt install bubblewrap)")]

PYPROJECT = """[project]
name = "autoresearch"
version = "0.1.0"
description = "a CPU stand-in with the upstream layout"
requires-python = ">=3.10"
dependencies = []
"""
PREPARE = '''"""Fixed constants, the data and the evaluation (read-only for the researcher)."""
import os
MAX_SEQ_LEN = 2048
TIME_BUDGET = 300
CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "autoresearch")  # upstream keeps its data here
TOKENIZER = os.path.join(CACHE_DIR, "tokenizer", "vocab.txt")


def vocab_size():
    with open(TOKENIZER) as f:
        return len(f.read().split())


if __name__ == "__main__":  # `uv run prepare.py`, once, before any training
    os.makedirs(os.path.dirname(TOKENIZER), exist_ok=True)
    with open(TOKENIZER, "w") as f:
        f.write(" ".join(str(i) for i in range(256)))
'''
TRAIN = '''import os, sys
from prepare import TIME_BUDGET, vocab_size
assert vocab_size() == 256  # the data prepare.py cached in the home, read through the sandbox
assert os.environ["HF_HUB_OFFLINE"] == "1"  # no network: a hub download (upstream's kernels) reads its cache
DEPTH = 8
MATRIX_LR = 0.04
WARMUP_RATIO = 0.0
val_bpb = 1.0 + abs(MATRIX_LR - 0.03) * 5 + abs(DEPTH - 10) * 0.01 + WARMUP_RATIO * 0.1
# the job runs in the run's uv environment, never the user's .venv nor the harness's interpreter
assert sys.prefix == os.environ["UV_PROJECT_ENVIRONMENT"], (sys.prefix, os.environ.get("UV_PROJECT_ENVIRONMENT"))
print("---")
print(f"val_bpb:          {val_bpb:.6f}")
print("training_seconds: 1.0")
print("peak_vram_mb:     0.0")
print("num_steps:        1")
'''
PROGRAM = """# autoresearch

LOOP FOREVER: edit train.py, `uv run train.py > run.log 2>&1`, read val_bpb, then git commit or git reset,
and log to results.tsv.
"""


def uv_path() -> str:
    return f"{Path(UV).parent}:{os.environ['PATH']}"


@pytest.fixture
def karpathy_repo(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", uv_path())
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the data prepare.py caches goes to a home of the test's
    repo = tmp_path / "autoresearch"
    repo.mkdir()
    for name, text in (("pyproject.toml", PYPROJECT), ("prepare.py", PREPARE), ("train.py", TRAIN),
                       ("program.md", PROGRAM), (".python-version", "3.11\n")):
        (repo / name).write_text(text)
    subprocess.run([sys.executable, "prepare.py"], cwd=repo, check=True, timeout=60)
    subprocess.run([UV, "lock", "--offline"], cwd=repo, check=True, capture_output=True, timeout=120,
                   env={**os.environ, "UV_PYTHON": sys.executable, "UV_PYTHON_DOWNLOADS": "never"})
    git(repo, "init", "-q", "-b", "master")
    git(repo, "config", "user.name", "Test User")
    git(repo, "config", "user.email", "test@example.com")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "upstream")
    return repo


def harness(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_init_check_and_a_night_with_uv_under_the_sandbox(karpathy_repo, monkeypatch):
    monkeypatch.setenv("UV_PYTHON", sys.executable)  # the stand-in needs no download of a Python
    init = harness("init", "--repo", karpathy_repo)
    assert init.exit_code == 0, init.output
    settings = (karpathy_repo / "pyproject.toml").read_text()
    assert 'train_command = "uv run train.py"' in settings
    assert 'data_paths = ["~/.cache/autoresearch"]' in settings  # where prepare.py cached its data
    git(karpathy_repo, "add", "-A")
    git(karpathy_repo, "commit", "-qm", "harness settings")
    check = harness("check", "--repo", karpathy_repo, "--agent", "mutate", "--sandbox", "bwrap")
    assert check.exit_code == 0, check.output
    assert "val_bpb" in check.output and "1.070000" in check.output
    run = harness("run", "--repo", karpathy_repo, "--tag", "night", "--agent", "mutate", "--iterations", 3,
                  "--baseline-runs", 1, "--sandbox", "bwrap")
    assert run.exit_code == 0, run.output
    rows = ledger.read_rows(karpathy_repo / "runs" / "night" / "results.tsv")
    assert [r["status"] for r in rows][0] == "keep" and len(rows) == 4
    assert rows[0]["metric"] == pytest.approx(1.07)
    assert all(r["status"] in ("keep", "discard") for r in rows[1:]), [(r["status"], r["description"]) for r in rows]
    envs = list((karpathy_repo / "runs" / "night" / "uv").glob("*/venv"))
    assert len(envs) == 1  # built once for the night, outside the worktree
    assert not (karpathy_repo / "runs" / "night" / "worktree" / ".venv").exists()
    assert json.loads((karpathy_repo / "runs" / "night" / "run.json").read_text())["sandbox_caps"]["CapEff"] == "0" * 16


def test_a_job_that_cannot_see_its_data_is_told_to_set_data_paths(karpathy_repo, monkeypatch):
    monkeypatch.setenv("UV_PYTHON", sys.executable)
    harness("init", "--repo", karpathy_repo)
    pyproject = karpathy_repo / "pyproject.toml"
    pyproject.write_text("\n".join(line for line in pyproject.read_text().splitlines()
                                   if not line.startswith("data_paths")) + "\n")
    git(karpathy_repo, "add", "-A")
    git(karpathy_repo, "commit", "-qm", "harness settings, without the data")
    check = harness("check", "--repo", karpathy_repo, "--agent", "mutate", "--sandbox", "bwrap")
    assert check.exit_code != 0
    folder = Path(os.environ["HOME"]) / ".cache" / "autoresearch" / "tokenizer"
    assert f"the job cannot see {folder / 'vocab.txt'}" in check.output, check.output
    assert f'data_paths = ["{folder}"]' in check.output


def test_init_shows_the_hub_cache_to_a_train_py_that_loads_kernels_from_the_hub(karpathy_repo):
    train = karpathy_repo / "train.py"
    train.write_text("from kernels import get_kernel\n" + train.read_text())  # upstream's attention kernel
    assert harness("init", "--repo", karpathy_repo).exit_code == 0
    settings = (karpathy_repo / "pyproject.toml").read_text()
    assert 'data_paths = ["~/.cache/autoresearch", "~/.cache/huggingface"]' in settings, settings


def test_without_uv_the_check_names_the_install_command(karpathy_repo, monkeypatch, tmp_path):
    harness("init", "--repo", karpathy_repo)
    git(karpathy_repo, "add", "-A")
    git(karpathy_repo, "commit", "-qm", "harness settings")
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("git", "python3", "ps", "bwrap"):
        found = shutil.which(tool)
        if found:
            (bare / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bare))
    sandbox.reset_cache()
    try:
        check = harness("check", "--repo", karpathy_repo, "--agent", "mutate", "--sandbox", "bwrap")
    finally:
        sandbox.reset_cache()
    assert check.exit_code != 0
    assert "pip install uv" in check.output, check.output


def test_only_uv_run_commands_get_the_environment():
    assert uvenv.is_uv("uv run train.py") and uvenv.is_uv("env OMP_NUM_THREADS=1 uv run --frozen train.py")
    assert not uvenv.is_uv("python train.py") and not uvenv.is_uv("uvx ruff") and not uvenv.is_uv("uv pip list")
