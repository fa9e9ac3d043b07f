"""`harness init`: settings for an existing repo, or a new repo with the bundled workload."""
from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

from ..config.load import read_repo_settings
from ..config import toml_lines
from ..errors import RepoError
from ..gitgate import GitGate, run_git

# Words of a program written for an agent that drives the loop itself (karpathy/autoresearch's
# program.md): under the harness the agent must not train, commit, reset or write the ledger.
SELF_DRIVEN = ("loop forever", "uv run train.py", "git reset", "git commit", "results.tsv")
HARNESS_SECTION_MARK = "<!-- harness: this section supersedes the loop instructions below -->"
HARNESS_SECTION = HARNESS_SECTION_MARK + """
# Working under autoresearch-harness

This program was written for an agent that runs the experiment loop itself. Here the harness
runs the loop, and this section supersedes every loop instruction further down:

- Make ONE change to `train.py` per invocation, then stop. You are started fresh for every
  experiment; do not loop.
- Do not run training (`uv run train.py`, `python train.py`): the harness trains your change
  under the fixed time budget on its own hardware and measures it.
- Do not run git (no commit, reset, checkout or branch) and do not write `results.tsv` or any
  log: the harness commits, keeps or reverts, and records the result.
- End your answer with one line describing the change in a few words; it becomes the
  experiment's description.

The goal, the rules about what may change in `train.py`, and the advice below still hold.

## Current best

{{BEST}}

## Recent results

{{RESULTS}}

## Last failure

{{LAST_FAILURE}}

---

# The original program (kept for reference; its loop instructions do not apply)

"""

EXAMPLE_FILES = ("train.py", "prepare.py", "program.md", "data/shakespeare.txt.xz")


# The bundled workload's metric comes from a separate evaluation of the saved model (docs/robustness.md).
EXAMPLE_EVALUATION = {"evaluate_command": "python prepare.py --evaluate",
                      "train_data_command": "python prepare.py --export-train",
                      "test_command": "python prepare.py --evaluate --split test"}


def default_tag(repo: Path | None = None, prefix: str = "") -> str:
    """A new run's name: month, day and time, e.g. dec01-093512; -2, -3, ... when a run of
    that name exists already (two started in the same second)."""
    tag = prefix + time.strftime("%b%d-%H%M%S").lower()
    if repo is None:
        return tag
    taken = lambda t: (Path(repo) / "runs" / t).exists()  # noqa: E731
    n, out = 2, tag
    while taken(out):
        out, n = f"{tag}-{n}", n + 1
    return out


def example_dir() -> Path:
    """Where the bundled workload lies: inside an installed wheel, or the source checkout's root."""
    package = Path(__file__).resolve().parent.parent  # harness/, this module being harness/commands/initrepo.py
    packaged = package / "example"
    if (packaged / "train.py").exists():
        return packaged
    return package.parent


def settings_text(train_command: str, protected: list[str], extra: dict[str, str] | None = None) -> str:
    """The [tool.harness] table `harness init` writes, each key's comment its help in the schema (config/)."""
    return "[tool.harness]\n" + toml_lines({
        "editable": ["train.py"], "protected": protected, "train_command": train_command, "metric": "val_bpb",
        "direction": "minimize", "time_budget": 300, "program": "program.md", **(extra or {}),
    }) + "# every setting, its flag and default: docs/configuration.md\n"


def init_repo(repo: Path) -> list[str]:
    """Write [tool.harness] (pyproject.toml, else harness.toml), a program that fits the harness,
    and the run folders into .git/info/exclude."""
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
        data = home_data(repo)
        text = settings_text(command, protected, {"data_paths": data} if data else None)
        if data:
            notes.append(f"the job may read {', '.join(data)} (data_paths: the sandbox shows it nothing else "
                         f"of your home and no network); prepare the data, and fill any download cache "
                         f"(one `{command}` outside the harness), before the night")
        pyproject = repo / "pyproject.toml"
        if pyproject.exists():
            old = pyproject.read_text()
            pyproject.write_text(old + ("" if old.endswith("\n") else "\n") + "\n" + text)
            notes.append(f"added [tool.harness] to {pyproject}")
        else:
            (repo / "harness.toml").write_text(text.replace("[tool.harness]\n", ""))
            notes.append(f"wrote {repo / 'harness.toml'}")
    notes += write_program(repo / "program.md")
    if (repo / ".git").exists():
        GitGate(repo).ensure_excluded()  # runs/ and results.tsv stay out of `git status`
        notes.append("added /runs/ and /results.tsv to .git/info/exclude")
    notes.append("commit these files, then: harness run --agent mutate --iterations 5")
    return notes


# Where a workload's own code keeps data under the home (karpathy/autoresearch's prepare.py caches
# its shards and tokenizer in ~/.cache/autoresearch): os.path.join(os.path.expanduser("~"), ".cache",
# "x"), "~/.cache/x" in a string, or Path.home() / ".cache" / "x".
_PART = r"""["']([^"'/\n]+)["']"""
HOME_JOIN_RE = re.compile(r"""expanduser\(\s*["']~["']\s*\)((?:\s*,\s*""" + _PART + r")+)")
HOME_PATH_RE = re.compile(r"""["'](~/[^"'\s]+)["']""")
HOME_DIV_RE = re.compile(r"Path\.home\(\)((?:\s*/\s*" + _PART + r")+)")


# Libraries that fetch from the Hugging Face hub at run time (karpathy's train.py loads its attention
# kernel with `kernels.get_kernel`): without network the job needs their cache.
HUB_IMPORT_RE = re.compile(r"^\s*(?:from|import)\s+(?:kernels|huggingface_hub|transformers|datasets)\b", re.M)


def hub_cache() -> str:
    """The Hugging Face cache as the user has it (HF_HOME), in the home's `~` form where it is there."""
    cache = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    try:
        return f"~/{cache.relative_to(Path.home())}"
    except ValueError:
        return str(cache)


def home_data(repo: Path) -> list[str]:
    """The folders under the home that the workload's prepare.py and train.py name, for
    `data_paths` (outside the repo the sandboxed job sees nothing of the home otherwise), and the
    Hugging Face cache where they import a library that downloads from the hub."""
    found: list[str] = []
    for name in ("prepare.py", "train.py"):
        path = repo / name
        text = path.read_text(errors="replace") if path.is_file() else ""
        if HUB_IMPORT_RE.search(text):
            found.append(hub_cache())
        for regex in (HOME_JOIN_RE, HOME_DIV_RE):
            for match in regex.finditer(text):
                found.append("~/" + "/".join(re.findall(_PART, match.group(1))))
        found += [m.group(1).rstrip("/") for m in HOME_PATH_RE.finditer(text)]
    # a folder inside one already found adds nothing
    unique = sorted(set(found), key=len)
    return sorted(f for f in unique if not any(f != g and f.startswith(g + "/") for g in unique))


def write_program(program: Path) -> list[str]:
    """The researcher's program: the bundled one where there is none; for a program written
    for a self-driving agent (karpathy/autoresearch's), a harness section on top that
    supersedes its loop instructions, the original kept below it for reference."""
    if not program.exists():
        shutil.copyfile(example_dir() / "program.md", program)
        return [f"wrote {program} (edit it to describe your goal)"]
    text = program.read_text()
    if HARNESS_SECTION_MARK in text:
        return [f"{program} already has the harness section; left unchanged"]
    if not any(word in text.lower() for word in SELF_DRIVEN):
        return [f"{program} left unchanged (it should not tell the researcher to train, commit or loop)"]
    program.write_text(HARNESS_SECTION + text)
    return [f"added a harness section on top of {program}: the researcher proposes one change and "
            f"stops; the harness trains, commits and records (the original is kept below it)"]


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
        settings_text("python train.py", ["prepare.py", "data/shakespeare.txt.xz"], EXAMPLE_EVALUATION)
        .replace("[tool.harness]\n", ""))
    (dest / ".gitignore").write_text("__pycache__/\nresults.tsv\nruns/\n")
    ident = ["-c", "user.name=autoresearch-harness", "-c", "user.email=harness@localhost"]
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], [*ident, "commit", "-q", "-m", "bundled workload"]):
        run_git(args, dest)  # no signing, no hooks (gitgate/plain.settings)
    return dest
