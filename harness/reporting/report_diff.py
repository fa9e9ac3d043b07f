"""What a kept commit changed: UPPERCASE globals (hyperparameters) and functions/classes (code areas).

The diff's hunks give the changed line numbers on both sides; the file's syntax tree at each
side says which module-level UPPERCASE assignment or which function/class holds those lines.
"""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from ..integrity import pysource
from ..gitgate import run_git

HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
CONST_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")
DEF_RE = re.compile(r"\b(?:def|class)\s+([A-Za-z_]\w*)")
GIT_TIMEOUT_S = 30


def _git(cwd: Path, *args: str) -> str | None:
    try:
        out = run_git(["-C", str(cwd), *args], timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def hunk_lines(diff: str) -> tuple[dict[str, set[int]], dict[str, set[int]], dict[str, set[str]]]:
    """Per file: changed old-side lines, changed new-side lines, and function names in hunk headers."""
    old: dict[str, set[int]] = {}
    new: dict[str, set[int]] = {}
    heads: dict[str, set[str]] = {}
    path = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else None
            continue
        if line.startswith("--- "):
            path = line[6:] if line.startswith("--- a/") else path
            continue
        m = HUNK_RE.match(line)
        if m and path is not None:
            a, b = int(m[1]), int(m[2] if m[2] is not None else 1)
            c, d = int(m[3]), int(m[4] if m[4] is not None else 1)
            old.setdefault(path, set()).update(range(a, a + b))
            # A pure deletion has no new-side lines; its place (line c) is still "changed".
            new.setdefault(path, set()).update(range(c, c + d) if d else (c,))
            heads.setdefault(path, set()).update(DEF_RE.findall(m[5]))
    return old, new, heads


def names_at(source: str, lines: set[int]) -> tuple[set[str], set[str]] | None:
    """(UPPERCASE module globals, qualified functions/classes) that cover any of lines;
    None when the source does not parse."""
    consts: set[str] = set()
    areas: set[str] = set()
    try:
        tree = pysource.parse(source)
    except (SyntaxError, ValueError):
        return None

    def covers(node: ast.AST) -> bool:
        end = getattr(node, "end_lineno", node.lineno)
        return any(node.lineno <= n <= end for n in lines)

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if not covers(node):
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{node.name}"
                inner = [n for n in node.body if covers(n)
                         and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
                if inner:
                    visit(node.body, name + ".")
                else:
                    areas.add(name)
            elif not prefix and isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found = [t.id for t in targets if isinstance(t, ast.Name) and CONST_RE.match(t.id)]
                consts.update(found)
                if not found:
                    areas.add("(module level)")
            elif not prefix:
                areas.add("(module level)")

    visit(tree.body, "")
    return consts, areas


def changed_names(git_dir: Path, commits: list[tuple[str | None, str]],
                  editable: tuple[str, ...]) -> dict[str, list[str]] | None:
    """Union over kept commits (parent, commit) of what each changed; None if no diff could be read."""
    consts: set[str] = set()
    areas: set[str] = set()
    read_any = not commits
    for parent, commit in commits:
        parent = parent or f"{commit}^"
        diff = _git(git_dir, "diff", "-U0", "--no-color", "--no-ext-diff", parent, commit, "--", *editable)
        if diff is None:
            continue
        read_any = True
        old, new, heads = hunk_lines(diff)
        for path in set(old) | set(new):
            if not path.endswith(".py"):
                areas.add(path)
                continue
            for rev, lines in ((parent, old.get(path, set())), (commit, new.get(path, set()))):
                source = _git(git_dir, "show", f"{rev}:{path}") if lines else None
                if source is None:
                    continue
                found = names_at(source, lines)
                if found is None:  # unparsable: fall back on git's hunk headers
                    areas |= heads.get(path, set())
                    continue
                consts |= found[0]
                areas |= found[1]
    if not read_any:
        return None
    return {"hyperparameters": sorted(consts), "code": sorted(areas)}
