"""What the install carries: the supervisor's own needs in the core, the rest in extras that exist.

The wheel is built (hatchling, no network) and its metadata read; the supervisor is run with
torch, matplotlib, mlflow and ray made unimportable; the manifest's torch is the training
interpreter's.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, make_repo

HEAVY = ("torch", "matplotlib", "mlflow", "ray")  # never pulled by `pip install autoresearch-harness`


def requirement_name(line: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", line.strip(), maxsplit=1)[0].lower()


@pytest.fixture(scope="module")
def wheel_metadata(tmp_path_factory) -> dict[str, list[str]]:
    """Requires-Dist of the built wheel: extra name ('' = core) -> requirement names."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob("autoresearch_harness-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "harness/example/train.py" in names and "harness/track/mlflow_backend.py" in names
    found: dict[str, list[str]] = {}
    for line in meta.splitlines():
        if line.startswith("Requires-Dist:"):
            req = line.split(":", 1)[1]
            extra = re.search(r"extra\s*==\s*['\"]([\w-]+)['\"]", req)
            found.setdefault(extra.group(1) if extra else "", []).append(requirement_name(req))
    return found


def test_core_install_carries_only_what_the_supervisor_imports(wheel_metadata):
    core = wheel_metadata[""]
    assert {"openai", "gitpython", "click", "rich", "pandas"} <= set(core)  # pandas: the tabular work
    assert not set(HEAVY) & set(core), core
    assert "torch" in wheel_metadata["workload"]
    assert "matplotlib" in wheel_metadata["report"] and "mlflow" in wheel_metadata["track"]
    assert "ray" in wheel_metadata["ray"]  # --executor ray
    # The test extra installs everything the suite imports.
    assert {"pytest", "torch", "pyarrow", "matplotlib", "mlflow", "hatchling", "ray"} <= set(wheel_metadata["test"])


def shadow(tmp_path: Path) -> Path:
    """A PYTHONPATH folder whose torch, matplotlib, mlflow and ray raise on import."""
    root = tmp_path / "shadow"
    for name in HEAVY:
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed (test shadow)')\n")
    return root


def test_the_supervisor_never_imports_torch(tmp_path: Path):
    """`harness run`, `status` and `report` work where torch (and the other extras) cannot be imported."""
    repo = make_repo(tmp_path / "r")
    env = {**os.environ, "PYTHONPATH": f"{shadow(tmp_path)}{os.pathsep}{ROOT}"}
    check = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert "test shadow" in check.stderr  # the shadow works

    def harness(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "harness", *args], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done

    harness("run", "--agent", "mutate", "--iterations", "3", "--baseline-runs", "1", "--tag", "light")
    rows = (repo / "runs/light/results.tsv").read_text().splitlines()
    assert len(rows) >= 4 and "keep" in rows[1]
    assert "light" in harness("status", "light").stdout
    report = harness("report", "runs/light")
    assert (repo / "runs/light/report.html").exists()
    assert "No plots: install matplotlib" in (repo / "runs/light/report.md").read_text() + report.stdout

    # The node column is the machine's name on a local run.
    assert "node" in (repo / "runs/light/results.tsv").read_text().split("\n", 1)[0].split("\t")
    # --executor ray without ray: a clear error that names the extra, nothing started.
    asked = subprocess.run([sys.executable, "-m", "harness", "run", "--executor", "ray", "--agent", "mutate",
                            "--tag", "noray"], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert asked.returncode == 1 and "autoresearch-harness[ray]" in asked.stderr, asked.stderr
    assert not (repo / "runs/noray/results.tsv").exists()


def fake_interpreter(tmp_path: Path, torch_version: str | None) -> Path:
    """A venv's python (no pip, no system packages) with a stand-in torch distribution, or none."""
    env_dir = tmp_path / f"venv-{torch_version}"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    if torch_version:
        purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        dist = Path(purelib) / f"torch-{torch_version}.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {torch_version}\n")
    return python


@pytest.mark.parametrize("command, expected", [("venv", "0.0.1"), ("bash", None)])
def test_the_manifest_records_the_training_environments_torch(tmp_path: Path, command: str, expected):
    repo = make_repo(tmp_path / "r")
    if command == "venv":
        train = f"{fake_interpreter(tmp_path, '0.0.1')} train.py"
    else:  # an interpreter the harness cannot tell: unknown, not the supervisor's
        (repo / "run.sh").write_text(f"exec {sys.executable} train.py\n")
        train = "bash run.sh"
        subprocess.run(["git", "add", "run.sh"], cwd=repo, check=True)
        subprocess.run(["git", "commit", "-qm", "wrapper"], cwd=repo, check=True)
    settings = (repo / "harness.toml").read_text()
    (repo / "harness.toml").write_text(re.sub(r'train_command = ".*"', f'train_command = "{train}"', settings))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--agent", "mutate", "--iterations", "1",
                           "--baseline-runs", "1", "--tag", "m"], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((repo / "runs/m/run.json").read_text())
    assert manifest["torch"] == expected
    if expected:
        assert manifest["training_env"]["python"] and manifest["training_env"]["torch"] == "0.0.1"
    else:
        assert "cannot tell the interpreter" in manifest["training_env"]["unknown"]


def test_init_example_says_what_to_install_without_torch(tmp_path: Path):
    """`harness init --example` where the `python` on PATH has no torch: it says how to get it."""
    python = fake_interpreter(tmp_path, None)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "harness", "init", "--example", str(tmp_path / "ex")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "autoresearch-harness[workload]" in " ".join(done.stderr.split())
    assert (tmp_path / "ex/train.py").exists()
