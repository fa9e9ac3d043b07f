"""What the install carries: the supervisor's own needs in the core, the rest in extras that exist.

The wheel is built (hatchling, no network) and its metadata read; the supervisor is run with
torch, matplotlib, mlflow and ray made unimportable; the manifest's torch is the training
interpreter's.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from conftest import FAKE_TRAIN, ROOT, make_repo

HEAVY = ("torch", "matplotlib", "mlflow", "ray")  # never pulled by `pip install autoresearch-harness`


def requirement_name(line: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", line.strip(), maxsplit=1)[0].lower()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built here (hatchling, no build isolation: no network)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(ROOT)], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("autoresearch_harness-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel_metadata(wheel: Path) -> dict[str, list[str]]:
    """Requires-Dist of the built wheel: extra name ('' = core) -> requirement names."""
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


def fake_interpreter(tmp_path: Path, torch_version: str | None, *others: str) -> Path:
    """A venv's python (no pip, no system packages) with stand-in distributions: torch (unless
    None) and the others named, each at its version ("safetensors==0.0.2"), or none."""
    env_dir = tmp_path / f"venv-{torch_version}-{'-'.join(others)}"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    for spec in ([f"torch=={torch_version}"] if torch_version else []) + list(others):
        name, version = spec.split("==")
        dist = Path(purelib) / f"{name}-{version}.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
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


@pytest.mark.parametrize("torch_version, others, says", [
    (None, (), "its train.py needs torch and safetensors"),
    ("0.0.1", (), "its train.py needs safetensors,"),
    ("0.0.1", ("safetensors==0.0.2",), None),
])
def test_init_example_says_what_to_install(tmp_path: Path, torch_version, others, says):
    """`harness init --example` where the `python` on PATH lacks the workload's torch or safetensors:
    it names what is missing and the extra that brings it; with both, it says nothing of the kind."""
    python = fake_interpreter(tmp_path, torch_version, *others)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "harness", "init", "--example", str(tmp_path / "ex")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())
    if says:
        assert says in said and "autoresearch-harness[workload]" in said, said
    else:
        assert "needs" not in said and "[workload]" not in said, said
    assert (tmp_path / "ex/train.py").exists()


@pytest.mark.parametrize("command, probe", [
    ("python train.py", ["python", "-c"]),
    ("env A=1 python3 -u train.py --fast", ["env", "A=1", "python3", "-u", "-c"]),
    ("/opt/venv/bin/python -m train", ["/opt/venv/bin/python", "-c"]),
    ("uv run train.py", ["uv", "run", "python", "-c"]),  # karpathy/autoresearch's train_command
    ("uv run --with torch train.py", ["uv", "run", "--with", "torch", "python", "-c"]),
    ("poetry run python train.py", ["poetry", "run", "python", "-c"]),
    ("bash train.sh", None), ("torchrun --nproc-per-node 2 train.py", None), ("python 'train.py", None),
])
def test_the_probe_runs_in_the_training_commands_interpreter(command: str, probe):
    from harness.workload import trainenv
    argv = trainenv.probe_argv(command)
    assert (argv if argv is None else argv[:-1]) == probe
    if argv is not None:
        assert argv[-1] == trainenv.PROBE


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed on this machine")
def test_the_manifest_of_a_uv_run_repo_has_uvs_environment(tmp_path: Path):
    """A `uv run train.py` repo: the versions come from `uv run python`, the environment uv makes."""
    repo = make_repo(tmp_path / "r")
    settings = (repo / "harness.toml").read_text()
    (repo / "harness.toml").write_text(re.sub(r'train_command = ".*"', 'train_command = "uv run train.py"', settings))
    subprocess.run(["git", "commit", "-qam", "uv"], cwd=repo, check=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "UV_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--agent", "mutate", "--iterations", "1",
                           "--baseline-runs", "1", "--tag", "uv"], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    training = json.loads((repo / "runs/uv/run.json").read_text())["training_env"]
    assert training["command"].startswith("uv run python -c"), training
    ask = subprocess.run(["uv", "run", "python", "-c", "import platform; print(platform.python_version())"],
                         cwd=repo / "runs/uv/worktree", env=env, capture_output=True, text=True, timeout=120)
    assert training["python"] == ask.stdout.strip()


# ---------------------------------------------------------------------------
# A fresh virtual environment with the core install only (slow: it installs the wheel's
# requirements, about 25 s from a local index, then the [report] extra)

AGENT = """import json, re, sys
from pathlib import Path
train = Path(sys.argv[1]) / "train.py"
source = train.read_text()
value = float(re.search(r"^VALUE = (\\S+)", source, re.M).group(1)) - 0.01
train.write_text(re.sub(r"^VALUE = \\S+", f"VALUE = {value!r}", source, count=1, flags=re.M))
print(json.dumps({"description": f"VALUE {value:.2f}", "input_tokens": 100, "output_tokens": 10}))
"""
PIP_TIMEOUT_S = 600


@pytest.mark.slow
def test_a_fresh_venv_with_the_core_install_runs_and_reports_without_torch(tmp_path: Path, wheel: Path):
    """`pip install autoresearch-harness` into a venv without system packages: no torch, and yet
    `harness run --agent cmd:...` on a sleeping trainer and `harness report` work; `[report]`
    then brings matplotlib and the report has its plots."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python, harness = env_dir / "bin" / "python", env_dir / "bin" / "harness"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["HOME"] = str(tmp_path)  # pip's cache and config of the user: not this test's business

    def run(*argv, cwd: Path = tmp_path, timeout: float = 300) -> subprocess.CompletedProcess:
        done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-2000:])
        return done

    run(python, "-m", "pip", "install", "-q", wheel, timeout=PIP_TIMEOUT_S)
    no_torch = subprocess.run([str(python), "-c", "import torch"], env=env, capture_output=True, text=True)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    where = run(python, "-c", "import harness, pandas; print(harness.__file__)").stdout
    assert where.startswith(str(env_dir)), where  # the installed package, not this checkout

    repo = make_repo(tmp_path / "r", FAKE_TRAIN.replace("SLEEP_S = 0.0", "SLEEP_S = 0.5"))
    settings = (repo / "harness.toml").read_text()
    (repo / "harness.toml").write_text(re.sub(r'train_command = ".*"', f'train_command = "{python} train.py"',
                                              settings))
    subprocess.run(["git", "commit", "-qam", "train with the venv's python"], cwd=repo, check=True)
    (tmp_path / "agent.py").write_text(AGENT)
    run(harness, "run", "--agent", f"cmd:{python} {tmp_path / 'agent.py'} {{workdir}}", "--iterations", 2,
        "--baseline-runs", 1, "--tag", "fresh", cwd=repo)
    lines = (repo / "runs/fresh/results.tsv").read_text().splitlines()
    assert [line.split("\t")[3] for line in lines[1:]] == ["keep", "keep", "keep"], lines
    manifest = json.loads((repo / "runs/fresh/run.json").read_text())
    assert manifest["torch"] is None and manifest["training_env"]["python"]  # the venv's, without torch

    report = run(harness, "report", "runs/fresh", cwd=repo)
    md = (repo / "runs/fresh/report.md").read_text()
    assert "No plots: install matplotlib (pip install 'autoresearch-harness[report]')" in md + report.stdout
    assert "| experiments | 2 |" in md and not list((repo / "runs/fresh/plots").glob("*.png"))

    run(python, "-m", "pip", "install", "-q", f"{wheel}[report]", timeout=PIP_TIMEOUT_S)  # as README says
    run(harness, "report", "runs/fresh", cwd=repo)
    assert (repo / "runs/fresh/plots/best_vs_wall.png").stat().st_size > 1000
    assert "No plots" not in (repo / "runs/fresh/report.md").read_text()
