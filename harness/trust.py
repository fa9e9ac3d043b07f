"""On --resume, the best comes from the run branch checked against the ledger, never a row alone.

The run branch only ever advances to a commit the harness kept, so its first-parent history
from the baseline is the list of kept commits. The ledger's `keep` rows must name exactly
those commits, in that order. A `keep` row for a commit that is not on the branch (a forged
row: a job or a daemon that wrote the ledger, its shadow and its record together), or a
commit on the branch without a `keep` row (the branch moved behind the harness's back), is a
mismatch: the run stops until the user decides which one is right.

Set aside: commits at the tip of the branch after the last one with a keep row (the candidate
an interruption left in flight, committed before its journal named it, or one judged and not
yet reset): reconcile resets the branch to the best, so they are never trusted either.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from . import events
from .errors import RepoError


def _same(a: str, b: str) -> bool:
    """The ledger keeps short hashes; git gives full ones."""
    return bool(a) and bool(b) and (a.startswith(b) or b.startswith(a))


def problems(rows: list[dict[str, Any]], history: list[str]) -> list[str]:
    """What disagrees between the ledger's keep rows and the branch's kept commits (pure).

    history: the run branch's first-parent commits, the baseline first, the tip last."""
    keeps = [str(r.get("commit") or "") for r in rows if r.get("status") == "keep"]
    kept = list(history)
    while len(kept) > 1 and not any(_same(kept[-1], k) for k in keeps):
        kept.pop()  # after the best: in flight or judged, reset to the best by reconcile
    found = [f"the ledger has a keep row for {c[:12] or 'no commit'}, which is not on the run branch"
             for c in keeps if not any(_same(c, h) for h in kept)]
    found += [f"commit {h[:12]} is on the run branch, but the ledger has no keep row for it" for h in kept
              if not any(_same(h, k) for k in keeps)]
    if not found and keeps and kept and not _same(keeps[-1], kept[-1]):
        found.append(f"the ledger's best ({keeps[-1][:12]}) is not the tip of the run branch ({kept[-1][:12]})")
    return found


def verify(run_dir: Path, branch: str, rows: list[dict[str, Any]], history: list[str]) -> None:
    """Raise RepoError (and record an event) when the ledger and the run branch disagree."""
    found = problems(rows, history)
    if not found:
        return
    message = "; ".join(found[:5]) + (f" (and {len(found) - 5} more)" if len(found) > 5 else "")
    events.record(run_dir, "trust_mismatch", message)
    raise RepoError(
        f"refusing to resume: the ledger and the run branch {branch} disagree: {message}. A keep row is only "
        f"believed when its commit is on the branch. Look at `git log --first-parent {branch}` and "
        f"{Path(run_dir) / 'results.tsv'}, then decide: if the branch is right, start a new run from it "
        f"(harness run --tag NEW --from {branch}); if the ledger is right, move the branch to its best "
        f"commit (git branch -f {branch} COMMIT) and resume again.")
