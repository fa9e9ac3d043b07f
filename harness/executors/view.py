"""What a sandboxed process may see: an allow-list, never the whole disk.

A sandboxed job, evaluation or researcher sees the system's read-only runtime (RUNTIME), the
interpreter it runs (its prefix, base prefix and the import path entries that exist), the
folders its caller names (worktree, output, data, a CLI's install folder), and nothing else:
not /home, /root, /var, /opt, /mnt, the real /tmp, other repos or worktrees. A venv under /tmp
or under a home folder is shown at its own path, because the interpreter is asked where it
lives rather than guessed.

`interpreter(argv)` resolves the program argv starts (through PATH, `env`, a `#!` line and
pyenv-style shims) and, when it is a Python, asks it once for sys.executable, sys.prefix,
sys.base_prefix and sys.path. The argv the sandbox runs then names that interpreter by its
absolute path, so a missing venv is a clear error, never a silent other interpreter found on a
PATH the sandbox cannot show.
"""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# The system's runtime, shown read-only (whichever of these exist; a symlink stays a symlink).
RUNTIME = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")
PYTHON_RE = re.compile(r"^python(\d+(\.\d+)*)?$")
QUERY_TIMEOUT_S = 60.0  # s for the interpreter to say where it lives (a cold start on a busy machine)
SHEBANG_BYTES = 256  # enough of a script's first line to read its `#!`
QUERY = "import json, sys; print(json.dumps([sys.executable, sys.prefix, sys.base_prefix, sys.path]))"


HARNESS_PACKAGE = Path(__file__).resolve().parent.parent  # hidden from every sandbox (a wheel holds the corpus)
DATA_CACHE = Path.home() / ".cache" / "autoresearch-harness"  # prepare.py's default HARNESS_CACHE_DIR


def data_cache() -> Path:
    """Where the bundled workload keeps its prepared splits (train and validation)."""
    return Path(os.environ.get("HARNESS_CACHE_DIR") or DATA_CACHE)


class ViewError(Exception):
    """The program a sandbox should run cannot be shown to it (what to fix is in the message)."""


@dataclass(frozen=True)
class Interpreter:
    argv: tuple[str, ...]  # the argv with the program named by its absolute path
    roots: tuple[str, ...]  # folders (or files) to show read-only so that it runs
    bindir: str | None = None  # its bin folder, first on the sandbox's PATH


def runtime_mounts() -> list[str]:
    """bwrap arguments that show the system runtime read-only, keeping symlinks (/bin -> usr/bin)."""
    out: list[str] = []
    for path in RUNTIME:
        p = Path(path)
        if p.is_symlink():
            out += ["--symlink", os.readlink(p), path]
        elif p.is_dir():
            out += ["--ro-bind", path, path]
    return out


@functools.lru_cache(maxsize=1)
def private_runtime_files(depth: int = 2) -> tuple[str, ...]:
    """What others may not read under /etc (shadow, private keys): hidden, since a job started by root
    keeps uid 0 in its namespace and so still passes the owner's permission check."""
    out: list[str] = []

    def walk(folder: str, level: int) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if entry.is_symlink():
                continue
            if not mode & 0o004:
                out.append(entry.path)
            elif entry.is_dir() and level < depth:
                walk(entry.path, level + 1)

    walk("/etc", 1)
    return tuple(out)


def bundled_copies(roots: tuple[str, ...]) -> list[str]:
    """A harness installed as a wheel carries the bundled corpus (harness/example/data): any such
    copy inside a shown import path entry is hidden, whichever harness it belongs to."""
    return [str(Path(r) / "harness" / "example") for r in roots if (Path(r) / "harness" / "example").is_dir()]


def library_paths() -> list[str]:
    """LD_LIBRARY_PATH's folders (CUDA in containers often lives there, under /usr/local or /opt)."""
    return [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p and os.path.isabs(p)
            and os.path.isdir(p)]


def in_runtime(path: str) -> bool:
    return any(path == r or path.startswith(r + "/") for r in RUNTIME)


def interpreter(argv: list[str], path_var: str | None = None, hidden: tuple[str, ...] = ()) -> Interpreter:
    """The argv to run in the sandbox and what must be shown for its program to run (see the module)."""
    if not argv:
        return Interpreter(tuple(argv), ())
    path_var = os.environ.get("PATH", "") if path_var is None else path_var
    head, rest = _strip_env(argv)
    program = _which(head[0], path_var) if head else None
    if program is None and head and head[0] == "uv":
        raise ViewError("the command `uv` is not found on PATH: install uv (`pip install uv`, or see "
                        "https://docs.astral.sh/uv/getting-started/installation/), or set train_command to the "
                        "project's own interpreter (`.venv/bin/python train.py` after `uv sync`)")
    if program is None:
        raise ViewError(f"the command {argv[0]!r} is not found on PATH ({path_var or 'empty'}): install it, or "
                        f"name it by its absolute path in the settings")
    python = program if _is_python(program) else _shebang_python(program, path_var)
    if python is None:  # not a Python: show the program itself (a binary or script in the runtime is there)
        roots = () if in_runtime(os.path.realpath(program)) else (os.path.realpath(program),)
        return Interpreter((*rest, program, *head[1:]), roots)
    exe, prefix, base, entries = _query(python, path_var)
    roots = [prefix, base] + [e for e in entries if _showable(e, hidden)]
    roots = [r for r in dict.fromkeys(os.path.realpath(r) for r in roots) if not in_runtime(r)]
    real_exe = os.path.realpath(exe)
    for p in (exe, real_exe):  # a venv's bin/python is a symlink into the base interpreter
        if not in_runtime(p) and not any(p.startswith(r + "/") for r in roots):
            roots.append(p)
    if program == python:
        run = (*rest, exe, *head[1:])
    else:  # a script whose #! names a Python: run it with that Python, as its #! would
        run = (*rest, exe, program, *head[1:])
    return Interpreter(run, tuple(roots), str(Path(exe).parent))


def _strip_env(argv: list[str]) -> tuple[list[str], list[str]]:
    """`env A=1 python x.py` -> (['python', 'x.py'], ['env', 'A=1']): the program after env's settings."""
    if Path(argv[0]).name != "env":
        return list(argv), []
    i = 1
    while i < len(argv) and ("=" in argv[i] or argv[i].startswith("-")):
        i += 1
    return list(argv[i:]), ["/usr/bin/env" if os.path.exists("/usr/bin/env") else argv[0], *argv[1:i]]


def _which(name: str, path_var: str) -> str | None:
    if os.sep in name:
        return os.path.abspath(name) if os.path.isfile(name) and os.access(name, os.X_OK) else None
    return shutil.which(name, path=path_var)


def _is_python(program: str) -> bool:
    return bool(PYTHON_RE.match(Path(program).name)) or bool(PYTHON_RE.match(Path(os.path.realpath(program)).name))


def shebang(script: str | Path) -> str | None:
    """The program a script's `#!` line runs (after `env`, its settings and flags), or None (a binary)."""
    try:
        with open(script, "rb") as f:
            first = f.read(SHEBANG_BYTES).split(b"\n", 1)[0].decode(errors="replace")
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    return words[0] if words else None


def _shebang_python(program: str, path_var: str) -> str | None:
    """The Python a script's `#!` names (`#!/usr/bin/env python3` through PATH), else None."""
    name = shebang(program)
    return _which(name, path_var) if name and PYTHON_RE.match(Path(name).name) else None


@functools.lru_cache(maxsize=64)
def _query(python: str, path_var: str) -> tuple[str, str, str, tuple[str, ...]]:
    """Ask the interpreter where it lives (once per interpreter and PATH in this process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PATH"] = path_var
    try:
        done = subprocess.run([python, "-c", QUERY], capture_output=True, text=True, env=env,
                              timeout=QUERY_TIMEOUT_S, stdin=subprocess.DEVNULL)
        exe, prefix, base, entries = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        detail = getattr(locals().get("done"), "stderr", "") or str(e)
        raise ViewError(f"the interpreter {python} did not say where it lives ({detail.strip()[-300:]}): "
                        f"check that it runs (`{python} -c 'import sys'`)") from None
    return exe, prefix, base, tuple(e for e in entries if isinstance(e, str))


def _showable(entry: str, hidden: tuple[str, ...]) -> bool:
    """An import path entry worth showing: an existing absolute folder or zip that is not, and does not
    contain, anything hidden (an editable install's source checkout holds the repo's data and .git)."""
    if not entry or not os.path.isabs(entry) or not os.path.exists(entry):
        return False
    real = os.path.realpath(entry)
    if os.path.isdir(os.path.join(real, ".git")) or os.path.isfile(os.path.join(real, ".git")):
        return False  # a source checkout on the path (`pip install -e`): never shown whole
    return not any(h == real or h.startswith(real + "/") and not _inside_site(h, real) for h in hidden)


def _inside_site(hidden: str, entry: str) -> bool:
    """A hidden package inside site-packages is covered there (a tmpfs over it), not a reason to drop
    the whole site-packages."""
    return Path(entry).name in ("site-packages", "dist-packages")
