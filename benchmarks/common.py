"""What the benchmarks share: a throwaway research repo driven by a given train.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make_repo(root: Path, train_source: str, settings: str = "time_budget = 1\n") -> Path:
    """A committed git repo at root: train_source as train.py, a protected prepare.py, a program."""
    root.mkdir(parents=True)
    (root / "train.py").write_text(train_source)
    (root / "prepare.py").write_text("# protected\n")
    (root / "program.md").write_text("{{BEST}}\n{{RESULTS}}\n{{LAST_FAILURE}}\n")
    # -S skips site imports: the no-op trainers start in milliseconds.
    (root / "harness.toml").write_text(f'train_command = "{sys.executable} -S train.py"\n' + settings)
    for argv in (["git", "init", "-q"], ["git", "add", "-A"],
                 ["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "init"]):
        subprocess.run(argv, cwd=root, check=True)
    return root
