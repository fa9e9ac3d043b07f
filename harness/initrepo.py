"""`harness init`: settings for an existing repo, or a new repo with the bundled workload."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .config import read_repo_settings
from .errors import RepoError

EXAMPLE_FILES = ("train.py", "prepare.py", "program.md", "data/shakespeare.txt.xz")


# The bundled workload's metric comes from a separate evaluation of the saved model (docs/robustness.md).
EXAMPLE_EVALUATION = ('evaluate_command = "python prepare.py --evaluate"\n'
                      'train_data_command = "python prepare.py --export-train"\n')


def example_dir() -> Path:
    """Where the bundled workload lies: inside an installed wheel, or the source checkout's root."""
    packaged = Path(__file__).parent / "example"
    if (packaged / "train.py").exists():
        return packaged
    return Path(__file__).resolve().parent.parent


def settings_text(train_command: str, protected: list[str]) -> str:
    quoted = ", ".join(f'"{p}"' for p in protected)
    return ("[tool.harness]\n"
            'editable = ["train.py"]\n'
            f"protected = [{quoted}]\n"
            f'train_command = "{train_command}"\n'
            'metric = "val_bpb"\n'
            'direction = "minimize"\n'
            "time_budget = 300\n"
            'program = "program.md"\n')


def init_repo(repo: Path) -> list[str]:
    """Write [tool.harness] (pyproject.toml, else harness.toml) and program.md if missing."""
    repo = Path(repo)
    if not (repo / "train.py").exists():
        raise RepoError(f"{repo} has no train.py: the harness needs one editable training script "
                        "there. `harness init --example DIR` creates a ready repo instead.")
    notes = []
    settings, path = read_repo_settings(repo)
    if settings:
        notes.append(f"settings already present in {path}; left unchanged")
    else:
        # A uv project (karpathy/autoresearch is one) trains through uv.
        command = "uv run train.py" if (repo / "uv.lock").exists() else "python train.py"
        protected = [p for p in ("prepare.py",) if (repo / p).exists()]
        text = settings_text(command, protected)
        pyproject = repo / "pyproject.toml"
        if pyproject.exists():
            old = pyproject.read_text()
            pyproject.write_text(old + ("" if old.endswith("\n") else "\n") + "\n" + text)
            notes.append(f"added [tool.harness] to {pyproject}")
        else:
            (repo / "harness.toml").write_text(text.replace("[tool.harness]\n", ""))
            notes.append(f"wrote {repo / 'harness.toml'}")
    program = repo / "program.md"
    if not program.exists():
        shutil.copyfile(example_dir() / "program.md", program)
        notes.append(f"wrote {program} (edit it to describe your goal)")
    notes.append("commit these files, then: harness run --agent mutate --iterations 5")
    return notes


def init_example(dest: Path) -> Path:
    """A new git repo at dest holding the bundled workload, committed, ready for `harness run`."""
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise RepoError(f"{dest} exists and is not empty; choose a new directory.")
    src = example_dir()
    for rel in EXAMPLE_FILES:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, target)
    (dest / "harness.toml").write_text(
        settings_text("python train.py", ["prepare.py", "data/shakespeare.txt.xz"]).replace("[tool.harness]\n", "")
        + EXAMPLE_EVALUATION)
    (dest / ".gitignore").write_text("__pycache__/\nresults.tsv\nruns/\n")
    git = ["git", "-c", "user.name=autoresearch-harness", "-c", "user.email=harness@localhost"]
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                 [*git, "commit", "-q", "-m", "bundled workload"]):
        subprocess.run(argv, cwd=dest, check=True, capture_output=True, timeout=60)
    return dest
