"""Carry a candidate's change over to a new parent: a 3-way merge of the editable files.

A candidate proposed (or trained) on an old best is moved onto the new best the way
`git merge-file` would: its own change (old parent -> candidate) is applied on top of the
new best. Lines both sides changed differently are a conflict, and nothing is applied.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from ..gitgate import Worktree


def merge_onto(wt: Worktree, commit: str, old_parent: str, new_parent: str,
               paths: tuple[str, ...]) -> list[str]:
    """Reset wt to new_parent and apply commit's change to paths, 3-way.

    Returns the files that conflict: [] = applied (the merged files are left uncommitted in
    wt); otherwise wt is back at new_parent exactly.
    """
    wt.reset_hard(new_parent)
    conflicts: list[str] = []
    for path in paths:
        base, theirs, ours = (wt.file_at(rev, path) for rev in (old_parent, commit, new_parent))
        if theirs == base or theirs == ours:  # the candidate left it alone, or both made the same change
            continue
        if ours == base:
            merged: bytes | None = theirs
        else:
            merged = merge_bytes(wt, ours or b"", base or b"", theirs or b"")
        if merged is None:
            conflicts.append(path)
            continue
        target = wt.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(merged)
    if conflicts:
        wt.reset_hard(new_parent)
    return conflicts


def merge_bytes(wt: Worktree, ours: bytes, base: bytes, theirs: bytes) -> bytes | None:
    """The clean 3-way merge of three versions of one file, or None on a conflict (or a binary file)."""
    with tempfile.TemporaryDirectory(prefix="harness-merge-") as tmp:
        files = [Path(tmp) / name for name in ("ours", "base", "theirs")]
        for f, data in zip(files, (ours, base, theirs)):
            f.write_bytes(data)
        if wt.merge_file(*files) != 0:
            return None
        return files[0].read_bytes()
