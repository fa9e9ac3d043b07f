"""What the training environment has installed, asked of the training job's own interpreter.

The supervisor does not import torch and may not even have it (the core install carries
only what the supervisor uses), so the manifest's framework versions come from the
interpreter that `train_command` runs: `python train.py` -> that python, `uv run train.py`
-> `uv run python`, with the job's environment (secrets removed) in the run's worktree.
A command whose interpreter cannot be told (`bash train.sh`, `torchrun ...`) records the
versions as unknown, with the reason, rather than the supervisor's.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

from .runner import training_env

PACKAGES = ("torch", "numpy", "safetensors")  # what the manifest records
WORKLOAD_NEEDS = ("torch", "safetensors")  # the bundled train.py/prepare.py: the [workload] extra
PROBE_TIMEOUT_S = 120  # `uv run` may create the environment first
PYTHON_RE = re.compile(r"^python(\d+(\.\d+)*)?$")
RUNNERS = ("uv", "poetry", "pixi", "pdm", "hatch", "conda")  # `<runner> run <script>` runs a python
PROBE = ("import importlib.metadata as m, json, platform\n"
         "def v(p):\n"
         "    try:\n"
         "        return m.version(p)\n"
         "    except m.PackageNotFoundError:\n"
         "        return None\n"
         f"print(json.dumps({{'python': platform.python_version(), **{{p: v(p) for p in {PACKAGES!r}}}}}))\n")


def probe_argv(train_command: str) -> list[str] | None:
    """The argv that runs PROBE in the training job's interpreter, or None when it cannot be told."""
    try:
        argv = shlex.split(train_command)
    except ValueError:
        return None
    script = next((i for i, a in enumerate(argv) if a.endswith(".py") or a == "-m"), None)
    if not script:
        return None
    prefix = argv[:script]
    if any(PYTHON_RE.match(Path(a).name) for a in prefix):  # python -u train.py, env X=1 python3 train.py
        return [*prefix, "-c", PROBE]
    if len(prefix) >= 2 and Path(prefix[0]).name in RUNNERS and "run" in prefix[1:]:
        return [*prefix, "python", "-c", PROBE]
    return None


def versions(train_command: str, cwd: Path, uv_env: Path | None = None) -> dict[str, Any]:
    """{'python': ..., 'torch': ..., 'numpy': ...} of the training interpreter, or the reason it is unknown.

    uv_env: for `uv run`, the run's own project environment (executors/uvenv.py), so that asking does
    not make a .venv in the worktree."""
    argv = probe_argv(train_command)
    if argv is None:
        return {"unknown": f"cannot tell the interpreter of train_command {train_command!r}"}
    extra = {"UV_PROJECT_ENVIRONMENT": str(uv_env)} if uv_env is not None else {}
    try:
        out = subprocess.run(argv, cwd=cwd, env=training_env(dict(os.environ), extra), capture_output=True,
                             text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"unknown": f"{type(e).__name__}: {e}"[:300]}
    try:
        found = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"unknown": f"the probe exited {out.returncode}: {out.stderr.strip()[-300:]}"}
    return {"command": shlex.join(argv[:-1]) + " ...", **found}
